"""Packed sequences (verl's ``use_remove_padding``).

The valid tokens of each micro-batch are laid out back to back in a fixed ``[rows, length]``
buffer, so the model spends no compute or memory on padding. The host plans where each sequence
goes (`plan_packing`: first-fit decreasing into rows as long as the padded rows, never splitting a
sequence); the jitted step moves the tokens there (`pack`), runs the model with segment ids, and
gathers per-token outputs back to the padded layout (`unpack`). The row count is rounded up to a
bucket (the batch-shard count times 1, 2, 3, 4, 6, 8, 12, ..., at most the micro-batch) so that
few shapes are ever compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jrl.parallel import batch_axes, batch_sharding

# The batch tensor holding, per sequence, its first slot in its micro-batch's flat packed buffer.
PACK_START = "pack_start"


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """The static shape of a packed micro-batch: `rows` rows of `length` tokens, placed with
    `sharding` (rows split over the batch axes) when one is given."""

    rows: int
    length: int
    sharding: NamedSharding | None = None


class Packed(NamedTuple):
    """A packed micro-batch.

    input_ids, position_ids, segment_ids: [rows, length]; the sequence of batch row b is segment
    b + 1 and padding is segment 0. index: [B, T], the flat slot (row * length + column) of every
    token of the padded batch, rows * length for padding.
    """

    input_ids: jax.Array
    position_ids: jax.Array
    segment_ids: jax.Array
    index: jax.Array


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """First-fit decreasing: each sequence's first flat slot in rows of `capacity`, and the rows
    used (at least one)."""
    room: list[int] = []
    starts = np.zeros(len(lengths), np.int32)
    for i in np.argsort(-lengths, kind="stable"):
        need = int(lengths[i])
        row = next((r for r, free in enumerate(room) if free >= need), len(room))
        if row == len(room):
            room.append(capacity)
        starts[i] = row * capacity + capacity - room[row]
        room[row] -= need
    return starts, max(len(room), 1)


def batch_shards(mesh: Mesh | None) -> int:
    """How many ways the batch rows are split on `mesh` (1 without a mesh)."""
    return 1 if mesh is None else math.prod(mesh.shape[axis] for axis in batch_axes())


def packed_sharding(mesh: Mesh | None) -> NamedSharding | None:
    """The sharding of packed rows on `mesh`: rows split over the batch axes."""
    return None if mesh is None else batch_sharding(mesh, 2)


def _bucket(rows: int, group_rows: int, multiple: int) -> int:
    """`multiple` times the smallest 2^i or 3 * 2^i covering `rows`, at most `group_rows` rounded
    up to `multiple`."""
    cap = -(-group_rows // multiple) * multiple
    need = -(-rows // multiple)
    power = 2 ** math.ceil(math.log2(need))
    step = 3 * power // 4 if power >= 4 and 3 * power // 4 >= need else power
    return min(cap, multiple * step)


def plan_packing(
    attention_mask: np.ndarray, group_rows: int, mesh: Mesh | None = None
) -> tuple[np.ndarray, PackLayout]:
    """Where each sequence of each micro-batch goes in its packed buffer.

    `attention_mask` [N, T] holds consecutive micro-batches of `group_rows` rows (the last may be
    shorter). Returns the `PACK_START` array [N] int32 and the layout shared by all micro-batches:
    rows of T tokens, their count a bucket that is a multiple of the mesh's batch-shard count.
    """
    mask = np.asarray(attention_mask).astype(bool)
    if mask.ndim != 2 or group_rows <= 0:
        raise ValueError(
            f"plan_packing needs attention_mask [rows, tokens] and group_rows > 0, got shape "
            f"{mask.shape} and group_rows={group_rows}"
        )
    lengths = mask.sum(axis=1)
    width = mask.shape[1]
    starts, rows = [], 1
    for first in range(0, len(mask), group_rows):
        group_starts, group_used = first_fit(lengths[first : first + group_rows], width)
        starts.append(group_starts)
        rows = max(rows, group_used)
    layout = PackLayout(_bucket(rows, group_rows, batch_shards(mesh)), width, packed_sharding(mesh))
    return np.concatenate(starts) if starts else np.zeros(0, np.int32), layout


def with_packing(
    tensors: dict[str, np.ndarray], group_rows: int, mesh: Mesh | None, enabled: bool = True
) -> tuple[dict[str, np.ndarray], PackLayout | None]:
    """`tensors` plus their `PACK_START` plan for micro-batches of `group_rows`, and the layout;
    `tensors` unchanged and no layout when packing is not `enabled`."""
    if not enabled:
        return tensors, None
    starts, layout = plan_packing(tensors["attention_mask"], group_rows, mesh)
    return {**tensors, PACK_START: starts}, layout


def packing_plan(
    group_rows: int, mesh: Mesh | None, enabled: bool = True
) -> Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], PackLayout | None]] | None:
    """The training loop's packing step (`with_packing` for micro-batches of `group_rows`,
    applied to each epoch's rows once they are in order); None when packing is not `enabled`."""
    return functools.partial(with_packing, group_rows=group_rows, mesh=mesh) if enabled else None


def pack(
    input_ids: jax.Array,
    attention_mask: jax.Array,
    position_ids: jax.Array,
    starts: jax.Array,
    layout: PackLayout,
) -> Packed:
    """Moves the valid tokens of a padded micro-batch [B, T] to the slots `plan_packing` chose
    (`starts` [B]), keeping their order and position ids. Jittable; the layout is static."""
    batch, width = input_ids.shape
    size = layout.rows * layout.length
    valid = attention_mask.astype(jnp.bool_)
    rank = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    index = jnp.where(valid, starts[:, None].astype(jnp.int32) + rank, size)
    segments = jnp.broadcast_to(jnp.arange(1, batch + 1, dtype=jnp.int32)[:, None], (batch, width))

    def scatter(values: jax.Array) -> jax.Array:
        flat = jnp.zeros(size, values.dtype).at[index.ravel()].set(values.ravel(), mode="drop")
        flat = flat.reshape(layout.rows, layout.length)
        if layout.sharding is None:
            return flat
        return jax.lax.with_sharding_constraint(flat, layout.sharding)

    return Packed(scatter(input_ids), scatter(position_ids), scatter(segments), index)


def unpack(values: jax.Array, index: jax.Array) -> jax.Array:
    """Per-token outputs of packed rows [rows, length, ...] at the padded positions `index`
    ([B, T'] slots from `Packed.index`) -> [B, T', ...], zero at padding."""
    flat = values.reshape(-1, *values.shape[2:])
    return jnp.take(flat, index, axis=0, mode="fill", fill_value=0)


def response_window(
    forward: Callable[..., jax.Array],
    tensors: dict[str, Any],
    width: int,
    layout: PackLayout | None = None,
) -> jax.Array:
    """Per-token outputs [B, width, ...] at positions -width-1 .. -2 (those that predict the
    response tokens) of `forward(input_ids, attention_mask, position_ids, segment_ids)`.

    Without `layout` the forward runs on the padded rows; with it, on packed rows (the tensors
    then carry `PACK_START`), and the outputs at padding are zero.
    """
    ids, mask, positions = (tensors[k] for k in ("input_ids", "attention_mask", "position_ids"))
    if layout is None:
        return forward(ids, mask, positions, None)[:, -width - 1 : -1]
    packed = pack(ids, mask, positions, tensors[PACK_START], layout)
    out = forward(packed.input_ids, None, packed.position_ids, packed.segment_ids)
    return unpack(out, packed.index[:, -width - 1 : -1])
