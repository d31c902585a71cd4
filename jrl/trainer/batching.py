"""Host-side batching: padding rows to a multiple, forward chunks and PPO mini/micro-batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jrl.parallel import shard_batch


def pad_rows(tensors: dict[str, np.ndarray], multiple: int) -> tuple[dict[str, np.ndarray], int]:
    """Append all-zero rows so the row count divides `multiple`; returns (padded, original rows)."""
    rows = next(iter(tensors.values())).shape[0]
    extra = -rows % multiple
    if not extra:
        return tensors, rows
    padded = {
        k: np.concatenate([v, np.zeros((extra, *v.shape[1:]), v.dtype)]) for k, v in tensors.items()
    }
    return padded, rows


def chunked_forward(
    fn: Callable[[dict[str, jax.Array]], Any],
    tensors: dict[str, np.ndarray],
    chunk_rows: int,
    mesh: Mesh,
) -> Any:
    """Run the jitted `fn` over row chunks of `chunk_rows` (the last one padded) and concatenate."""
    padded, rows = pad_rows(tensors, chunk_rows)
    total = next(iter(padded.values())).shape[0]
    outputs = []
    for start in range(0, total, chunk_rows):
        chunk = {k: v[start : start + chunk_rows] for k, v in padded.items()}
        outputs.append(jax.device_get(fn(shard_batch(chunk, mesh))))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:rows], *outputs)


def minibatches(
    tensors: dict[str, np.ndarray], mini_rows: int, micro_rows: int
) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive mini-batches of `mini_rows`, each reshaped to ``[mini_rows // micro_rows,
    micro_rows, ...]`` for gradient accumulation (verl splits without shuffling)."""
    total = next(iter(tensors.values())).shape[0]
    if total % mini_rows or mini_rows % micro_rows:
        raise ValueError(
            f"{total} rows do not split into mini-batches of {mini_rows} and micro-batches of "
            f"{micro_rows}; check ppo_mini_batch_size and ppo_micro_batch_size_per_gpu"
        )
    for start in range(0, total, mini_rows):
        yield {
            k: v[start : start + mini_rows].reshape(
                mini_rows // micro_rows, micro_rows, *v.shape[1:]
            )
            for k, v in tensors.items()
        }
