"""Kernels for jrl: per-token log-prob and entropy without materialising [tokens, vocab] logits."""
