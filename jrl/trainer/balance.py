"""Workload-balanced row order across data-parallel shards (``trainer.balance_batch``).

Each row costs ``24576·L + L²`` (L = its attention-mask length: the linear and the attention
terms of a 4096-wide transformer, up to a constant). The Karmarkar–Karp largest-differencing
method splits the rows into `dp_size` partitions of equal row count and near-equal cost; each
partition is ordered short, longer, .., longest, .., shorter (cheap rows at both ends), and the
partitions are concatenated so that shard r receives the r-th contiguous chunk.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from jrl.batch import Batch

HIDDEN_TERM = 24576  # 6·h for h = 4096: FLOPs 12·h²·L + 2·h·L², divided by 2·h


def row_workloads(lengths: Sequence[int]) -> list[int]:
    """Relative cost of each row from its token count L: ``24576·L + L²``."""
    return [HIDDEN_TERM * int(n) + int(n) ** 2 for n in lengths]


class _Part:
    """One growing partition: its total and its (row, value) items in insertion order."""

    def __init__(self, items: list[tuple[int, int]]):
        self.items = items
        self.total = sum(value for _, value in items)

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        return self.total, len(self.items), self.items

    def absorb(self, other: _Part) -> None:
        self.items.extend(other.items)
        self.total += other.total


class _State:
    """k partitions kept in decreasing order; the heap pops the widest spread first."""

    def __init__(self, parts: list[_Part]):
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0].key() > other.parts[0].key()

    def merge(self, other: _State) -> None:
        """Pair the largest partition here with the smallest there, and so on."""
        for mine, theirs in zip(self.parts, reversed(other.parts), strict=True):
            mine.absorb(theirs)
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def karmarkar_karp(values: Sequence[int], k: int) -> list[list[int]]:
    """Row indices of `k` equal-count partitions with near-equal sums of `values`.

    Rows are taken in ascending (value, index) order, k at a time, as k singleton partitions;
    the two states with the widest spread are merged until one remains. The partitions come in
    decreasing order of their sums.
    """
    ordered = sorted((int(v), i) for i, v in enumerate(values))
    heap: list[_State] = []
    for start in range(0, len(ordered), k):
        chunk = ordered[start : start + k]
        heapq.heappush(heap, _State([_Part([(i, v)]) for v, i in chunk]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [[i for i, _ in part.items] for part in heap[0].parts]


def balanced_order(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """The row indices each data-parallel shard gets, in the order it gets them."""
    rows = len(lengths)
    if dp_size < 1 or rows < dp_size or rows % dp_size:
        raise ValueError(
            f"trainer.balance_batch: {rows} rows cannot be split into {dp_size} equal "
            "data-parallel shards; make train_batch_size * rollout.n a multiple of the "
            "number of data-parallel devices (or set trainer.balance_batch=False)"
        )
    workloads = row_workloads(lengths)
    shards = []
    for part in karmarkar_karp(workloads, dp_size):
        part = sorted(part, key=lambda i: (workloads[i], i))
        shards.append(part[::2] + part[1::2][::-1])
    return shards


def balance_metrics(
    lengths: Sequence[int], shards: Sequence[Sequence[int]], prefix: str = "global_seqlen"
) -> dict[str, float]:
    """Token totals per shard before (contiguous split) and after balancing, as verl logs them."""
    lengths = np.asarray(lengths, dtype=np.int64)
    before = lengths.reshape(len(shards), -1).sum(axis=1)
    after = np.array([lengths[list(shard)].sum() for shard in shards])
    return {
        f"{prefix}/min": float(before.min()),
        f"{prefix}/max": float(before.max()),
        f"{prefix}/minmax_diff": float(before.max() - before.min()),
        f"{prefix}/balanced_min": float(after.min()),
        f"{prefix}/balanced_max": float(after.max()),
        f"{prefix}/mean": float(lengths.sum() / len(shards)),
    }


def balance_batch(batch: Batch, dp_size: int) -> tuple[Batch, dict[str, float]]:
    """`batch` reordered so each of `dp_size` contiguous chunks carries a similar workload,
    plus the ``global_seqlen/*`` metrics. Rows (tensors and meta) move as a whole."""
    if "attention_mask" not in batch.tensors:
        raise ValueError("trainer.balance_batch needs `attention_mask` in the batch tensors")
    mask = np.asarray(batch.tensors["attention_mask"])
    lengths = mask.reshape(mask.shape[0], -1).sum(axis=1).tolist()
    shards = balanced_order(lengths, dp_size)
    order = np.array([i for shard in shards for i in shard], dtype=np.int64)
    return batch.reorder(order), balance_metrics(lengths, shards)
