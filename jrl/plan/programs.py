"""The programs one training step compiles, lowered from shapes: for each phase, every distinct
shape the trainer would feed its jitted functions for a batch of full-length rows (every prompt
``data.max_prompt_length`` and every response ``data.max_response_length`` tokens, the most a
step can hold), through the roles' own batching (micro-batches, dynamic batch sizes, packing).

Phases, in verl's order: ``rollout`` (one program per prompt bucket the engine may use; with
agent loops, also a later turn's widest call), ``old_log_prob``, ``ref``, ``values``,
``update_critic``, ``update_actor``; a split run adds ``update_weights``, the weight sync
(`jrl.plan.sync`).

Each program carries analytic FLOPs (verl's count, `jrl.trainer.io.flops`: the compiler counts
a loop body once and a Pallas kernel as zero) and the HBM bytes it must at least move per chip
(its weights read once per micro-batch or decode step), for a roofline estimate.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jrl.models.config import ModelConfig
from jrl.models.moe import ROUTED_EXPERTS, route_dtype
from jrl.parallel import data_parallel_size, replicated
from jrl.plan.roles import Roles
from jrl.rollout.jax_rollout import SESSION_DECODE_STEPS
from jrl.rollout.limits import ceil_pow2
from jrl.runspec.agent import uses_agent_loops
from jrl.runspec.reads import KeyReads
from jrl.trainer.io.flops import train_flops
from jrl.trainer.roles.critic import FORWARD_KEYS as VALUE_KEYS
from jrl.trainer.roles.critic import UPDATE_KEYS as CRITIC_KEYS
from jrl.trainer.roles.log_probs import FORWARD_KEYS
from jrl.trainer.update.batching import forward_inputs
from jrl.trainer.update.learner import Learner, normalisers

PHASES = (
    "rollout",
    "old_log_prob",
    "ref",
    "values",
    "update_critic",
    "update_actor",
    "update_weights",
)


@dataclasses.dataclass(frozen=True)
class Program:
    """One program of a phase: `lower()` gives its `jax.stages.Lowered`; `flops` (analytic, the
    phase's whole work on the slice), `weight_reads` (HBM bytes per chip the phase reads at
    least) and `ici_sends` (bytes per chip the phase sends to other chips) feed the estimate;
    `arguments` are its input bytes per chip."""

    phase: str
    label: str
    lower: Callable[[], Any]
    flops: float
    weight_reads: float
    arguments: int = 0
    ici_sends: float = 0.0


def per_chip_bytes(tree: Any, memory_kind: str | None = "device") -> int:
    """Bytes one chip holds of the sharded shapes (or arrays) of `tree`, counting only leaves in
    `memory_kind` (device memory by default; None counts every leaf)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            continue
        kind = sharding.memory_kind or "device"
        if memory_kind is not None and kind != memory_kind:
            continue
        total += math.prod(sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
    return total


def full_batch(
    rows: int, prompt: int, response: int, routes: ModelConfig | None = None
) -> dict[str, np.ndarray]:
    """A batch of `rows` full-length rows with every tensor a step's updates may read (with
    `routes`, the recorded experts of that mixture of experts' tokens, `ROUTED_EXPERTS`)."""
    width = prompt + response
    ints = {
        "input_ids": np.zeros((rows, width), np.int32),
        "attention_mask": np.ones((rows, width), np.int32),
        "position_ids": np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy(),
        "responses": np.zeros((rows, response), np.int32),
        "response_mask": np.ones((rows, response), np.int32),
    }
    names = ("old_log_probs", "advantages", "ref_log_prob", "values", "returns")
    batch = {**ints, **{k: np.zeros((rows, response), np.float32) for k in names}}
    if routes is not None:
        layers, experts = len(routes.sparse_layers), routes.experts
        shape = (rows, width, layers, experts.experts_per_token)
        batch[ROUTED_EXPERTS] = np.zeros(shape, route_dtype(experts.num_experts))
    return batch


def _host_bytes(tensors: dict[str, np.ndarray]) -> int:
    return sum(v.nbytes for v in tensors.values())


def _shapes(tree: Any) -> Any:
    """Shape structs without shardings (the jitted function's own in_shardings apply)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def _lowered_on(mesh: Any, fn: Any, *args: Any) -> Callable[[], Any]:
    def lower() -> Any:
        with jax.set_mesh(mesh):
            return fn.lower(*args)

    return lower


def _forward_programs(
    phase: str,
    role: Any,
    params: Any,
    tensors: dict[str, np.ndarray],
    extra: tuple[Any, ...],
    flops: float,
) -> Iterator[Program]:
    """The programs of a forward pass of `role` (a `LogProbForward` or the `Critic`: its
    `jitted` pass, `mesh` and `forward` split) over `tensors`; `extra` are its static arguments
    after the layout."""
    spec = role.forward
    inputs = forward_inputs(
        tensors,
        role.mesh,
        rows=spec.rows,
        remove_padding=spec.remove_padding,
        budget=spec.budget,
        share_prompts=spec.share_prompts,
    )
    rows = next(iter(tensors.values())).shape[0]
    weights = per_chip_bytes(params)
    for chunk, layout in inputs:
        chunk_rows = next(iter(chunk.values())).shape[0]
        label = f"micro-batch {list(chunk['input_ids'].shape)}" + (" packed" if layout else "")
        calls = math.ceil(rows / chunk_rows)
        shards = data_parallel_size(role.mesh)
        yield Program(
            phase,
            label,
            _lowered_on(role.mesh, role.jitted, _shapes(params), _shapes(chunk), layout, *extra),
            flops,
            weights * calls,
            weights + _host_bytes(chunk) // shards,
        )


def _update_programs(
    phase: str, learner: Learner, loss: Any, tensors: dict[str, np.ndarray], plan: Any, flops: float
) -> Iterator[Program]:
    seen: set[int] = set()
    updates = list(learner.updates(loss, tensors, plan))
    weights = per_chip_bytes(learner.trainable, None) + per_chip_bytes(learner.frozen, None)
    steps = len(updates)
    rep = replicated(learner.mesh)
    for minibatch, update in updates:
        if id(update) in seen:
            continue
        seen.add(id(update))
        norm = normalisers(minibatch["response_mask"], plan.loss_scale_factor)
        scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=rep)
        args = (
            _shapes(learner.trainable),
            _shapes(learner.frozen),
            _shapes(learner.opt_state),
            _shapes(minibatch),
            {k: scalar for k in norm},
            scalar,
        )
        micro = minibatch["input_ids"].shape
        states = weights + per_chip_bytes(learner.opt_state, None)
        yield Program(
            phase,
            f"{steps} optimizer steps of {list(micro)}",
            _lowered_on(learner.mesh, update, *args),
            flops,
            3 * weights * micro[0] * steps,
            states + _host_bytes(minibatch) // data_parallel_size(learner.mesh),
        )


def _rollout_programs(roles: Roles, rows: int, prompt: int, response: int, flops: float):
    rollout = roles.rollout
    buckets = sorted({min(prompt, ceil_pow2(n)) for n in range(1, prompt + 1)})
    weights = per_chip_bytes(rollout.state)
    replicas = rollout.mesh.shape["data"] * rollout.mesh.shape["fsdp"]
    per_replica = ceil_pow2(math.ceil(rows / replicas))
    for bucket in buckets:
        plan = rollout.plan(per_replica, bucket, roles.sampling)
        waves = math.ceil(per_replica / plan.slots)
        cache = rollout.cache_bytes(replicas * plan.slots, bucket, roles.sampling)
        yield Program(
            "rollout",
            f"prompt bucket {bucket}, {rows} rows, {plan.slots} slots",
            lambda bucket=bucket: rollout.lower(rows, bucket, roles.sampling),
            flops if bucket == prompt else 0.0,
            weights * response * waves if bucket == prompt else 0.0,
            weights + cache // rollout.mesh.size,
        )


def _later_turn_programs(roles: Roles, rows: int, prompt: int, response: int) -> list[Program]:
    """Multi-turn rollouts (agent loops): a later round samples each waiting trajectory once
    more (n = 1) after its whole history, prompt and response so far (`TurnServer`). The widest
    such call: every trajectory, the history's bucket, the whole response budget. Where the
    slots hold every trajectory the round takes over the previous round's keys and values: a
    copy into its cache, then a prefill of the appended tokens only (at most the response
    budget); otherwise it prefills every history whole."""
    rollout = roles.rollout
    width = ceil_pow2(prompt + response)
    sampling = dataclasses.replace(roles.sampling, n=1)
    replicas = rollout.mesh.shape["data"] * rollout.mesh.shape["fsdp"]
    plan = rollout.plan(ceil_pow2(math.ceil(rows / replicas)), width, sampling)
    cache = rollout.cache_bytes(replicas * plan.slots, width, sampling) // rollout.mesh.size
    weights = per_chip_bytes(rollout.state)
    label = f"later turns: history bucket {width}, {rows} rows, {plan.slots} slots"
    if not rollout.resumes(rows, width, sampling):
        return [
            Program(
                "rollout", label, lambda: rollout.lower(rows, width, sampling), 0.0, 0.0,
                weights + cache,
            )
        ]  # fmt: skip
    chunk = min(width, ceil_pow2(response))
    return [
        Program(
            "rollout",
            f"later turns: kept keys and values copied, {rows} rows, bucket {width}",
            lambda: rollout.lower_carry_over(rows, width, sampling),
            0.0,
            0.0,
            cache,
        ),
        Program(
            "rollout",
            f"{label}, prefill of the last {chunk} columns",
            lambda: rollout.lower(rows, width, sampling, resume_chunk=chunk),
            0.0,
            0.0,
            weights + cache,
        ),
    ]


def _session_programs(roles: Roles, rows: int, prompt: int, response: int) -> list[Program]:
    """Multi-turn rollouts in slots (``rollout.agent.scheduling=slots``, `TurnSession`): after
    round 0, each trajectory keeps a slot of its prompt and the whole response budget. Where
    round 0 runs one slot per trajectory its keys and values are copied into those slots and
    a turn admits the appended tokens only (at most the response budget); otherwise a
    trajectory's first admission prefills its whole history. Then the decode steps between
    admissions."""
    rollout = roles.rollout
    bucket = min(prompt, ceil_pow2(prompt))
    resumes = rollout.resumes(rows, bucket, roles.sampling)
    chunk = ceil_pow2(response + 1) if resumes else ceil_pow2(prompt + response)
    replicas = rollout.mesh.shape["data"] * rollout.mesh.shape["fsdp"]
    slots = replicas * ceil_pow2(math.ceil(rows / replicas))
    cache = rollout.cache_bytes(slots, bucket, roles.sampling) // rollout.mesh.size
    weights = per_chip_bytes(rollout.state)
    labels = {
        "admit": f"later turns in slots: admission of {chunk} tokens into every slot",
        "decode": f"later turns in slots: {SESSION_DECODE_STEPS} decode steps of every slot",
    }
    if resumes:
        labels["carry"] = f"later turns in slots: round 0's keys and values copied, {rows} rows"

    def lower(name: str) -> Any:
        return rollout.lower_session(rows, bucket, roles.sampling, chunk)[name]

    return [
        Program("rollout", label, functools.partial(lower, name), 0.0, 0.0, weights + cache)
        for name, label in labels.items()
    ]


def step_programs(roles: Roles, config: Any, largest_bucket_only: bool = False) -> list[Program]:
    """Every program of one training step of `config` (see the module docstring); with
    `largest_bucket_only`, the rollout's widest prompt bucket only (the one that sets its peak)."""
    data = config.data
    rows = int(data.train_batch_size) * int(roles.sampling.n)
    prompt, response = int(data.max_prompt_length), int(data.max_response_length)
    model_config = roles.actor.learner.model().config
    replay = roles.actor.spec.router_replay
    records = replay == "R2" or roles.rollout.record_routes
    routed = model_config if records and model_config.sparse_layers else None
    batch = full_batch(rows, prompt, response, routed)
    train = train_flops(model_config, [prompt + response] * rows)
    forward = train / 3
    out = list(_rollout_programs(roles, rows, prompt, response, forward))
    if largest_bucket_only:
        out = out[-1:]
    rollout_keys = KeyReads(config).actor_rollout_ref.rollout
    if uses_agent_loops(rollout_keys, read=False):
        if rollout_keys.peek("agent.scheduling") == "slots":
            out += _session_programs(roles, rows, prompt, response)
        else:
            out += _later_turn_programs(roles, rows, prompt, response)
    actor = roles.actor
    log_prob_keys = {k: batch[k] for k in FORWARD_KEYS}
    replayed = {ROUTED_EXPERTS: batch[ROUTED_EXPERTS]} if routed and replay == "R3" else {}
    out += _forward_programs(
        "old_log_prob",
        actor.log_probs,
        actor.params,
        {**log_prob_keys, **replayed},
        (True, routed is not None),
        forward,
    )
    if roles.ref is not None:
        out += _forward_programs(
            "ref", roles.ref.log_probs, roles.ref.params, log_prob_keys, (False,), forward
        )
    critic = roles.critic
    if critic is not None:
        value_model = critic.learner.model().config
        critic_train = train_flops(value_model, [prompt + response] * rows)
        values = {k: batch[k] for k in VALUE_KEYS}
        out += _forward_programs(
            "values", critic, critic.learner.params, values, (), critic_train / 3
        )
        epochs = critic.spec.train.plan.epochs
        out += _update_programs(
            "update_critic",
            critic.learner,
            critic.spec.loss,
            {k: batch[k] for k in CRITIC_KEYS},
            critic.spec.train.plan,
            critic_train * epochs,
        )
    tensors = actor.update_tensors(batch)
    plan = actor.spec.train.plan
    out += _update_programs(
        "update_actor", actor.learner, actor.update_loss(rows), tensors, plan, train * plan.epochs
    )
    return out
