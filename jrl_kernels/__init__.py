"""Kernels for jrl: per-token log-prob and entropy from hidden states and the LM head."""

from jrl_kernels.logprob import logprob_entropy

__all__ = ["logprob_entropy"]
