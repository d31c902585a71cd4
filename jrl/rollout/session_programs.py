"""The device programs of a turn session (`jrl.rollout.session`): slots that live across the
turns of a multi-turn rollout, each holding one trajectory's context.

Slot s's columns hold its context in order: token t at column t (`length[s]` of them hold keys
and values). Unlike the generate loop's shared ring (`sampler.SlotCache`), every slot writes at
its own column, so a slot whose row waits for a tool keeps its keys and values untouched while
the others decode, and a row that comes back is admitted on its own: `admit_turns` prefills
only the tokens it appended (its previous turn's last token and the tool's or user's turn) at
its columns, and samples the turn's first token. `decode_turns` runs up to K decode steps of
every slot, between which the host admits rows (the caller's loop).

Turn k of row r draws token t with `turn_keys`: fold_in(fold_in(key_k, r), t), key_0 = key and
key_k = fold_in(key, k); a token depends on its row, turn and index, never on the slot, the
schedule or the replica.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from jrl.models import KVCache
from jrl.models.kv_layout import KVLayout
from jrl.parallel import batch_axes
from jrl.rollout.sampler import SlotCache, is_eos, put_slot_columns, slot_columns
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.selection import select_tokens
from jrl.rollout.tensor_parallel import kv_layout


class SessionState(NamedTuple):
    """Every slot of a session (split over the replicas like the cache)."""

    cache: SlotCache  # per buffer [(layers,) slots, ...columns L...]
    length: jax.Array  # [S] context tokens whose keys and values the slot holds
    last: jax.Array  # [S] the last sampled token (its keys and values not yet written)
    active: jax.Array  # [S] bool: sampling a turn
    step: jax.Array  # [S] tokens sampled in the current turn
    limit: jax.Array  # [S] the current turn's token limit
    row: jax.Array  # [S] the trajectory row (for keys)
    turn: jax.Array  # [S] the row's turn index (for keys)
    tokens: jax.Array  # [S, R] int32 the current turn's tokens
    log_probs: jax.Array  # [S, R] float32 their log-probs at the sampling temperature


class Admission(NamedTuple):
    """A lanes per replica, each admitting a turn into a slot (`slot` = S on an idle lane)."""

    slot: jax.Array  # [A] the replica's slot
    ids: jax.Array  # [A, C] int32: the tokens to prefill, right-padded
    count: jax.Array  # [A] how many of them are tokens
    start: jax.Array  # [A] the column (and position) of the first
    row: jax.Array  # [A]
    turn: jax.Array  # [A]
    limit: jax.Array  # [A] the turn's token limit (>= 1)


def turn_key(rng: jax.Array, turn: jax.Array | int) -> jax.Array:
    """The key a multi-turn rollout's `turn`-th turns draw with: `rng` for the first (so a
    single-turn rollout samples what `generate` samples), fold_in(rng, turn) after it. Rows
    then draw as `generate`'s rows do (`selection.row_keys`)."""
    later = jax.random.key_data(jax.random.fold_in(rng, turn))
    data = jnp.where(jnp.asarray(turn) == 0, jax.random.key_data(rng), later)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng))


def turn_keys(rng: jax.Array, turn: jax.Array, row: jax.Array, step: jax.Array) -> jax.Array:
    """The key of token `step[i]` of turn `turn[i]` of row `row[i]` (module docstring)."""
    fold = jax.random.fold_in
    return jax.vmap(lambda t, r, s: fold(fold(turn_key(rng, t), r), s))(turn, row, step)


def _admit_replica(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    session: SessionState,
    admission: Admission,
    rng: jax.Array,
    *,
    params: SamplingParams,
    layout: KVLayout,
    columns: int,
) -> SessionState:
    model = nnx.merge(graphdef, state)
    slot = jnp.minimum(admission.slot, session.length.shape[0] - 1)
    ends = admission.start + admission.count
    kv_mask = jnp.arange(columns)[None, :] < ends[:, None]
    chunk = admission.ids.shape[1]
    positions = admission.start[:, None] + jnp.arange(chunk, dtype=jnp.int32)
    history = slot_columns(layout, session.cache, slot, columns)
    hidden, written, _ = model.forward_cached(
        admission.ids, positions, history, admission.start, kv_mask
    )
    last = jnp.take_along_axis(hidden, (admission.count - 1)[:, None, None], axis=1)[:, 0]
    keys = turn_keys(rng, admission.turn, admission.row, jnp.zeros_like(admission.row))
    token, logp = select_tokens(model.logits(last), keys, params)
    finished = is_eos(token, params) | (admission.limit <= 1)
    target = admission.slot  # S on idle lanes: written nowhere

    def put(field: jax.Array, value: jax.Array) -> jax.Array:
        return field.at[target].set(value, mode="drop")

    return session._replace(
        cache=put_slot_columns(layout, session.cache, target, written, columns),
        length=put(session.length, ends),
        last=put(session.last, token),
        active=put(session.active, ~finished),
        step=put(session.step, 1),
        limit=put(session.limit, admission.limit),
        row=put(session.row, admission.row),
        turn=put(session.turn, admission.turn),
        tokens=session.tokens.at[target, 0].set(token, mode="drop"),
        log_probs=session.log_probs.at[target, 0].set(logp, mode="drop"),
    )


