"""Packed sequences (verl's ``use_remove_padding``).

The valid tokens of each micro-batch are laid out back to back in a fixed ``[rows, length]``
buffer, so the model spends no compute or memory on padding. The host plans where each sequence
goes (`plan_packing`: first-fit decreasing into rows as long as the padded rows, never splitting a
sequence); the jitted step moves the tokens there (`pack`), runs the model with segment ids, and
gathers per-token outputs back to the padded layout (`unpack`). The row count is rounded up to a
bucket (the batch-shard count times 1, 2, 3, 4, 6, 8, 12, ..., at most the micro-batch) so that
few shapes are ever compiled.

With `share_prompts` (GRPO's n answers per prompt), the rows of a micro-batch whose prompts are
the same tokens form a group: the prompt is laid out once, followed by each answer's response
tokens. Segment ids mark the group and branch ids the answer (0 for the shared prompt); a token
attends the earlier tokens of its group that are the prompt or its own answer, so every
response token sees exactly what it sees in its own padded row, and the prompt's compute is paid
once per group instead of once per answer. Shared rows are `T + (g - 1) * R` long (T the padded
width, R the response width, g the largest group), so a group always fits one row; the batch
keeps plain packing when that is estimated cheaper (`layout_cost`: long rows make the dense
attention cost more than the prompt tokens it saves).
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

from jrl.models.moe import ROUTE_NONE, ROUTED_EXPERTS
from jrl.parallel import batch_axes, batch_sharding

# The batch tensor holding, per sequence, the slot in its micro-batch's flat packed buffer of its
# first token laid out (its first response token when it shares its group's prompt).
PACK_START = "pack_start"
# With shared prompts: per sequence, the first slot of its group, and how many of its leading
# valid tokens (the prompt) the whole group sees.
PACK_SOURCE = "pack_source"
PACK_SHARED = "pack_shared"


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """The static shape of a packed micro-batch: `rows` rows of `length` tokens, placed with
    `sharding` (rows split over the batch axes) when one is given; with `shared_prompts` the
    answers of one prompt share its tokens (branch ids, see the module docstring)."""

    rows: int
    length: int
    sharding: NamedSharding | None = None
    shared_prompts: bool = False


class Packed(NamedTuple):
    """A packed micro-batch.

    input_ids, position_ids, segment_ids: [rows, length]; padding is segment 0, every other
    sequence (or group sharing a prompt) has a segment of its own. index: [B, T], the flat slot
    (row * length + column) of every token of the padded batch, rows * length for padding.
    branch_ids: [rows, length] with shared prompts (0 for a prompt, b + 1 for the answer of batch
    row b), else None. routes: [rows, length, sparse layers, k], the batch's `ROUTED_EXPERTS`
    moved with their tokens (`ROUTE_NONE` at padding), None where it has none.
    """

    input_ids: jax.Array
    position_ids: jax.Array
    segment_ids: jax.Array
    index: jax.Array
    branch_ids: jax.Array | None = None
    routes: jax.Array | None = None


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


def prompt_groups(
    input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, prompt_width: int
) -> list[list[int]]:
    """The rows of a micro-batch grouped by prompt: rows whose first `prompt_width` columns hold
    the same valid tokens at the same positions share a group (first-seen order)."""
    by_prompt: dict[bytes, list[int]] = {}
    for row, (ids, valid, positions) in enumerate(
        zip(input_ids, attention_mask.astype(bool), position_ids, strict=True)
    ):
        prompt = valid[:prompt_width]
        key = ids[:prompt_width][prompt].tobytes() + positions[:prompt_width][prompt].tobytes()
        by_prompt.setdefault(key, []).append(row)
    return list(by_prompt.values())


# The row length at which a dense attention's cost per token equals that of the rest of a
# decoder layer: about 6 x hidden_size (attention 4 * L * D FLOPs per token against about 24 * D^2
# for the projections and MLP), 3.5k tokens at D = 576 and 21k at D = 3584; the smaller figure,
# so that long shared rows are avoided for every model size.
ATTENTION_BREAK_EVEN = 4096


def layout_cost(layout: PackLayout) -> float:
    """The estimated compute of a forward over `layout`, in token-slots of the layers'
    projections and MLP: rows * length * (1 + length / `ATTENTION_BREAK_EVEN`)."""
    return layout.rows * layout.length * (1 + layout.length / ATTENTION_BREAK_EVEN)


def plan_shared_packing(
    tensors: dict[str, np.ndarray], group_rows: int, mesh: Mesh | None = None
) -> tuple[dict[str, np.ndarray], PackLayout]:
    """`plan_packing` with the answers of one prompt sharing it (module docstring): the
    `PACK_START`, `PACK_SOURCE` and `PACK_SHARED` arrays [N] int32 of consecutive micro-batches
    of `group_rows` rows, and their layout (first-fit decreasing of whole groups)."""
    mask = np.asarray(tensors["attention_mask"]).astype(bool)
    ids, positions = np.asarray(tensors["input_ids"]), np.asarray(tensors["position_ids"])
    width = mask.shape[1]
    prompt_width = width - tensors["responses"].shape[1]
    prompt_len = mask[:, :prompt_width].sum(axis=1)
    response_len = mask[:, prompt_width:].sum(axis=1)
    micro = [
        [[first + row for row in group] for group in prompt_groups(
            ids[first : first + group_rows],
            mask[first : first + group_rows],
            positions[first : first + group_rows],
            prompt_width,
        )]
        for first in range(0, len(mask), group_rows)
    ]  # fmt: skip
    largest = max((len(group) for groups in micro for group in groups), default=1)
    length = width + (largest - 1) * (width - prompt_width)
    plan = {key: np.zeros(len(mask), np.int32) for key in (PACK_START, PACK_SOURCE, PACK_SHARED)}
    rows = 1
    for groups in micro:
        sizes = np.array([prompt_len[g[0]] + response_len[g].sum() for g in groups], np.int64)
        starts, used = first_fit(sizes, length)
        rows = max(rows, used)
        for group, slot in zip(groups, starts, strict=True):
            plan[PACK_SOURCE][group] = slot
            plan[PACK_SHARED][group] = prompt_len[group[0]]
            ends = slot + prompt_len[group[0]] + np.cumsum(response_len[group])
            plan[PACK_START][group] = np.concatenate([[slot], ends[:-1]])
    layout = PackLayout(
        _bucket(rows, group_rows, batch_shards(mesh)), length, packed_sharding(mesh), True
    )
    return plan, layout


def with_packing(
    tensors: dict[str, np.ndarray],
    group_rows: int,
    mesh: Mesh | None,
    enabled: bool = True,
    share_prompts: bool = False,
) -> tuple[dict[str, np.ndarray], PackLayout | None]:
    """`tensors` plus their packing plan for micro-batches of `group_rows` (prompts shared by
    their answers with `share_prompts` where `layout_cost` finds it cheaper), and the layout;
    `tensors` unchanged and no layout when packing is not `enabled`."""
    if not enabled:
        return tensors, None
    starts, layout = plan_packing(tensors["attention_mask"], group_rows, mesh)
    if share_prompts:
        shared_plan, shared = plan_shared_packing(tensors, group_rows, mesh)
        if layout_cost(shared) < layout_cost(layout):
            return {**tensors, **shared_plan}, shared
    return {**tensors, PACK_START: starts}, layout


def packing_plan(
    group_rows: int, mesh: Mesh | None, enabled: bool = True, share_prompts: bool = False
) -> Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], PackLayout | None]] | None:
    """The training loop's packing step (`with_packing` for micro-batches of `group_rows`,
    applied to each epoch's rows once they are in order); None when packing is not `enabled`."""
    if not enabled:
        return None
    return functools.partial(
        with_packing, group_rows=group_rows, mesh=mesh, share_prompts=share_prompts
    )


