"""Per-token log-probabilities and entropy from logits, in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import agg_loss


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) over the last axis: logsumexp(z) - Σ softmax(z)·z."""
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(probs * logits, axis=-1)


def logprobs_from_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """log softmax(logits)[label] over the last axis; `labels` has the shape of logits[..., 0]."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def compute_entropy_loss(
    logits: jax.Array, response_mask: jax.Array, loss_agg_mode: str = "token-mean"
) -> jax.Array:
    """Token entropy of [B, R, V] logits aggregated with `loss_agg_mode`."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
