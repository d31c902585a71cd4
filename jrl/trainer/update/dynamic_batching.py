"""Micro-batches by token budget (verl's ``use_dynamic_bsz``).

Each device takes a consecutive share of the rows. A device's share is split into as many
micro-batches as its valid tokens need at ``max_token_len`` per micro-batch (at most one per row),
the largest such count over devices is used on every device, and rows are assigned to micro
batches by the Karmarkar-Karp largest-differencing partition of their workload. While a micro
batch holds more than the budget (or, packed, does not fit its rows, or has more rows than its
shape allows) the count grows by one.

Shapes stay few. For the update, the scan runs over a power-of-two number of micro-batches (the
extra ones are empty, so they add nothing: losses are divided by the mini-batch's global
normaliser, and they are skipped) and each micro-batch holds, per device, twice the mean share of
rows rounded to a power of two: one shape per scan length. Forward-only passes loop over the micro
batches, each holding a power-of-two number of rows per device. Unused rows are empty (all masks
zero). Packed (``use_remove_padding``), each device's share of a micro-batch goes into a fixed
buffer of ``max_token_len // length`` rows of the padded length, whatever the data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jrl.parallel import host_array, shard_batch
from jrl.trainer.update.packing import (
    PACK_START,
    PackLayout,
    batch_shards,
    first_fit,
    packed_sharding,
)
from jrl.trainer.update.partition import karmarkar_karp, workload


@dataclasses.dataclass(frozen=True)
class TokenBudget:
    """At most `max_tokens` valid tokens per device in one micro-batch; `key` names the config
    key that sets it (for errors); `packed` packs each device's share into rows of the padded
    length (``use_remove_padding``)."""

    max_tokens: int
    key: str
    packed: bool = False


@dataclasses.dataclass(frozen=True)
class MicroPlan:
    """Where the rows of a batch go.

    rows: [slots, shards * per_device] source row (of `total`) of every micro-batch slot, -1 when
    empty; the first `count` micro-batches hold rows, the rest are empty. layout: the packed
    buffer of one micro-batch, None when not packed. starts: the `PACK_START` of every slot when
    packed.
    """

    rows: np.ndarray
    count: int
    total: int
    layout: PackLayout | None = None
    starts: np.ndarray | None = None

    def gather(self, tensors: dict[str, np.ndarray], micro: int | None = None) -> dict[str, Any]:
        """The rows of micro-batch `micro` ([shards * per_device, ...]), or of all of them
        ([slots, shards * per_device, ...]); empty slots are zero."""
        index = self.rows if micro is None else self.rows[micro]
        empty = index < 0
        out = {}
        for key, value in tensors.items():
            picked = value[np.maximum(index, 0)]
            picked[empty] = 0
            out[key] = picked
        if self.starts is not None:
            out[PACK_START] = self.starts if micro is None else self.starts[micro]
        return out

    def restore(self, outputs: Sequence[Any]) -> Any:
        """Per-row outputs of the first micro-batches (one pytree of [shards * per_device, ...]
        arrays each), back in the original row order: a pytree of [total, ...] arrays."""

        def put(*parts: np.ndarray) -> np.ndarray:
            out = np.zeros((self.total, *parts[0].shape[1:]), parts[0].dtype)
            for index, part in zip(self.rows, parts, strict=False):
                out[index[index >= 0]] = part[index >= 0]
            return out

        return jax.tree.map(put, *outputs)


def power_of_two_bucket(n: int, cap: int) -> int:
    """The smallest power of two >= `n`, at most `cap`."""
    return min(cap, 1 << max(n - 1, 0).bit_length())


def _partition(lengths: np.ndarray, parts: int) -> list[np.ndarray]:
    """Row positions of one device's share in `parts` micro-batches (fewer if it has fewer
    rows), heaviest first."""
    if not len(lengths):
        return []
    groups = karmarkar_karp(workload(lengths), min(parts, len(lengths)), equal_size=False)
    groups = [np.asarray(sorted(g), np.int64) for g in groups if g]
    return sorted(groups, key=lambda g: -int(workload(lengths[g]).sum()))


def _slot_rows(count: int, per_device: int) -> int:
    """Rows per device of every micro-batch of a padded scan over `count` micro-batches: twice
    the mean share, as a power of two, so that the scan's shape depends on its length only."""
    slots = power_of_two_bucket(count, per_device)
    return power_of_two_bucket(2 * math.ceil(per_device / slots), per_device)


