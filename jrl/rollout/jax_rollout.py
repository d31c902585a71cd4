"""The `jax` rollout engine: verl's generate contract on top of the continuous-batching sampler."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jrl.batch import Batch
from jrl.models import CausalLM
from jrl.models.dtypes import cache_dtype
from jrl.models.moe import ROUTE_NONE, ROUTED_EXPERTS, split_experts_over
from jrl.parallel import (
    ROLLOUT_EXPERT_RULES,
    ROLLOUT_RULES,
    agreed_minimum,
    batch_sharding,
    is_abstract,
    param_shardings,
    place,
    put_global,
)
from jrl.rollout.kept_turns import (
    KeptTurns,
    Resume,
    TurnCall,
    carry_over,
    kept_turns,
    plan_resume,
    prefilled_tokens,
)
from jrl.rollout.layout import (
    RowLayout,
    prompt_bucket,
    rollout_batch,
    row_layout,
    rows_to_generate,
)
from jrl.rollout.limits import (
    EngineLimits,
    SlotPlan,
    ceil_pow2,
    free_device_bytes,
    kv_bytes_per_token,
    plan_slots,
    slot_bytes,
)
from jrl.rollout.sampler import SlotCache, cache_length, generate_tokens
from jrl.rollout.sampling import SamplingParams, as_token_ids
from jrl.rollout.session import TurnSession
from jrl.rollout.session_programs import Admission, SessionState, admit_turns, decode_turns
from jrl.rollout.spec import RolloutSpec
from jrl.rollout.tensor_parallel import cache_sharding, kv_layout, rollout_mesh

# Decode steps of a turn session between two admissions (`open_session`).
SESSION_DECODE_STEPS = 16

# The (keys, values) buffers' shapes of a cache (`KVLayout.shapes`).
CacheShapes = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]


class JaxRollout:
    """Generates responses with the model's own forward pass and a slot-based KV cache.

    The engine keeps its own copy of the parameters: matrices in the model's compute dtype
    (bfloat16 weights for a bfloat16 rollout), laid out tensor parallel over `tensor_parallel_size`
    devices of `mesh` and replicated over the rest, which generate as data-parallel replicas.
    Each call cuts the prompts to a power-of-two bucket of their longest length and runs one
    compiled loop per (rows, bucket, slot plan); `limits` bound the slots and the cache, and
    `continuous_batching=False` runs static batches instead (for comparison). With
    `record_routes` a mixture-of-experts model's rows come with the experts each token used
    (``routed_experts``, for verl's router replay R3). With `expert_parallel_size` equal to
    `tensor_parallel_size` a mixture's experts split over each replica's tensor devices, each
    expert whole (`ROLLOUT_EXPERT_RULES`, `jrl.models.moe.replica_experts`), instead of every
    expert's width.
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        response_length: int,
        pad_token_id: int,
        eos_token_ids: int | Iterable[int] | None,
        mesh: Mesh | None = None,
        tensor_parallel_size: int = 1,
        limits: EngineLimits | None = None,
        continuous_batching: bool = True,
        record_routes: bool = False,
        expert_parallel_size: int = 1,
    ):
        if response_length < 1:
            raise ValueError(f"response_length={response_length} must be at least 1")
        self.mesh = rollout_mesh(mesh, int(tensor_parallel_size))
        self.config = model.config
        self.dtype = model.dtype
        self._kv_layout = kv_layout(self.mesh, self.config)
        self._graphdef, state = nnx.split(model)
        rules = ROLLOUT_RULES
        if expert_parallel_size > 1:
            self._graphdef = _experts_split(
                self._graphdef, state, self.config, expert_parallel_size, int(tensor_parallel_size)
            )
            rules = ROLLOUT_EXPERT_RULES
        self._shardings = param_shardings(state, self.mesh, rules)
        self._state = self._place(state)
        self.response_length = int(response_length)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = as_token_ids(eos_token_ids)
        self.limits = limits or EngineLimits()
        self.continuous_batching = continuous_batching
        self.record_routes = record_routes
        self._budget: int | None = None
        self._budget_measured = False
        self._cache: SlotCache | None = None
        self._kept: dict[int, KeptTurns] = {}  # `generate_turn` calls', by stream
        self._stats: dict[str, float] = {}

    @classmethod
    def from_spec(
        cls,
        model: CausalLM,
        spec: RolloutSpec,
        *,
        pad_token_id: int,
        eos_token_ids: int | Iterable[int] | None,
        mesh: Mesh | None = None,
    ) -> JaxRollout:
        """The engine of a run's `RolloutSpec` (response length, tensor parallel size, limits)."""
        return cls(
            model,
            response_length=spec.response_length,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            mesh=mesh,
            tensor_parallel_size=spec.tensor_parallel_size,
            limits=spec.limits,
            record_routes=spec.record_routes,
            expert_parallel_size=spec.expert_parallel_size,
        )

    @property
    def state(self) -> nnx.State:
        """The parameters generation runs with."""
        return self._state

    @property
    def cache(self) -> SlotCache | None:
        """The KV cache kept between calls (None once released)."""
        return self._cache

    @property
    def kept_streams(self) -> tuple[int, ...]:
        """The streams whose keys and values `generate_turn` keeps now."""
        return tuple(sorted(self._kept))

    @property
    def stats(self) -> dict[str, float]:
        """The last call's prompt bucket, slots, prefill rows and decode steps (``rollout/...``)."""
        return dict(self._stats)

    def generate(self, prompts: Batch, sampling: SamplingParams, key: jax.Array) -> Batch:
        """`Rollout.generate`; token t of row i is drawn with fold_in(fold_in(key, i), t)."""
        return self._generate(prompts, sampling, key, None)

    def generate_turn(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        key: jax.Array,
        previous: Sequence[int] | None,
        *,
        stream: int = 0,
        source: int | None = None,
        drop_source: bool = False,
        row_ids: Sequence[int] | None = None,
    ) -> Batch:
        """`generate` for a round of a multi-turn rollout (`TurnEngine`): row i continues row
        `previous[i]` (-1, or `previous` None: none) of the last call kept as `source` (by
        default `stream`; dropped once read when it is `stream` or with `drop_source`). The
        keys and values of the longest prefix that its prompt shares with that row's context
        are taken over (`jrl.rollout.kept_turns`), so the prefill runs only what was appended;
        the call's own are kept as `stream` for a later round (until `release`, or a call
        without `generate_turn`). Where the slots cannot hold every row, each round prefills
        its prompts whole. Row i draws its keys as row `row_ids[i]` (by default i) of
        `generate`."""
        previous = () if previous is None else previous
        if len(previous) and sampling.n != 1:
            raise ValueError(
                f"generate_turn continues each row once: sampling.n={sampling.n} must be 1 when "
                "previous rows are given"
            )
        source = stream if source is None else source
        turn = TurnCall(previous, stream, source, drop_source or source == stream, row_ids)
        return self._generate(prompts, sampling, key, turn)

    def open_session(
        self,
        rows: int,
        prompt_width: int,
        sampling: SamplingParams,
        key: jax.Array,
        *,
        first_turn: int = 0,
        stream: int = 0,
        steps: int = SESSION_DECODE_STEPS,
    ) -> TurnSession:
        """A `TurnSession` for the remaining turns of `rows` trajectories whose first prompts
        are at most `prompt_width` tokens (`SessionEngine`): slots of that width plus the
        response length, admitting rows between every `steps` decode steps, turn indices from
        `first_turn` on. Where the call kept as `stream` (a `generate_turn` round) holds every
        row, each row starts in its slot with that round's context; the kept cache is dropped."""
        sampling = dataclasses.replace(sampling, n=1, max_new_tokens=self.response_length)
        kept = self._kept.pop(stream, None)
        self._kept.clear()
        self._cache = None
        if kept is not None and len(kept.contexts) != rows:
            kept = None
        replicas = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        width = self._session_width(max(prompt_width, 0 if kept is None else kept.width))
        if kept is not None:
            slots = kept.cache.k[0].shape[self._kv_layout.layer_axes] // replicas
        else:
            slots = self._session_slots(rows, width)
        total = replicas * slots
        shapes = self._session_cache_shapes(total, width)
        shift = np.zeros(total, np.int64)
        held: dict[int, tuple[int, np.ndarray]] = {}
        if kept is None:
            cache = self._take_cache(shapes)
        else:
            held = {i: (int(kept.slot[i]), kept.contexts[i]) for i in range(rows)}
            shift[kept.slot] = kept.starts
            cache = self._carry_over(kept, Resume(np.arange(total), shift, 0), shapes)
        del kept
        state = self._session_state(cache, total, held)
        lanes = batch_sharding(self.mesh, 1)
        return TurnSession(
            admit=functools.partial(
                self._on_current_weights(admit_turns), params=sampling, mesh=self.mesh
            ),
            decode=functools.partial(
                self._on_current_weights(decode_turns),
                params=sampling,
                mesh=self.mesh,
                steps=steps,
            ),
            steps=steps,
            state=state,
            replicas=replicas,
            slots=slots,
            width=width,
            response_length=self.response_length,
            lanes=lanes,
            key=key,
            held=held,
            turns=dict.fromkeys(range(rows), first_turn),
        )

    def _on_current_weights(self, program: Callable[..., Any]) -> Callable[..., Any]:
        """`program` (graphdef, weights, ...) run on the weights the engine holds at each call:
        a session's rows go on with new weights after `update_weights` (partial rollouts)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            return program(self._graphdef, self._state, *args, **kwargs)

        return run

    def _session_width(self, prompt_width: int) -> int:
        """Columns of a session's slot: the first prompts' width and the response length."""
        multiple = self._kv_layout.token_multiple
        return -(-(prompt_width + self.response_length) // multiple) * multiple

    def _session_slots(self, rows: int, width: int) -> int:
        """Slots per replica of a session of `rows` trajectories in slots of `width` columns:
        one per row where the limits and the memory allow."""
        replicas = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        per_slot = slot_bytes(self.config, self._cache_dtype, self.mesh.shape["tensor"], width)
        return plan_slots(
            self.limits,
            rows=ceil_pow2(-(-rows // replicas)),
            prompt_length=width,
            budget_bytes=self._kv_budget(),
            bytes_per_slot=per_slot,
        ).slots

    def _session_cache_shapes(self, slots: int, width: int) -> CacheShapes:
        c = self.config
        return self._kv_layout.shapes(c.num_layers, slots, width, c.num_kv_heads, c.head_dim)

    def lower_session(
        self, rows: int, prompt_width: int, sampling: SamplingParams, chunk: int
    ) -> dict[str, Any]:
        """A turn session's programs for `rows` trajectories whose first prompts take
        `prompt_width` columns, lowered from shapes alone: ``carry`` (round 0's keys and values
        into the slots, where round 0 runs one slot per row, `resumes`), ``admit`` (every slot
        admitting `chunk` tokens) and ``decode`` (the decode steps between admissions)."""
        sampling = dataclasses.replace(sampling, n=1, max_new_tokens=self.response_length)
        replicas = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        width = self._session_width(prompt_width)
        layout, plan, _, round_shapes = self._call_layout(rows, prompt_width, sampling)
        resumes = _slot_per_row(layout, plan)
        slots = layout.per_replica if resumes else self._session_slots(rows, width)
        total = replicas * slots
        shapes = self._session_cache_shapes(total, width)
        rows_sharding = batch_sharding(self.mesh, 1)

        def ints(*shape: int, dtype: Any = jnp.int32) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sharding)

        fields = (ints(*x.shape, dtype=x.dtype) for x in self._session_fields(total, {}))
        state = SessionState(self._abstract_cache(shapes), *fields)
        lanes = [ints(total, chunk) if f == "ids" else ints(total) for f in Admission._fields]
        key = jax.eval_shape(lambda: jax.random.key(0))
        model = {"params": sampling, "mesh": self.mesh}
        programs = {
            "admit": admit_turns.lower(
                self._graphdef, self._state, state, Admission(*lanes), key, columns=width, **model
            ),
            "decode": decode_turns.lower(
                self._graphdef,
                self._state,
                state,
                key,
                steps=SESSION_DECODE_STEPS,
                columns=width,
                **model,
            ),
        }
        if resumes:
            kept = self._abstract_cache(round_shapes)
            copy = self._carry_over_program(shapes)
            programs["carry"] = copy.lower(kept, ints(total), ints(total))
        return programs

    def _session_state(
        self, cache: SlotCache, slots: int, held: dict[int, tuple[int, np.ndarray]]
    ) -> SessionState:
        """A session's state over `cache` ([slots, ...] in all), on the device."""
        rows = batch_sharding(self.mesh, 1)
        return SessionState(
            cache, *(put_global(x, rows) for x in self._session_fields(slots, held))
        )

    def _session_fields(
        self, slots: int, held: dict[int, tuple[int, np.ndarray]]
    ) -> list[np.ndarray]:
        """`SessionState`'s fields but the cache, on the host: idle slots, those of `held`
        rows holding their contexts."""
        length = np.zeros(slots, np.int32)
        for slot, context in held.values():
            length[slot] = len(context)
        zeros = np.zeros(slots, np.int32)
        fields = [length, zeros, zeros.astype(bool), zeros, zeros, zeros, zeros]
        buffers = [np.zeros((slots, self.response_length), t) for t in (np.int32, np.float32)]
        return [*fields, *buffers]

    def _generate(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        key: jax.Array,
        turn: TurnCall | None,
    ) -> Batch:
        """`generate`, or with `turn` `generate_turn`."""
        rows = len(prompts) * sampling.n
        if turn is not None and len(turn.previous) not in (0, rows):
            raise ValueError(f"generate_turn: {len(turn.previous)} previous rows for {rows}")
        if turn is not None and turn.row_ids is not None and len(turn.row_ids) != rows:
            raise ValueError(f"generate_turn: {len(turn.row_ids)} row ids for {rows} rows")
        batch = rows_to_generate(
            prompts, sampling, response_length=self.response_length, pad_token_id=self.pad_token_id
        )
        mask = np.asarray(batch["attention_mask"])
        out = self._generate_rows(np.asarray(batch["input_ids"]), mask, sampling, key, turn)
        width = self.response_length - sampling.max_new_tokens
        routes = out.pop(ROUTED_EXPERTS, None)
        fill = {"responses": self.pad_token_id, "response_mask": 0, "rollout_log_probs": 0.0}
        out = {k: jnp.pad(v, ((0, 0), (0, width)), constant_values=fill[k]) for k, v in out.items()}

        log_probs = out["rollout_log_probs"] if sampling.calculate_log_probs else None
        done = rollout_batch(batch, out["responses"], out["response_mask"], log_probs)
        if routes is not None:  # prompt columns cut to the bucket: back to the batch's width
            cut = mask.shape[1] - (routes.shape[1] - sampling.max_new_tokens)
            pads = ((0, 0), (cut, width), (0, 0), (0, 0))
            done.tensors[ROUTED_EXPERTS] = jnp.pad(routes, pads, constant_values=ROUTE_NONE)
        return done

    def slot_bytes(self, prompt_length: int, sampling: SamplingParams) -> int:
        """Device bytes one slot takes for prompts `prompt_length` wide (`slot_bytes`)."""
        tokens = cache_length(prompt_length, sampling, self._kv_layout)
        return slot_bytes(self.config, self._cache_dtype, self.mesh.shape["tensor"], tokens)

    def plan(self, rows: int, prompt_length: int, sampling: SamplingParams) -> SlotPlan:
        """The slot plan of a call with `rows` rows (per replica) of `prompt_length` tokens."""
        per_slot = self.slot_bytes(prompt_length, sampling)
        return plan_slots(
            self.limits,
            rows=rows,
            prompt_length=prompt_length,
            budget_bytes=self._kv_budget(),
            bytes_per_slot=per_slot,
        )

    def _call_layout(
        self, rows: int, bucket: int, sampling: SamplingParams
    ) -> tuple[RowLayout, SlotPlan, SamplingParams, CacheShapes]:
        """(row layout, slot plan, per-row sampling, the cache's buffer shapes) of a call with
        `rows` rows (prompts already repeated n times) cut to `bucket` tokens."""
        replicas = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        layout = row_layout(rows, replicas)
        plan = self.plan(layout.per_replica, bucket, sampling)
        # Rows come as n copies of each prompt in a row; a prefill computes each prompt once
        # when every replica's rows start at a copy boundary.
        shared = math.gcd(sampling.n, plan.prefill_rows, *layout.counts.tolist())
        plan = dataclasses.replace(plan, shared_prefill=shared)
        sampling = dataclasses.replace(sampling, n=1)  # rows are already repeated
        c = self.config
        tokens = cache_length(bucket, sampling, self._kv_layout)
        slots = replicas * plan.slots
        shapes = self._kv_layout.shapes(c.num_layers, slots, tokens, c.num_kv_heads, c.head_dim)
        return layout, plan, sampling, shapes

    def _request_shardings(self) -> dict[str, NamedSharding]:
        rows, prompts = batch_sharding(self.mesh, 1), batch_sharding(self.mesh, 2)
        return {"ids": prompts, "mask": prompts, "row_ids": rows, "counts": rows}

    def resumes(self, rows: int, bucket: int, sampling: SamplingParams) -> bool:
        """Whether a multi-turn round of `rows` rows at the `bucket` width runs one slot per
        row, and so the next round takes over its keys and values (`generate_turn`)."""
        layout, plan, _, _ = self._call_layout(rows, bucket, sampling)
        return _slot_per_row(layout, plan)

    def lower(self, rows: int, bucket: int, sampling: SamplingParams, resume_chunk: int = 0) -> Any:
        """The generate program of a call with `rows` rows (prompts x n) whose longest prompt
        takes the `bucket` width, lowered for this engine's mesh from shapes alone (`.compile()`
        it for its memory and cost analysis; `jrl.plan` does). With `resume_chunk` C, a
        multi-turn round's call that prefills only its prompts' last C columns (`resumes`)."""
        layout, plan, sampling, cache_shapes = self._call_layout(rows, bucket, sampling)
        if resume_chunk:
            plan = dataclasses.replace(plan, slot_per_row=True, resume_chunk=resume_chunk)
        shardings = self._request_shardings()
        count = len(layout.source)
        shapes = {"ids": (count, bucket), "mask": (count, bucket), "row_ids": (count,)}
        shapes["counts"] = layout.counts.shape
        args = {
            k: jax.ShapeDtypeStruct(v, jnp.int32, sharding=shardings[k]) for k, v in shapes.items()
        }
        key = jax.eval_shape(lambda: jax.random.key(0))
        continuous = jax.ShapeDtypeStruct((), jnp.bool_)
        cache = self._abstract_cache(cache_shapes)
        return self._call(generate_tokens.lower, args, key, continuous, cache, sampling, plan)

    def lower_carry_over(self, rows: int, bucket: int, sampling: SamplingParams) -> Any:
        """The copy of a multi-turn round's kept keys and values into the next round's cache
        (`jrl.rollout.kept_turns.carry_over`), both calls of `rows` rows at the `bucket` width,
        lowered from shapes alone."""
        layout, _, _, cache_shapes = self._call_layout(rows, bucket, sampling)
        copy = self._carry_over_program(cache_shapes)
        slots = jax.ShapeDtypeStruct(
            layout.source.shape, jnp.int32, sharding=batch_sharding(self.mesh, 1)
        )
        return copy.lower(self._abstract_cache(cache_shapes), slots, slots)

    def _carry_over_program(self, shapes: CacheShapes) -> Callable[..., SlotCache]:
        """`carry_over` into a cache of `shapes`, laid out as this engine's."""
        tokens = shapes[0][0][self._kv_layout.layer_axes + self._kv_layout.keys.token_axis]
        shardings = SlotCache(*cache_sharding(self.mesh, self.config))
        return carry_over(self._kv_layout, tokens, shardings)

    def _abstract_cache(self, shapes: CacheShapes) -> SlotCache:
        """A cache of `shapes` as shapes with this engine's dtype and shardings."""
        shardings = cache_sharding(self.mesh, self.config)
        return SlotCache(
            *(
                tuple(
                    jax.ShapeDtypeStruct(shape, self._cache_dtype, sharding=sharding)
                    for shape in part
                )
                for part, sharding in zip(shapes, shardings, strict=True)
            )
        )

    def _call(
        self,
        run: Callable[..., Any],
        args: dict[str, Any],
        rng: Any,
        continuous: Any,
        cache: SlotCache,
        sampling: SamplingParams,
        plan: SlotPlan,
    ) -> Any:
        """`run` (`generate_tokens`, or its `.lower`) on the request `args` and this engine's
        parameters."""
        return run(
            self._graphdef,
            self._state,
            args["ids"],
            args["mask"],
            args["row_ids"],
            args["counts"],
            rng,
            continuous,
            cache,
            params=sampling,
            plan=plan,
            mesh=self.mesh,
            record_routes=self.record_routes,
        )

    def _generate_rows(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        sampling: SamplingParams,
        rng: jax.Array,
        turn: TurnCall | None,
    ) -> dict[str, jax.Array]:
        bucket = prompt_bucket(int(mask.sum(axis=1).max()), ids.shape[1])
        ids, mask = ids[:, -bucket:], mask[:, -bucket:]
        layout, plan, sampling, cache_shapes = self._call_layout(len(ids), bucket, sampling)
        host = {
            "ids": ids[layout.source],
            "mask": mask[layout.source],
            "row_ids": _key_rows(turn, layout),
            "counts": layout.counts,
        }
        shardings = self._request_shardings()
        args = {k: jax.device_put(v, shardings[k]) for k, v in host.items()}
        turns = turn is not None and _slot_per_row(layout, plan)
        prefilled = int(mask.sum()) // plan.shared_prefill
        if turns:
            plan = dataclasses.replace(plan, slot_per_row=True)
        resume = self._resume(turn, ids, mask, layout) if turns else None
        kept = None if resume is None else self._kept[turn.source]
        # What this call replaces or ends is dropped before its cache is allocated.
        if turn is None:
            self._kept.clear()
        else:
            self._kept.pop(turn.stream, None)
            if turn.drop_source:
                self._kept.pop(turn.source, None)
        if resume is None:
            cache = self._take_cache(cache_shapes)
        else:
            plan = dataclasses.replace(plan, resume_chunk=resume.chunk)
            prefilled = prefilled_tokens(mask, resume.chunk)
            cache = self._carry_over(kept, resume, cache_shapes)
        del kept  # copied: the call below runs without it
        continuous = jnp.asarray(self.continuous_batching)
        out, decode_steps, cache = self._call(
            generate_tokens, args, rng, continuous, cache, sampling, plan
        )
        real = np.flatnonzero(layout.real)
        out = {k: v[real] for k, v in out.items()}
        if turns:
            responses, lengths = np.asarray(out["responses"]), np.asarray(out["response_mask"])
            self._kept[turn.stream] = kept_turns(
                cache, layout, ids, mask, responses, lengths.sum(-1)
            )
        elif not self.limits.free_cache_engine:
            self._cache = cache
        self._stats = {
            "rollout/prompt_bucket": float(bucket),
            "rollout/slots": float(plan.slots),
            "rollout/prefill_rows": float(plan.prefill_rows),
            "rollout/shared_prefill": float(plan.shared_prefill),
            "rollout/decode_steps": float(np.max(decode_steps)),
            "rollout/prefill_tokens": float(prefilled),
        }
        return out

    def _resume(
        self, turn: TurnCall, ids: np.ndarray, mask: np.ndarray, layout: RowLayout
    ) -> Resume | None:
        """How a slot-per-row call whose rows continue `turn.previous` rows of the call kept
        as `turn.source` takes over their keys and values; None when it takes over nothing."""
        kept = self._kept.get(turn.source)
        if kept is None or not len(turn.previous):
            return None
        resume = plan_resume(kept, turn.previous, ids, mask, layout)
        return resume if resume.chunk < ids.shape[1] else None

    def _carry_over(self, kept: KeptTurns, resume: Resume, shapes: CacheShapes) -> SlotCache:
        """A cache of `shapes` whose continuing rows' prompt columns hold their history, as
        `kept` holds it."""
        copy = self._carry_over_program(shapes)
        slots = batch_sharding(self.mesh, 1)
        source, shift = (
            jax.device_put(x.astype(np.int32), slots) for x in (resume.source, resume.shift)
        )
        return copy(kept.cache, source, shift)

    @property
    def _cache_dtype(self) -> jnp.dtype:
        """The cache buffers' dtype (`cache_dtype` of the compute dtype)."""
        return cache_dtype(self._kv_layout, self.dtype)

    def _take_cache(self, shapes: CacheShapes) -> SlotCache:
        """The kept cache when its buffers' shapes fit this call, else a new zeroed one."""
        shardings = SlotCache(*cache_sharding(self.mesh, self.config))
        cache, self._cache = self._cache, None
        if cache is not None and tuple(tuple(x.shape for x in part) for part in cache) == shapes:
            # The same layout, spelled as the compiled call expects it: no copy.
            return jax.device_put(cache, shardings)
        del cache
        return _zero_cache(shapes, self._cache_dtype, shardings)()

    def cache_bytes(self, slots: int, bucket: int, sampling: SamplingParams) -> int:
        """Bytes of the KV cache (keys and values, all devices) of `slots` sequences of prompts
        `bucket` wide."""
        tokens = cache_length(bucket, sampling, self._kv_layout)
        return slots * tokens * kv_bytes_per_token(self.config, self._cache_dtype, 1)

    def assume_free_bytes(self, free: int) -> None:
        """Plan the KV cache for `free` bytes per device instead of measuring them (for a slice
        compiled from another host, whose chips cannot report their memory)."""
        self._budget = int(self.limits.gpu_memory_utilization * free)
        self._budget_measured = True

    def _kv_budget(self) -> int | None:
        """Bytes per device the KV cache may take, measured once (None where unknown)."""
        if not self._budget_measured:
            free = agreed_minimum(free_device_bytes(self.mesh.local_devices[0]))
            util = self.limits.gpu_memory_utilization
            self._budget = None if free is None else int(util * free)
            self._budget_measured = True
        return self._budget

    def _place(self, state: nnx.State) -> nnx.State:
        """Matrices in the compute dtype, vectors as given; on the rollout's layout."""

        def cast(x: jax.Array) -> jax.Array:
            floating = jnp.issubdtype(x.dtype, jnp.floating)
            return x.astype(self.dtype) if floating and x.ndim >= 2 else x

        def cast_all(tree: nnx.State) -> nnx.State:
            return jax.tree.map(cast, tree)

        cast_state = jax.eval_shape(cast_all, state) if is_abstract(state) else cast_all(state)
        return place(cast_state, self._shardings)

    def update_weights(self, params: nnx.State) -> None:
        """Use new parameters (same structure and shapes), cast and laid out as this engine's."""
        paths = [
            jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
        ]
        if paths != self.weight_paths():
            diff = sorted(set(paths) ^ set(self.weight_paths()))[:5]
            raise ValueError(f"update_weights: parameter names differ from the rollout's: {diff}")
        self.replace_weights(dict(zip(paths, jax.tree.leaves(params), strict=True)))

    def weight_paths(self) -> list[str]:
        """The parameters' names (`jax.tree_util.keystr` of their paths), in tree order."""
        flat = jax.tree_util.tree_flatten_with_path(self._state)[0]
        return [jax.tree_util.keystr(path) for path, _ in flat]

    def replace_weights(self, leaves: Mapping[str, jax.Array]) -> None:
        """Replace the parameters named in `leaves` (`weight_paths` names), each cast and laid
        out as this engine's, the others kept: a weight sync can go bucket by bucket."""
        flat, treedef = jax.tree_util.tree_flatten(self._state)
        index = {path: i for i, path in enumerate(self.weight_paths())}
        shardings = jax.tree.leaves(self._shardings)
        for path, value in leaves.items():
            i = index[path]
            current = flat[i]
            if tuple(value.shape) != tuple(current.shape):
                raise ValueError(
                    f"update_weights: {path} has shape {tuple(value.shape)}, "
                    f"the rollout expects {tuple(current.shape)}"
                )
            flat[i] = jax.device_put(value.astype(current.dtype), shardings[i])
        self._state = jax.tree_util.tree_unflatten(treedef, flat)

    def release(self) -> None:
        """Free the kept KV cache (with `free_cache_engine` each call frees it already) and a
        multi-turn rollout's."""
        self._cache = None
        self._kept.clear()

    def resume(self) -> None:
        """Measure the KV budget again (the next call allocates its cache within it)."""
        self._budget_measured = False


