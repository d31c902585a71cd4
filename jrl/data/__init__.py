"""Data: tokenizers, parquet prompt datasets, the resumable loader (verl's row orders) and
dataset preprocessors.

Names are imported on first use, so that `python -m jrl.data.gsm8k` (or `jrl.data.math`) starts
without JAX or transformers.
"""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "DataLoader": "jrl.data.loader",
        "collate": "jrl.data.loader",
        "RLDataset": "jrl.data.rl_dataset",
        "create_rl_dataset": "jrl.data.rl_dataset",
        "load_tokenizer": "jrl.data.tokenizer",
        "train_tiny_tokenizer": "jrl.data.tokenizer",
    },
)