def _pack_rows(budget: TokenBudget, width: int, per_device: int) -> int:
    """Packed rows per device: as many rows of `width` as the budget holds (at most one per row
    of the share, the most a micro-batch can use)."""
    return min(budget.max_tokens // width, per_device)


def _fits(
    lengths: np.ndarray, budget: TokenBudget, width: int, pack_rows: int, max_rows: int
) -> bool:
    if len(lengths) > max_rows or lengths.sum() > budget.max_tokens:
        return False
    return not budget.packed or first_fit(lengths, width)[1] <= pack_rows


def _assign(
    lengths: np.ndarray,
    shares: list[np.ndarray],
    budget: TokenBudget,
    width: int,
    pad_count: bool,
) -> tuple[list[list[np.ndarray]], int]:
    """Rows of every device's share per micro-batch, and the micro-batch count they were planned
    for (verl's count, raised until every micro-batch fits)."""
    per_device = max(len(share) for share in shares)
    pack_rows = _pack_rows(budget, width, per_device)
    count = max(
        1,
        *(min(len(share), math.ceil(lengths[share].sum() / budget.max_tokens)) for share in shares),
    )
    while True:
        max_rows = _slot_rows(count, per_device) if pad_count else per_device
        groups = [[share[g] for g in _partition(lengths[share], count)] for share in shares]
        parts = [lengths[g] for share in groups for g in share]
        if all(_fits(part, budget, width, pack_rows, max_rows) for part in parts):
            return groups, count
        count += 1


def plan_micro_batches(
    attention_mask: np.ndarray, budget: TokenBudget, mesh: Mesh | None, pad_count: bool = False
) -> MicroPlan:
    """Micro-batches of the rows of `attention_mask` [B, T] under `budget` per device of `mesh`;
    with `pad_count` (a scan) the number of micro-batches is rounded up to a power of two and
    their row count follows from it."""
    mask = np.asarray(attention_mask).astype(bool)
    total, width = mask.shape
    if width > budget.max_tokens:
        raise ValueError(
            f"{budget.key}={budget.max_tokens} is below the padded sequence length {width}; "
            f"raise it to at least {width} (data.max_prompt_length + data.max_response_length)"
        )
    if total == 0:
        raise ValueError("cannot plan micro-batches of an empty batch")
    lengths = mask.sum(axis=1)
    shards = batch_shards(mesh)
    shares = np.array_split(np.arange(total), shards)
    per_device = max(len(share) for share in shares)
    groups, count = _assign(lengths, shares, budget, width, pad_count)
    used = max(len(share) for share in groups)
    if pad_count:
        slots, slot_rows = power_of_two_bucket(count, per_device), _slot_rows(count, per_device)
    else:
        largest = max(len(g) for share in groups for g in share)
        slots, slot_rows = used, power_of_two_bucket(largest, per_device)
    rows = np.full((slots, shards * slot_rows), -1, np.int64)
    for device, share in enumerate(groups):
        for micro, group in enumerate(share):
            rows[micro, device * slot_rows : device * slot_rows + len(group)] = group
    if not budget.packed:
        return MicroPlan(rows, used, total)
    pack_rows = _pack_rows(budget, width, per_device)
    starts = np.zeros(rows.shape, np.int32)
    for micro, device in np.ndindex(slots, shards):
        slot = slice(device * slot_rows, (device + 1) * slot_rows)
        index = rows[micro, slot]
        slot_starts = first_fit(lengths[index[index >= 0]], width)[0]
        starts[micro, slot][: len(slot_starts)] = slot_starts + device * pack_rows * width
    layout = PackLayout(shards * pack_rows, width, packed_sharding(mesh))
    return MicroPlan(rows, used, total, layout, starts)


def token_minibatches(
    tensors: dict[str, np.ndarray], mini_rows: int, budget: TokenBudget, mesh: Mesh | None
) -> Iterator[tuple[dict[str, np.ndarray], PackLayout | None]]:
    """Consecutive mini-batches of `mini_rows`, each laid out as ``[slots, rows, ...]`` micro
    batches under `budget`, with their packed layout (None when not packed)."""
    total = next(iter(tensors.values())).shape[0]
    if total % mini_rows:
        raise ValueError(
            f"{total} rows do not split into mini-batches of {mini_rows}; check "
            "ppo_mini_batch_size against data.train_batch_size"
        )
    for start in range(0, total, mini_rows):
        mini = {k: v[start : start + mini_rows] for k, v in tensors.items()}
        plan = plan_micro_batches(mini["attention_mask"], budget, mesh, pad_count=True)
        yield plan.gather(mini), plan.layout


def budget_forward(
    fn: Callable[[dict[str, jax.Array], PackLayout | None], Any],
    tensors: dict[str, np.ndarray],
    budget: TokenBudget,
    mesh: Mesh,
) -> Any:
    """Run the jitted ``fn(micro_batch, layout)`` over micro-batches under `budget` and return
    its per-row outputs in the original row order."""
    plan = plan_micro_batches(tensors["attention_mask"], budget, mesh)
    outputs = [
        jax.tree.map(host_array, fn(shard_batch(plan.gather(tensors, micro), mesh), plan.layout))
        for micro in range(plan.count)
    ]
    return plan.restore(outputs)
