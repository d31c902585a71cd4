"""Generation on the device with continuous batching.

A replica owns a pool of KV-cache slots, one sequence each. One `lax.while_loop` alternates two
phases: admission (waiting prompts are prefilled `prefill_rows` at a time, once that many slots are
free, into the free slots) and one decode step of every slot. A sequence that emits EOS or
reaches `max_new_tokens` frees its slot for the next waiting prompt, so a long answer does not
idle the batch. Token t of row r is drawn with the key `fold_in(fold_in(rng, r), t)`, so what a
row generates does not depend on the slot it lands in, on the slot count or on the replica that
runs it.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from jrl.models import CausalLM, KVCache
from jrl.models.decoder import DecoderOut, RopeByPosition
from jrl.models.kv_layout import KVLayout
from jrl.models.moe import ROUTE_NONE, ROUTED_EXPERTS, route_dtype
from jrl.parallel import batch_axes
from jrl.rollout.limits import SlotPlan
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.selection import row_keys, select_tokens
from jrl.rollout.tensor_parallel import cache_sharding, kv_layout


def prompt_positions(prompt_mask: jax.Array) -> jax.Array:
    """Position ids of a left-padded prompt: 0 at its first valid token, 0 on the padding."""
    return jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)


def is_eos(tokens: jax.Array, params: SamplingParams) -> jax.Array:
    if params.ignore_eos or not params.eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(params.eos_token_ids, jnp.int32))


def response_mask(responses: jax.Array, params: SamplingParams) -> jax.Array:
    """1 up to and including each row's first EOS, 0 after it."""
    eos = is_eos(responses, params).astype(jnp.int32)
    return (jnp.cumsum(eos, axis=-1) - eos == 0).astype(jnp.int32)


