"""Which weights sampled each token: ``rollout_token_versions`` [rows, R] (the policy's version,
-1 on padding), and what they say about a batch's staleness."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

VERSIONS = "rollout_token_versions"


def version_metrics(versions: np.ndarray, trainer_version: int) -> dict[str, float]:
    """verl's off-policy figures of rows whose tokens carry `versions` ([rows, R], -1: pad):
    a row's staleness is the trainer's version minus the oldest version that sampled it, its
    span the number of versions it was sampled with. Rows without a sampled token are left
    out (none: no figures)."""
    versions = versions[(versions >= 0).any(-1)]
    if not len(versions):
        return {}
    real = versions >= 0
    oldest = np.where(real, versions, np.iinfo(np.int32).max).min(-1)
    newest = np.where(real, versions, -1).max(-1)
    lag = trainer_version - oldest
    return {
        "training/staleness_mean": float(lag.mean()),
        "training/staleness_max": float(lag.max()),
        "training/stale_rows": float((lag > 0).sum()),
        "training/partial_rows": float((newest > oldest).sum()),
        "training/version_span_max": float((newest - oldest + 1).max()),
    }


def token_versions(mask: np.ndarray, versions: Sequence[Sequence[int]]) -> np.ndarray:
    """[rows, R] versions of the sampled tokens, -1 elsewhere: row i's `versions`, in order, on
    its positions where `mask` is 1 (the model's tokens; an agent row's tool and user turns
    between them are 0)."""
    out = np.full(mask.shape, -1, np.int32)
    for i, row in enumerate(versions):
        places = np.flatnonzero(mask[i])[: len(row)]
        out[i, places] = row[: len(places)]
    return out
