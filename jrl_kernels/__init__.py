"""Kernels for jrl: per-token log-prob and entropy from hidden states and the LM head, without
materialising the [tokens, vocab] logits (Pallas TPU, Pallas GPU, chunked XLA, naive reference)."""

from jrl_kernels.logprob import (
    IMPLEMENTATIONS,
    logprob_entropy,
    resolve_impl,
    unavailable_reason,
)
from jrl_kernels.reference import tempered_logprob_entropy

__all__ = [
    "IMPLEMENTATIONS",
    "logprob_entropy",
    "resolve_impl",
    "tempered_logprob_entropy",
    "unavailable_reason",
]
