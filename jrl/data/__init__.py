"""Data: tokenizers, parquet prompt datasets, the Grain loader and dataset preprocessors.

Names are imported on first use, so that `python -m jrl.data.gsm8k` (or `jrl.data.math`) starts
without JAX or transformers.
"""

import importlib
from typing import Any

_EXPORTS = {
    "DataLoader": "jrl.data.loader",
    "collate": "jrl.data.loader",
    "RLDataset": "jrl.data.rl_dataset",
    "create_rl_dataset": "jrl.data.rl_dataset",
    "load_tokenizer": "jrl.data.tokenizer",
    "train_tiny_tokenizer": "jrl.data.tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jrl.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