def pack(tensors: dict[str, jax.Array], layout: PackLayout) -> Packed:
    """Moves the valid tokens of a padded micro-batch [B, T] (``input_ids``, ``attention_mask``,
    ``position_ids``, and `ROUTED_EXPERTS` [B, T, ...] where given) to the slots its plan chose
    (`PACK_START`, with shared prompts also `PACK_SOURCE` and `PACK_SHARED`), keeping their order
    and position ids. Jittable; the layout is static."""
    ids, mask, positions = (tensors[k] for k in ("input_ids", "attention_mask", "position_ids"))
    batch, width = ids.shape
    size = layout.rows * layout.length
    valid = mask.astype(jnp.bool_)
    rank = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    start = tensors[PACK_START][:, None].astype(jnp.int32)
    row = jnp.broadcast_to(jnp.arange(1, batch + 1, dtype=jnp.int32)[:, None], (batch, width))
    branches = None
    if layout.shared_prompts:
        source = tensors[PACK_SOURCE][:, None].astype(jnp.int32)
        shared = tensors[PACK_SHARED][:, None].astype(jnp.int32)
        follower, prompt = start != source, rank < shared
        borrowed = follower & prompt  # the group's one copy of the prompt holds these tokens
        slot = jnp.where(borrowed, source + rank, start + rank - jnp.where(follower, shared, 0))
        segments = jnp.broadcast_to(source + 1, (batch, width))
        branches = jnp.where(prompt, 0, row)
        written = valid & ~borrowed
    else:
        slot, segments, written = start + rank, row, valid
    index = jnp.where(valid, slot, size)
    targets = jnp.where(written, slot, size).ravel()

    def scatter(values: jax.Array, fill: int = 0) -> jax.Array:
        rest = values.shape[2:]
        flat = jnp.full((size, *rest), fill, values.dtype)
        flat = flat.at[targets].set(values.reshape(-1, *rest), mode="drop")
        flat = flat.reshape(layout.rows, layout.length, *rest)
        if layout.sharding is None:
            return flat
        spec = jax.sharding.PartitionSpec(*layout.sharding.spec, *(None,) * len(rest))
        return jax.lax.with_sharding_constraint(flat, NamedSharding(layout.sharding.mesh, spec))

    routes = tensors.get(ROUTED_EXPERTS)
    return Packed(
        scatter(ids),
        scatter(positions),
        scatter(segments),
        index,
        None if branches is None else scatter(branches),
        None if routes is None else scatter(routes, ROUTE_NONE),
    )


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
    response tokens) of `forward(input_ids, attention_mask, position_ids, segment_ids,
    branch_ids)`.

    Without `layout` the forward runs on the padded rows; with it, on packed rows (the tensors
    then carry their packing plan), and the outputs at padding are zero.
    """

    def unrouted(*inputs: Any, replay: Any = None) -> tuple[jax.Array, None]:
        return forward(*inputs), None

    return routed_window(unrouted, tensors, width, layout)[0]


def routed_window(
    forward: Callable[..., tuple[jax.Array, jax.Array | None]],
    tensors: dict[str, Any],
    width: int,
    layout: PackLayout | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """`response_window` of a forward that also returns the experts each token used
    (`CausalLM.routed_hidden`, given the batch's `ROUTED_EXPERTS` to replay where it has them),
    and those experts at every padded position [B, T, sparse layers, k] (None for a dense
    model; 0 at padding when packed)."""
    replay = tensors.get(ROUTED_EXPERTS)
    if layout is None:
        padded = (tensors[k] for k in ("input_ids", "attention_mask", "position_ids"))
        out, routes = forward(*padded, None, None, replay=replay)
        return out[:, -width - 1 : -1], routes
    packed = pack(tensors, layout)
    out, routes = forward(
        packed.input_ids,
        None,
        packed.position_ids,
        packed.segment_ids,
        packed.branch_ids,
        replay=packed.routes,
    )
    window = unpack(out, packed.index[:, -width - 1 : -1])
    return window, None if routes is None else unpack(routes, packed.index)