def _experts_split(
    graphdef: nnx.GraphDef, state: nnx.State, config: Any, size: int, tensor_parallel: int
) -> nnx.GraphDef:
    """`graphdef` with its sparse blocks splitting their experts over the ``tensor`` axis (the
    rollout's expert parallelism); a size the replicas or the experts cannot take is an
    error naming the key."""
    key = "actor_rollout_ref.rollout.expert_parallel_size"
    if size != tensor_parallel:
        raise ValueError(
            f"{key}={size}: jrl's sampler splits a replica's experts over its "
            f"tensor_model_parallel_size={tensor_parallel} devices; set it to 1 or to "
            f"{tensor_parallel}"
        )
    experts = config.experts
    if experts is None or experts.num_experts % size:
        count = "a dense model" if experts is None else f"{experts.num_experts} experts"
        raise ValueError(f"{key}={size} cannot split {count}; set it to 1")
    model = nnx.merge(graphdef, state)
    split_experts_over(model, "tensor")
    return nnx.graphdef(model)


def _key_rows(turn: TurnCall | None, layout: RowLayout) -> np.ndarray:
    """The row each of a call's slots draws its keys as: its row in the call, or the row that
    `turn.row_ids` names for it."""
    if turn is None or turn.row_ids is None:
        return layout.source.astype(np.int32)
    return np.asarray(turn.row_ids, np.int32)[layout.source]


def _slot_per_row(layout: RowLayout, plan: SlotPlan) -> bool:
    """Whether the slots hold every row of a replica: what a multi-turn round needs to keep
    each row's keys and values for the next (`SlotPlan.slot_per_row`)."""
    return plan.slots == layout.per_replica


@functools.lru_cache(maxsize=8)
def _zero_cache(shapes: CacheShapes, dtype: Any, shardings: SlotCache) -> Callable[[], SlotCache]:
    """A compiled allocator of a zeroed KV cache (buffers of the (keys, values) `shapes`),
    created in place with its shardings."""

    def zeros(part: tuple[tuple[int, ...], ...]) -> tuple[jax.Array, ...]:
        return tuple(jnp.zeros(shape, dtype) for shape in part)

    return jax.jit(lambda: SlotCache(*map(zeros, shapes)), out_shardings=shardings)
