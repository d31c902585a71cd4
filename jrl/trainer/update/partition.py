"""Karmarkar–Karp partitioning of rows by verl's workload estimate (``24576·L + L²``), shared by
batch balancing and dynamic micro-batching."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

HIDDEN_TERM = 24576  # 6·h for h = 4096: FLOPs 12·h²·L + 2·h·L², divided by 2·h


def workload(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Relative cost (int64) of each row from its token count L: ``24576·L + L²``."""
    lengths = np.asarray(lengths, np.int64)
    return HIDDEN_TERM * lengths + lengths * lengths


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


def karmarkar_karp(values: Sequence[int], k: int, equal_size: bool = True) -> list[list[int]]:
    """Row indices of `k` partitions with near-equal sums of `values` (largest differencing).

    Rows are taken in ascending (value, index) order: with `equal_size`, k at a time as k
    singleton partitions (so every partition gets the same number of rows); otherwise one at a
    time, each with k - 1 empty partitions (partitions may then be empty). The two states with
    the widest spread are merged until one remains. Partitions come in decreasing order of sums.
    """
    if k < 1:
        raise ValueError(f"karmarkar_karp needs k >= 1 partitions, got {k}")
    ordered = sorted((int(v), i) for i, v in enumerate(values))
    heap: list[_State] = []
    step = k if equal_size else 1
    for start in range(0, len(ordered), step):
        chunk = [_Part([(i, v)]) for v, i in ordered[start : start + step]]
        heapq.heappush(heap, _State(chunk + [_Part([]) for _ in range(k - len(chunk))]))
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return [[i for i, _ in part.items] for part in heap[0].parts]
