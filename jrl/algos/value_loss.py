"""Clipped value (critic) loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import LossTerms, reduce_loss_terms

VF_CLIPFRAC = "critic/vf_clipfrac"


def value_loss_terms(
    vpreds: jax.Array, returns: jax.Array, values: jax.Array, cliprange_value: float
) -> LossTerms:
    """Per-token critic loss 0.5·max((v-R)², (v_clip-R)²), v_clip = clip(v, V_old ± cliprange).

    The metric `critic/vf_clipfrac` marks tokens where the clipped error is the larger one.
    """
    vpred_clipped = jnp.clip(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = jnp.square(vpreds - returns)
    clipped = jnp.square(vpred_clipped - returns)
    clipfrac = jax.lax.stop_gradient((clipped > unclipped).astype(jnp.float32))
    return LossTerms(0.5 * jnp.maximum(unclipped, clipped), {VF_CLIPFRAC: clipfrac})


def compute_value_loss(
    vpreds: jax.Array,
    returns: jax.Array,
    values: jax.Array,
    response_mask: jax.Array,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(vf_loss, vf_clipfrac) over one batch: 0.5·agg_loss of the clipped squared error, and the
    masked mean of the clip indicator."""
    terms = value_loss_terms(vpreds, returns, values, cliprange_value)
    loss, metrics = reduce_loss_terms(terms, response_mask, loss_agg_mode, loss_scale_factor)
    return loss, metrics[VF_CLIPFRAC]
