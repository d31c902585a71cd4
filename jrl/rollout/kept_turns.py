"""Keys and values kept from one round of a multi-turn rollout to the next.

A round's generate call runs with one slot per row (`SlotPlan.slot_per_row`): every row is
admitted before the first decode step, so row i's slot holds, contiguously from column
P - p_i (P the prompt width, p_i its valid prompt tokens), the keys and values of its prompt
and of every token it generated but the last (that one was never fed back). Its token t of
that context sits at column P - p_i + t.

The next round's row continues one of those rows when its prompt starts with that context
(token in, token out: the history is never re-tokenised). `carry_over` copies each continuing
row's context into its new slot, left-padded to the new prompt width P' and ending where the
appended tokens begin: token t of a row of L' valid tokens at column P' - L' + t. The prefill
then runs only the prompts' last C columns (`SlotPlan.resume_chunk`, the longest appended part
rounded up to a power of two) against those keys and values, instead of the whole history.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jrl.models.kv_layout import AxisOrder, KVLayout
from jrl.rollout.layout import RowLayout
from jrl.rollout.limits import ceil_pow2
from jrl.rollout.sampler import SlotCache


class TurnCall(NamedTuple):
    """A `generate_turn` call: per row, the row of the call kept as `source` that it continues
    (`previous`, -1: none); `stream`, where the call's own keys and values are kept (several
    streams let groups of rows take rounds in turn); whether `source` is dropped once read
    (`drop_source`; it always is when it is `stream`); per row, the row it draws its keys as
    (`row_ids`; None: its row in the call)."""

    previous: Sequence[int]
    stream: int
    source: int
    drop_source: bool = False
    row_ids: Sequence[int] | None = None


@dataclasses.dataclass(frozen=True)
class KeptTurns:
    """What a slot-per-row call leaves for the next round: its `cache` and its prompts'
    `width`; per row of the call, its global `slot` and `contexts[i]`, the tokens whose keys
    and values the slot holds (the valid prompt, then the response but its last token) from
    column `starts[i]` on."""

    cache: SlotCache
    width: int
    slot: np.ndarray  # [N] int
    starts: np.ndarray  # [N] int
    contexts: list[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Resume:
    """How a round's call starts from `KeptTurns`: per global slot of the new call, the kept
    slot it copies (`source`) and the shift from its new columns to the kept ones; the
    prefill's width `chunk` (the prompt width when nothing is taken over)."""

    source: np.ndarray  # [S] int
    shift: np.ndarray  # [S] int
    chunk: int


def kept_turns(
    cache: SlotCache,
    layout: RowLayout,
    ids: np.ndarray,
    mask: np.ndarray,
    responses: np.ndarray,
    lengths: np.ndarray,
) -> KeptTurns:
    """`KeptTurns` of a slot-per-row call over left-padded prompts `ids`, `mask` [N, P] that
    sampled `responses` [N, R], `lengths` [N] tokens each."""
    rows = len(ids)
    slot = np.empty(rows, np.int64)
    slot[layout.source[layout.real]] = np.flatnonzero(layout.real)
    valid = mask.astype(bool)
    contexts = [
        np.concatenate([ids[i][valid[i]], responses[i, : max(int(lengths[i]) - 1, 0)]])
        for i in range(rows)
    ]
    starts = ids.shape[1] - valid.sum(axis=1)
    return KeptTurns(cache, ids.shape[1], slot, starts, contexts)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def plan_resume(
    kept: KeptTurns,
    previous: Sequence[int],
    ids: np.ndarray,
    mask: np.ndarray,
    layout: RowLayout,
) -> Resume:
    """The `Resume` of a call over left-padded prompts `ids`, `mask` [N, P] laid out as
    `layout`, row i continuing row `previous[i]` of the kept call (-1: none). A row takes over
    the longest prefix of its prompt that the kept row's context shares, leaving at least its
    last token to run (its logits give the first new token)."""
    width = ids.shape[1]
    valid = mask.astype(bool)
    lengths = valid.sum(axis=1)
    history = np.zeros(len(ids), np.int64)
    for i, j in enumerate(previous):
        if 0 <= j < len(kept.contexts):
            shared = common_prefix(ids[i][valid[i]], kept.contexts[j])
            history[i] = min(shared, lengths[i] - 1)
    chunk = min(width, ceil_pow2(int((lengths - history).max())))
    source = np.zeros(len(layout.source), np.int64)
    shift = np.zeros(len(layout.source), np.int64)
    for new_slot in np.flatnonzero(layout.real):
        i = layout.source[new_slot]
        j = previous[i]
        if history[i]:
            source[new_slot] = kept.slot[j]
            shift[new_slot] = kept.starts[j] - (width - lengths[i])
    return Resume(source, shift, chunk)


def prefilled_tokens(mask: np.ndarray, chunk: int) -> int:
    """Valid prompt tokens in the last `chunk` columns of `mask` [N, P]: what a resumed
    prefill runs."""
    return int(mask[:, -chunk:].sum())


@functools.lru_cache(maxsize=8)
def carry_over(
    layout: KVLayout, tokens: int, shardings: SlotCache
) -> Callable[[SlotCache, Any, Any], SlotCache]:
    """A compiled copy of a kept cache into a new one of `tokens` columns per slot (laid out
    with `shardings`): new slot s, column c holds kept slot source[s], column c + shift[s]
    (clipped to the kept columns; columns that hold no history are masked or overwritten by
    the prefill)."""

    def take(order: AxisOrder, buffer: jax.Array, source: jax.Array, shift: jax.Array):
        lead = layout.layer_axes
        rows = jnp.take(buffer, source, axis=lead)
        token_axis = lead + order.token_axis
        kept = buffer.shape[token_axis]
        columns = jnp.clip(jnp.arange(tokens)[None, :] + shift[:, None], 0, kept - 1)
        shape = [1] * rows.ndim
        shape[lead], shape[token_axis] = len(source), tokens
        return jnp.take_along_axis(rows, columns.reshape(shape), axis=token_axis)

    def copy(cache: SlotCache, source: jax.Array, shift: jax.Array) -> SlotCache:
        return SlotCache(
            *(
                tuple(take(order, buffer, source, shift) for buffer in part)
                for order, part in zip(layout.orders, cache, strict=True)
            )
        )

    return jax.jit(copy, out_shardings=shardings)
