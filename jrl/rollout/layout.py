"""Host-side shaping of a generate call: prompt-length buckets and the split of rows over
data-parallel replicas, both in a few fixed sizes so that few shapes are ever compiled."""

from __future__ import annotations

import dataclasses

import numpy as np

from jrl.rollout.limits import ceil_pow2


def prompt_bucket(longest: int, width: int) -> int:
    """The prompt width a batch runs at: the next power of two >= `longest`, at most `width`.

    Left-padded prompts keep all their tokens when cut to their last `bucket` columns.
    """
    return min(width, ceil_pow2(max(longest, 1)))


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where each row goes: replica r holds slots r*per_replica .. (r+1)*per_replica - 1.

    `source[j]` is the row in slot j (row 0 again in a padding slot), `real[j]` whether slot j
    holds a row, and `counts[r]` how many rows replica r holds (its first slots).
    """

    source: np.ndarray
    real: np.ndarray
    counts: np.ndarray

    @property
    def per_replica(self) -> int:
        """Row slots per replica (a power of two)."""
        return len(self.source) // len(self.counts)


def row_layout(rows: int, replicas: int) -> RowLayout:
    """Spread `rows` rows over `replicas` in order and as evenly as possible (counts differ by at
    most one), each replica padded to the same power-of-two size."""
    counts = np.full(replicas, rows // replicas) + (np.arange(replicas) < rows % replicas)
    per_replica = ceil_pow2(int(counts.max()))
    lane = np.arange(per_replica)[None, :]
    real = lane < counts[:, None]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    source = np.where(real, starts[:, None] + lane, 0)
    return RowLayout(source.reshape(-1), real.reshape(-1), counts.astype(np.int32))
