"""Test set-up: 8 simulated CPU devices (before JAX is imported) and a per-session asset cache;
shared fixtures."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def train_tokenizer(tmp_path_factory):
    """`train(texts, vocab_size)`: a tiny byte-level BPE tokenizer (ChatML template) trained on
    `texts`, saved in a fresh temporary folder."""
    from jrl.data import train_tiny_tokenizer

    def train(texts, vocab_size: int):
        folder = tmp_path_factory.mktemp("tok") / "tiny"
        return train_tiny_tokenizer(texts, folder, vocab_size=vocab_size)

    return train
