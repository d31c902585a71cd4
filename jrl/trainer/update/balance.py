"""Workload-balanced row order across data-parallel shards (``trainer.balance_batch``).

Each row costs ``24576·L + L²`` (L = its attention-mask length: the linear and the attention
terms of a 4096-wide transformer, up to a constant). The Karmarkar–Karp largest-differencing
method splits the rows into `dp_size` partitions of equal row count and near-equal cost; each
partition is ordered short, longer, .., longest, .., shorter (cheap rows at both ends), and the
partitions are concatenated so that shard r receives the r-th contiguous chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jrl.batch import Batch
from jrl.trainer.update.partition import karmarkar_karp, workload


def balanced_order(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """The row indices each data-parallel shard gets, in the order it gets them."""
    rows = len(lengths)
    if dp_size < 1 or rows < dp_size or rows % dp_size:
        raise ValueError(
            f"trainer.balance_batch: {rows} rows cannot be split into {dp_size} equal "
            "data-parallel shards; make train_batch_size * rollout.n a multiple of the "
            "number of data-parallel devices (or set trainer.balance_batch=False)"
        )
    workloads = workload(lengths).tolist()
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
    order, metrics = balance_order(batch, dp_size)
    return batch.reorder(order), metrics


def balance_order(batch: Batch, dp_size: int) -> tuple[np.ndarray, dict[str, float]]:
    """The row order of `balance_batch` (row ``order[i]`` goes to position i) and its metrics,
    for columns kept beside the batch that must move with its rows."""
    if "attention_mask" not in batch.tensors:
        raise ValueError("trainer.balance_batch needs `attention_mask` in the batch tensors")
    mask = np.asarray(batch.tensors["attention_mask"])
    lengths = mask.reshape(mask.shape[0], -1).sum(axis=1).tolist()
    shards = balanced_order(lengths, dp_size)
    order = np.array([i for shard in shards for i in shard], dtype=np.int64)
    return order, balance_metrics(lengths, shards)
