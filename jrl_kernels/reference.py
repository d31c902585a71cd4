"""The naive implementation: materialises the [tokens, vocab] logits (the reference). The sampler
uses the same math on the logits it has already computed for sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl_kernels.tiles import tempered


def tempered_logprob_entropy(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy of softmax over the last axis of `logits` [..., V] (already
    soft-capped and divided by the temperature), in float32; `targets` is shaped like
    ``logits.shape[:-1]``."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    index = targets[..., None].astype(jnp.int32)
    picked = jnp.take_along_axis(log_probs, index, axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return picked, entropy


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
    return tempered_logprob_entropy(logits, targets)
