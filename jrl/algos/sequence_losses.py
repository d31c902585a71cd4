"""Policy losses whose ratio is a per-sequence geometric mean: GSPO and GMPO (`geo_mean`).

Both need only the tokens of one row, so they are exact under micro-batch accumulation (rows are
never split). GSPO fixes its aggregation to seq-mean-token-mean. GMPO's loss is one value per row;
`policy_loss_terms_geo_mean` spreads it evenly over the row's valid tokens and fixes the mode to
seq-mean-token-sum, so the aggregated loss is the mean of the row losses over non-empty rows
(verl's plain row mean also counts fully masked rows, as zero losses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import SEQ_MEAN_TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM, LossTerms
from jrl.algos.numerics import MEAN_EPS, masked_sum
from jrl.algos.policy_loss import (
    CLIP_BOUNDS,
    PolicyInputs,
    clip_bounds,
    register_policy_loss_terms,
    verl_policy_loss,
    weighted,
)
from jrl.algos.settings import PolicyLossSettings

GSPO_LOG_RATIO_MAX = 10.0
IS_WEIGHT_EPS = 1e-10


@register_policy_loss_terms("gspo", options=CLIP_BOUNDS)
def policy_loss_terms_gspo(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """GSPO: PPO clipping on a sequence-level ratio with per-token gradients.

    log s_i = Σ_t (logπ - logπ_old)·m / max(Σ_t m, 1); token log-ratio
    logπ - sg(logπ) + sg(log s_i), clamped ≤ 10, exp → s_it (value s_i, gradient of logπ).
    loss = max(-A·s_it, -A·clip(s_it, 1-ε_low, 1+ε_high)) × rollout_is_weights; aggregated
    seq-mean-token-mean whatever `loss_agg_mode` says. Metrics: pg_clipfrac (clipped term larger),
    ppo_kl (logπ_old - logπ), pg_clipfrac_lower (always 0).
    """
    low, high = clip_bounds(settings)
    old_log_prob, log_prob, advantages, response_mask, rollout_is_weights = inputs
    neg_kl = log_prob - old_log_prob
    lengths = jnp.maximum(jnp.sum(response_mask, axis=-1), 1)
    seq_log_ratio = masked_sum(neg_kl, response_mask, axis=-1) / lengths
    token_log_ratio = log_prob - jax.lax.stop_gradient(log_prob)
    token_log_ratio = token_log_ratio + jax.lax.stop_gradient(seq_log_ratio)[:, None]
    ratio = jnp.exp(jnp.minimum(token_log_ratio, GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - low, 1 + high)
    losses = weighted(jnp.maximum(unclipped, clipped), rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": (clipped > unclipped).astype(jnp.float32),
        "actor/ppo_kl": -neg_kl,
        "actor/pg_clipfrac_lower": jnp.zeros_like(losses),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics), SEQ_MEAN_TOKEN_MEAN)


@register_policy_loss_terms("geo_mean", options=CLIP_BOUNDS)
def policy_loss_terms_geo_mean(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """GMPO: a geometric-mean ratio per row, clipped token-wise in log space (no ±20 clamp).

    d = logπ - logπ_old, d_c = clip(d, -ε_low, ε_high), d* = sign(A)·min(sign(A)·d, sign(A)·d_c);
    ratio_i = exp(Σ d*·m / (Σ m + 1e-8)); Ā_i = Σ A·m / (Σ m + 1e-8); row loss -Ā_i·ratio_i,
    times the row's geometric-mean IS weight exp(Σ log(w + 1e-10)·m / (Σ m + 1e-8)) when
    rollout_is_weights are given. The row loss is spread evenly over the row's valid tokens
    (mode seq-mean-token-sum, see the module docstring). Metrics: pg_clipfrac (d clipped and
    A > 0), pg_clipfrac_lower (d clipped and A < 0), ppo_kl (-d).
    """
    low, high = clip_bounds(settings)
    old_log_prob, log_prob, advantages, response_mask, rollout_is_weights = inputs
    neg_kl = log_prob - old_log_prob
    neg_kl_clipped = jnp.clip(neg_kl, -low, high)
    sign = jnp.sign(advantages)
    kept = sign * jnp.minimum(sign * neg_kl, sign * neg_kl_clipped)
    lengths = jnp.sum(response_mask, axis=-1)
    ratio = jnp.exp(masked_sum(kept, response_mask, axis=-1) / (lengths + MEAN_EPS))
    mean_advantage = masked_sum(advantages, response_mask, axis=-1) / (lengths + MEAN_EPS)
    row_losses = -mean_advantage * ratio
    if rollout_is_weights is not None:
        log_weights = jnp.log(rollout_is_weights + IS_WEIGHT_EPS)
        row_losses = row_losses * jnp.exp(
            masked_sum(log_weights, response_mask, axis=-1) / (lengths + MEAN_EPS)
        )
    per_token = row_losses / jnp.where(lengths > 0, lengths, 1)
    losses = jnp.broadcast_to(per_token[:, None], log_prob.shape)
    was_clipped = neg_kl != neg_kl_clipped
    metrics = {
        "actor/pg_clipfrac": (was_clipped & (advantages > 0)).astype(jnp.float32),
        "actor/ppo_kl": -neg_kl,
        "actor/pg_clipfrac_lower": (was_clipped & (advantages < 0)).astype(jnp.float32),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics), SEQ_MEAN_TOKEN_SUM)


compute_policy_loss_gspo = verl_policy_loss("gspo", policy_loss_terms_gspo)
compute_policy_loss_geo_mean = verl_policy_loss("geo_mean", policy_loss_terms_geo_mean)
