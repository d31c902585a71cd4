"""Per-prompt groups of responses: host-side id mapping and jit-friendly group statistics.

Rows that share a group id (the prompt's `uid`) form a group. Ids are mapped to int32 segment ids
on the host once; the statistics below then run under `jax.jit` with a fixed number of segments
(the row count), so a batch shape compiles once whatever its grouping.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def group_ids_to_segments(index: Sequence | np.ndarray) -> tuple[np.ndarray, int]:
    """Map per-row group ids (any comparable values, e.g. uid strings) to int32 ids 0..G-1.

    Returns (segment_ids, num_groups); equal ids share a segment.
    """
    ids = np.asarray(index)
    if ids.ndim != 1:
        raise ValueError(f"Group index must be one id per row (1-D), got shape {ids.shape}")
    try:
        uniques, inverse = np.unique(ids, return_inverse=True)
    except TypeError as err:
        raise ValueError(
            "Group ids must be mutually comparable values of one type (e.g. all `uid` strings)"
        ) from err
    return inverse.reshape(-1).astype(np.int32), len(uniques)


def segments_for(index: Sequence | np.ndarray | None, rows: int, estimator: str) -> np.ndarray:
    """Segment ids for `rows` rows, with errors that name the estimator."""
    if index is None:
        raise ValueError(
            f"Advantage estimator {estimator!r} needs `index`: one group id per row "
            "(the prompt's `uid`, shared by its n responses)"
        )
    segment_ids, _ = group_ids_to_segments(index)
    if len(segment_ids) != rows:
        raise ValueError(
            f"{estimator} index has {len(segment_ids)} group ids but token_level_rewards has "
            f"{rows} rows; pass one id (the prompt's `uid`) per row"
        )
    return segment_ids


def group_sum(values: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """For each row, the sum of `values` over the rows of its group."""
    rows = values.shape[0]
    return jax.ops.segment_sum(values, segment_ids, num_segments=rows)[segment_ids]


def group_max(values: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """For each row, the maximum of `values` over the rows of its group."""
    rows = values.shape[0]
    return jax.ops.segment_max(values, segment_ids, num_segments=rows)[segment_ids]


def group_mean(values: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(count, mean) of each row's group; a singleton group gets mean 0 (verl's convention)."""
    count = group_sum(jnp.ones_like(values), segment_ids)
    grouped = count > 1
    mean = jnp.where(grouped, group_sum(values, segment_ids) / count, 0.0)
    return count, mean


def group_std(
    values: jax.Array, segment_ids: jax.Array, variance_floor: float | jax.Array = 0.0
) -> jax.Array:
    """Unbiased standard deviation of each row's group (two-pass), sqrt(max(var, floor)); a
    singleton group gets 1."""
    count = group_sum(jnp.ones_like(values), segment_ids)
    grouped = count > 1
    centred = values - group_sum(values, segment_ids) / count
    sq_dev = group_sum(jnp.square(centred), segment_ids)
    variance = jnp.maximum(sq_dev / jnp.where(grouped, count - 1, 1.0), variance_floor)
    return jnp.where(grouped, jnp.sqrt(variance), 1.0)