def ring_length(prompt_length: int, params: SamplingParams, layout: KVLayout) -> int:
    """Ring columns of a slot: room for every generated token but the last (R - 1), more when
    the layout rounds a slot's columns up (`KVLayout.token_multiple`)."""
    tokens = prompt_length + params.max_new_tokens - 1
    multiple = layout.token_multiple
    return -(-tokens // multiple) * multiple - prompt_length


def cache_length(prompt_length: int, params: SamplingParams, layout: KVLayout) -> int:
    """Tokens one slot caches: the prompt, then the ring of generated tokens."""
    return prompt_length + ring_length(prompt_length, params, layout)


class SlotCache(NamedTuple):
    """Keys and values of every slot, each a tuple of buffers [slots, tokens, kv_heads, head_dim]
    (or [layers, slots, ...]) as `config.kv_layout` gives the platform (`KVCache`).

    A slot's first P columns hold its prompt (written when it is admitted). The W >= R - 1
    columns after them (`ring_length`) are a ring that all slots write together: decode step g
    writes column P + g mod W of every slot, one in-place update whatever the slots' progress. A
    slot admitted at step g0 finds its j-th generated token at column P + (g0 + j) mod W;
    `ring_slots` puts those columns back in token order for the attention mask.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def ring_slots(
    decode_step: jax.Array, generated: jax.Array, prompt_length: int, ring: int
) -> tuple[jax.Array, jax.Array]:
    """(token slot [S, ring], valid [S, ring]) of the ring's columns at decode step
    `decode_step`, for slots that have generated `generated` [S] tokens.

    Ring column c was written ago = (decode_step - c) mod ring steps ago (0: by this step), so
    it holds generated token j = generated - 1 - ago, at slot prompt_length + j, valid iff j >= 0.
    """
    ago = (decode_step - jnp.arange(ring, dtype=jnp.int32)) % ring
    token = generated[:, None] - 1 - ago[None, :]
    return prompt_length + token, token >= 0


class _Slots(NamedTuple):
    """The loop state of one replica: S slots, N rows of prompts waiting or done."""

    cache: SlotCache
    row: jax.Array  # [S] the row each slot holds (N when it never held one)
    step: jax.Array  # [S] tokens the slot's sequence has generated
    active: jax.Array  # [S] bool: still generating
    last: jax.Array  # [S] the last generated token
    length: jax.Array  # [S] the prompt's valid length
    prompt_mask: jax.Array  # [S, P] bool
    head: jax.Array  # [] the next waiting row
    responses: jax.Array  # [N, R] int32
    log_probs: jax.Array  # [N, R] float32
    decode_steps: jax.Array  # [] decode steps run so far
    routes: jax.Array  # [N, P + R, sparse layers, k] experts each token used ([N, 0, 0, 0]: none)


def _decode_slots(
    model: CausalLM, s: _Slots, prompt_length: int, ring: int, rope: RopeByPosition
) -> tuple[jax.Array, SlotCache, jax.Array | None]:
    """One cached decode step of every slot, each writing the ring's shared column, with the
    rotary tables of every position it can reach (`rope`); hidden [S, D] and the experts each
    slot's token used [S, sparse layers, k] (None for a dense model)."""
    ring_slot, ring_valid = ring_slots(s.decode_steps, s.step, prompt_length, ring)
    prompt_slot = jnp.broadcast_to(jnp.arange(prompt_length, dtype=jnp.int32), s.prompt_mask.shape)
    columns = jnp.concatenate([prompt_slot, ring_slot], axis=1)
    kv_mask = jnp.concatenate([s.prompt_mask, ring_valid], axis=1)
    query = prompt_length + s.step - 1
    hidden, cache, routes = model.forward_cached(
        s.last[:, None],
        (s.length + s.step - 1)[:, None],
        KVCache(*s.cache),
        prompt_length + s.decode_steps % ring,
        kv_mask,
        slots=(query[:, None], columns),
        rope=rope,
    )
    return hidden[:, 0], SlotCache(*cache), None if routes is None else routes[:, 0]


def _prefill(
    model: CausalLM, ids: jax.Array, mask: jax.Array, dtype: Any, rope: RopeByPosition
) -> DecoderOut:
    """`DecoderOut` of G left-padded prompts: hidden states [G, P, D], their keys and values
    (laid out as the model's cache), the experts their tokens used; rotary tables from `rope`."""
    fresh = model.init_cache(ids.shape[0], ids.shape[1], dtype=dtype)
    return model.forward_cached(ids, prompt_positions(mask), fresh, 0, mask, rope=rope)


def slot_columns(layout: KVLayout, cache: SlotCache, slot: jax.Array, columns: int) -> KVCache:
    """The first `columns` columns of the cache's rows `slot`."""
    lead = (slice(None),) * layout.layer_axes
    return KVCache(
        *(
            tuple(b[lead + order.first_tokens(slot, columns)] for b in part)
            for order, part in zip(layout.orders, cache, strict=True)
        )
    )


def put_slot_columns(
    layout: KVLayout, cache: SlotCache, slot: jax.Array, rows: KVCache, columns: int
) -> SlotCache:
    """`cache` with the first `columns` columns of rows `slot` replaced by `rows` (slots past
    the cache: not written)."""
    lead = (slice(None),) * layout.layer_axes
    return SlotCache(
        *(
            tuple(
                b.at[lead + order.first_tokens(slot, columns)].set(r, mode="drop")
                for b, r in zip(part, new, strict=True)
            )
            for order, part, new in zip(layout.orders, cache, rows, strict=True)
        )
    )


def _resume_prefill(
    model: CausalLM,
    cache: SlotCache,
    slot: jax.Array,
    ids: jax.Array,
    mask: jax.Array,
    chunk: int,
    layout: KVLayout,
    rope: RopeByPosition,
) -> DecoderOut:
    """`_prefill` of G left-padded prompts [G, P] whose `slot`s' first P - `chunk` columns
    already hold their keys and values: only the last `chunk` columns run, against those (the
    experts used: of those columns)."""
    prompt_len = ids.shape[1]
    history = slot_columns(layout, cache, slot, prompt_len)
    positions = prompt_positions(mask)[:, -chunk:]
    return model.forward_cached(
        ids[:, -chunk:], positions, history, prompt_len - chunk, mask, rope=rope
    )


class _Request(NamedTuple):
    """What `generate_tokens` hands each replica besides the model and the cache."""

    prompt_ids: jax.Array  # [N, P] int32, left-padded
    prompt_mask: jax.Array  # [N, P]
    row_ids: jax.Array  # [N] each row's index in the call
    real_rows: jax.Array  # [1] rows of this replica that are not padding
    rng: jax.Array
    continuous: jax.Array  # [] bool


def _generate_replica(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    request: _Request,
    cache: SlotCache,
    *,
    params: SamplingParams,
    plan: SlotPlan,
    layout: KVLayout,
    record_routes: bool,
) -> tuple[dict[str, jax.Array], jax.Array, SlotCache]:
    prompt_ids, prompt_mask, row_ids, real_rows, rng, continuous = request
    model = nnx.merge(graphdef, state)
    sparse, experts = model.config.sparse_layers, model.config.experts
    record_routes = record_routes and bool(sparse)
    rows, prompt_len = prompt_ids.shape
    slots, group, steps = plan.slots, plan.prefill_rows, params.max_new_tokens
    ring = ring_length(prompt_len, params, layout)
    rope = model.model.position_tables(prompt_len + steps)  # once, outside the loop
    shared = plan.shared_prefill
    prompt_mask = prompt_mask.astype(bool)
    real_rows = real_rows[0]

    def admit(s: _Slots) -> _Slots:
        """Prefill the next waiting prompts (up to `group`) into free slots; sample token 0."""
        lane = jnp.arange(group)
        valid = lane < jnp.minimum(real_rows - s.head, group)
        row = jnp.minimum(s.head + lane, rows - 1)
        chosen = row if plan.slot_per_row else jnp.argsort(s.active, stable=True)[:group]
        slot = jnp.where(valid, chosen, slots)
        out_row = jnp.where(valid, row, rows)  # lanes past the last prompt write nothing
        ids, mask = prompt_ids[row], prompt_mask[row]
        if plan.resume_chunk:
            held = jnp.minimum(slot, slots - 1)
            hidden, fresh, used = _resume_prefill(
                model, s.cache, held, ids, mask, plan.resume_chunk, layout, rope
            )
        else:
            prefill_ids, prefill_mask = ids[::shared], mask[::shared]
            hidden, fresh, used = _prefill(model, prefill_ids, prefill_mask, cache.k[0].dtype, rope)
        last = jnp.repeat(hidden[:, -1], shared, axis=0)
        routes = s.routes
        if record_routes:  # the prompt's real columns (a resumed prefill's last ones)
            used = jnp.repeat(used, len(ids) // len(used), axis=0)
            columns = slice(prompt_len - used.shape[1], prompt_len)
            used = jnp.where(mask[:, columns, None, None], used, ROUTE_NONE)
            routes = routes.at[out_row, columns].set(used.astype(routes.dtype), mode="drop")
        keys = row_keys(rng, row_ids[row], jnp.zeros(group, jnp.int32))
        token, logp = select_tokens(model.logits(last), keys, params)
        finished = is_eos(token, params) | (steps == 1)

        def put(target: jax.Array, value: jax.Array) -> jax.Array:
            return target.at[slot].set(value, mode="drop")

        # A prompt's keys and values go into the slots of its `shared` rows.
        repeated = jax.tree.map(lambda f: jnp.repeat(f, shared, axis=layout.layer_axes), fresh)
        return s._replace(
            cache=put_slot_columns(layout, s.cache, slot, repeated, prompt_len),
            row=put(s.row, row),
            step=put(s.step, 1),
            active=put(s.active, ~finished),
            last=put(s.last, token),
            length=put(s.length, jnp.sum(mask, axis=-1, dtype=jnp.int32)),
            prompt_mask=put(s.prompt_mask, mask),
            head=s.head + jnp.sum(valid),
            responses=s.responses.at[out_row, 0].set(token, mode="drop"),
            log_probs=s.log_probs.at[out_row, 0].set(logp, mode="drop"),
            routes=routes,
        )

    def admission(s: _Slots) -> _Slots:
        """Admit prompts while a group of them fits in the free slots (the last prompts: all of
        them); with static batching only into an empty pool."""
        is_open = continuous | ~jnp.any(s.active)

        def wanted(s: _Slots) -> jax.Array:
            waiting = real_rows - s.head
            free = slots - jnp.sum(s.active)
            return is_open & (waiting > 0) & (free >= jnp.minimum(group, waiting))

        return jax.lax.while_loop(wanted, admit, s)

    def decode(s: _Slots) -> _Slots:
        """One token for every slot; finished slots compute but write nothing."""
        hidden, new_cache, used = _decode_slots(model, s, prompt_len, ring, rope)
        keys = row_keys(rng, row_ids[jnp.minimum(s.row, rows - 1)], s.step)
        token, logp = select_tokens(model.logits(hidden), keys, params)
        out_row = jnp.where(s.active, s.row, rows)
        finished = is_eos(token, params) | (s.step + 1 >= steps)
        routes = s.routes
        if record_routes:  # the token fed: generated token step - 1
            column = prompt_len + s.step - 1
            routes = routes.at[out_row, column].set(used.astype(routes.dtype), mode="drop")
        return s._replace(
            cache=new_cache,
            step=s.step + s.active,
            active=s.active & ~finished,
            last=token,
            responses=s.responses.at[out_row, s.step].set(token, mode="drop"),
            log_probs=s.log_probs.at[out_row, s.step].set(logp, mode="drop"),
            decode_steps=s.decode_steps + 1,
            routes=routes,
        )

    def running(s: _Slots) -> jax.Array:
        return (s.head < real_rows) | jnp.any(s.active)

    fresh = dict(
        row=jnp.full(slots, rows, jnp.int32),
        step=jnp.zeros(slots, jnp.int32),
        active=jnp.zeros(slots, bool),
        last=jnp.zeros(slots, jnp.int32),
        length=jnp.zeros(slots, jnp.int32),
        prompt_mask=jnp.zeros((slots, prompt_len), bool),
        head=jnp.int32(0),
        responses=jnp.full((rows, steps), params.pad_token_id, jnp.int32),
        log_probs=jnp.zeros((rows, steps), jnp.float32),
        decode_steps=jnp.int32(0),
        routes=(
            jnp.full(
                (rows, prompt_len + steps, len(sparse), experts.experts_per_token),
                ROUTE_NONE,
                route_dtype(experts.num_experts),
            )
            if record_routes
            else jnp.zeros((rows, 0, 0, 0), jnp.int8)
        ),
    )
    # The loop's values differ per replica, as the carry that starts from these constants will.
    start = _Slots(cache=cache, **jax.lax.pcast(fresh, batch_axes(), to="varying"))
    # With one token per row every sequence ends at its prefill: no step decodes.
    step = admission if steps == 1 else lambda s: decode(admission(s))
    end = jax.lax.while_loop(running, step, start)
    out = {"responses": end.responses, "log_probs": end.log_probs}
    if record_routes:
        out[ROUTED_EXPERTS] = end.routes
    return out, end.decode_steps[None], end.cache


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "params", "plan", "mesh", "record_routes"),
    donate_argnames=("cache",),
)
def generate_tokens(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    row_ids: jax.Array,
    real_rows: jax.Array,
    rng: jax.Array,
    continuous: jax.Array,
    cache: SlotCache,
    *,
    params: SamplingParams,
    plan: SlotPlan,
    mesh: Mesh,
    record_routes: bool = False,
) -> tuple[dict[str, jax.Array], jax.Array, SlotCache]:
    """Generate up to `params.max_new_tokens` tokens after each left-padded prompt.

    Rows ([R * N, ...]) and cache slots ([R * S, ...]) split evenly over the R replicas of
    `mesh`'s batch axes; replica r generates its first `real_rows[r]` rows (the rest are padding)
    with `plan` and keys from `row_ids` (each row's index in the call). With `continuous` (a
    traced bool) a slot takes the next waiting prompt as soon as its sequence ends; without it,
    slots are refilled only once all of them are free (static batching). The model runs tensor
    parallel over the mesh's `tensor` axis as its parameters' shardings say.
    Returns ({`responses` [R * N, max_new_tokens] int32 with `pad_token_id` after EOS,
    `response_mask` (1 up to and including EOS), `rollout_log_probs` float32 at the rollout
    temperature, 0 where masked}, the decode steps each replica ran [R], the cache to reuse or
    drop). With `record_routes` (and a mixture-of-experts model) the dict also holds
    `routed_experts` [R * N, P + max_new_tokens, sparse layers, k]: the experts each token of
    the prompt and the response used (`ROUTE_NONE` for padding, for a response's last token,
    which no step feeds, and for the columns a resumed prefill did not run).
    """
    rows = PartitionSpec(batch_axes())
    config = nnx.merge(graphdef, state).config
    layout = kv_layout(mesh, config)
    layers = (None,) * layout.layer_axes
    slots = PartitionSpec(*layers, batch_axes())  # a cache buffer [(layers,) slots, ...]
    request_specs = _Request(rows, rows, rows, rows, PartitionSpec(), PartitionSpec())
    replica = functools.partial(
        _generate_replica,
        graphdef,
        params=params,
        plan=plan,
        layout=layout,
        record_routes=record_routes,
    )
    run = jax.shard_map(
        replica,
        mesh=mesh,
        in_specs=(PartitionSpec(), request_specs, slots),
        out_specs=(rows, rows, slots),
        axis_names=frozenset(batch_axes()),
    )
    request = _Request(prompt_ids, prompt_mask, row_ids, real_rows, rng, continuous)
    generated, decode_steps, cache = run(state, request, cache)
    kept = SlotCache(*cache_sharding(mesh, config))  # the kept cache's layout
    cache = jax.lax.with_sharding_constraint(cache, kept)
    responses, log_probs = generated.pop("responses"), generated.pop("log_probs")
    mask = response_mask(responses, params)
    out = {"responses": responses, "response_mask": mask, "rollout_log_probs": log_probs * mask}
    return {**out, **generated}, decode_steps, cache
