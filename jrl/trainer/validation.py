"""Validation metrics under verl's names: ``val-core/<data_source>/reward/mean@<n>``."""

from __future__ import annotations

import numpy as np


def validation_metrics(data_sources: np.ndarray, scores: np.ndarray, n: int) -> dict[str, float]:
    """Mean sequence score per data source (each prompt sampled `n` times)."""
    sources = np.asarray(data_sources).astype(str)
    scores = np.asarray(scores, dtype=np.float64)
    return {
        f"val-core/{source}/reward/mean@{n}": float(scores[sources == source].mean())
        for source in sorted(set(sources))
    }
