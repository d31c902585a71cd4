"""The naive implementation: materialises the [tokens, vocab] logits (the reference)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl_kernels.tiles import tempered


def naive_logprob_entropy(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array | float,
    softcap: float | None,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy of hidden [N, D] @ lm_head [D, V] (float32 logits, plain
    autodiff)."""
    z = jnp.dot(hidden, lm_head.astype(hidden.dtype), preferred_element_type=jnp.float32)
    logits, _ = tempered(z, temperature, softcap)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[:, None].astype(jnp.int32), axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return picked, entropy