def _decode_replica(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    session: SessionState,
    rng: jax.Array,
    *,
    params: SamplingParams,
    layout: KVLayout,
    steps: int,
    columns: int,
) -> SessionState:
    model = nnx.merge(graphdef, state)
    slots = session.length.shape[0]
    rope = model.model.position_tables(columns + 1)  # once, outside the loop
    every_slot = jnp.arange(slots)

    def decode(carry: tuple[jax.Array, SessionState]) -> tuple[jax.Array, SessionState]:
        """One token for every active slot; the others write a column past their context
        (past the first `columns`: nowhere)."""
        done, s = carry
        kv_mask = jnp.arange(columns)[None, :] <= s.length[:, None]
        hidden, cache, _ = model.forward_cached(
            s.last[:, None], s.length[:, None], KVCache(*s.cache), s.length, kv_mask, rope=rope
        )
        keys = turn_keys(rng, s.turn, s.row, s.step)
        token, logp = select_tokens(model.logits(hidden[:, 0]), keys, params)
        target = jnp.where(s.active, every_slot, slots)
        finished = is_eos(token, params) | (s.step + 1 >= s.limit)
        s = s._replace(
            cache=SlotCache(*cache),
            length=s.length + s.active,
            last=jnp.where(s.active, token, s.last),
            active=s.active & ~finished,
            step=s.step + s.active,
            tokens=s.tokens.at[target, s.step].set(token, mode="drop"),
            log_probs=s.log_probs.at[target, s.step].set(logp, mode="drop"),
        )
        return done + 1, s

    def running(carry: tuple[jax.Array, SessionState]) -> jax.Array:
        done, s = carry
        return (done < steps) & jnp.any(s.active)

    # The loop runs on the first `columns` of every slot: the attention reads no more.
    first = _columns(
        layout, session.cache, lambda b, axis: jax.lax.slice_in_dim(b, 0, columns, axis=axis)
    )
    start = (jax.lax.pcast(jnp.int32(0), batch_axes(), to="varying"), session._replace(cache=first))
    end = jax.lax.while_loop(running, decode, start)[1]
    written = iter(jax.tree.leaves(end.cache))

    def put_back(buffer: jax.Array, axis: int) -> jax.Array:
        return jax.lax.dynamic_update_slice_in_dim(buffer, next(written), 0, axis=axis)

    return end._replace(cache=_columns(layout, session.cache, put_back))


def _columns(
    layout: KVLayout, cache: SlotCache, change: Callable[[jax.Array, int], jax.Array]
) -> SlotCache:
    """`cache` with `change`(buffer, its token axis) applied to every buffer."""
    return SlotCache(
        *(
            tuple(change(b, layout.layer_axes + order.token_axis) for b in part)
            for order, part in zip(layout.orders, cache, strict=True)
        )
    )


def _specs(mesh: Mesh, layout: KVLayout) -> tuple[PartitionSpec, SessionState]:
    """(a replicated value's spec, the session's specs: slots over the replicas)."""
    rows = PartitionSpec(batch_axes())
    cache = PartitionSpec(*(None,) * layout.layer_axes, batch_axes())
    buffers = SlotCache(cache, cache)
    return PartitionSpec(), SessionState(buffers, *(rows,) * 9)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "params", "mesh", "columns"),
    donate_argnames=("session",),
)
def admit_turns(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    session: SessionState,
    admission: Admission,
    rng: jax.Array,
    *,
    params: SamplingParams,
    mesh: Mesh,
    columns: int,
) -> SessionState:
    """Prefill each admitted turn's tokens into its slot and sample its first token (lanes
    [R * A] split over the R replicas as the slots are; the model tensor parallel as its
    parameters' shardings say); every admitted context ends within the first `columns`."""
    layout = kv_layout(mesh, nnx.merge(graphdef, state).config)
    replicated, specs = _specs(mesh, layout)
    lanes = Admission(*(PartitionSpec(batch_axes()),) * len(Admission._fields))
    replica = functools.partial(
        _admit_replica, graphdef, params=params, layout=layout, columns=columns
    )
    run = jax.shard_map(
        replica,
        mesh=mesh,
        in_specs=(replicated, specs, lanes, replicated),
        out_specs=specs,
        axis_names=frozenset(batch_axes()),
    )
    return run(state, session, admission, rng)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "params", "mesh", "steps", "columns"),
    donate_argnames=("session",),
)
def decode_turns(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    session: SessionState,
    rng: jax.Array,
    *,
    params: SamplingParams,
    mesh: Mesh,
    steps: int,
    columns: int,
) -> SessionState:
    """Up to `steps` decode steps of every slot (fewer once no slot samples a turn), whose
    sampling slots' contexts stay within their first `columns` columns."""
    layout = kv_layout(mesh, nnx.merge(graphdef, state).config)
    replicated, specs = _specs(mesh, layout)
    replica = functools.partial(
        _decode_replica, graphdef, params=params, layout=layout, steps=steps, columns=columns
    )
    run = jax.shard_map(
        replica,
        mesh=mesh,
        in_specs=(replicated, specs, replicated),
        out_specs=specs,
        axis_names=frozenset(batch_axes()),
    )
    return run(state, session, rng)
