"""Clip-Cov and KL-Cov: PPO variants that act on the tokens whose advantage and log-probability
covary most (entropy-collapse control).

Both pick tokens from batch statistics: the means of A and logπ over the valid tokens, and a token
count k = max(⌊N·ratio⌋, 1) with N valid tokens. These are computed over the batch the loss is
called on, so under gradient accumulation they are per micro-batch (as in verl's legacy worker);
the per-token losses they return then aggregate exactly. ⌊N·ratio⌋ is taken in float32 after a
1e-6 relative nudge, so exact multiples are not lost to rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import LossTerms
from jrl.algos.numerics import masked_sum, safe_divide
from jrl.algos.policy_loss import (
    CLIP_BOUNDS,
    PolicyInputs,
    clip_bounds,
    register_policy_loss_terms,
    verl_policy_loss,
    weighted,
)
from jrl.algos.settings import PolicyLossSettings

CLIP_COV_SEED = 0
COUNT_NUDGE = 1e-6


def fraction_count(num_valid: jax.Array, fraction: float) -> jax.Array:
    """max(⌊num_valid·fraction⌋, 1) as an int32 scalar."""
    product = num_valid.astype(jnp.float32) * fraction
    return jnp.maximum(jnp.floor(product * (1 + COUNT_NUDGE)), 1).astype(jnp.int32)


def top_k_mask(scores: jax.Array, eligible: jax.Array, k: jax.Array) -> jax.Array:
    """True at the k eligible entries with the highest scores (fewer if fewer are eligible).

    Ties go to the earlier entry in row-major order; k may be traced.
    """
    flat = jnp.where(eligible, scores, -jnp.inf).ravel()
    order = jnp.argsort(flat, descending=True, stable=True)
    ranks = jnp.zeros_like(order).at[order].set(jnp.arange(flat.size, dtype=order.dtype))
    return eligible & (ranks.reshape(scores.shape) < k)


def _positive_ratio(value: float, key: str) -> float:
    if not float(value) > 0:
        raise ValueError(f"actor.policy_loss.{key} must be positive, got {float(value)}")
    return float(value)


@register_policy_loss_terms(
    "clip_cov", options=(*CLIP_BOUNDS, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")
)
def policy_loss_terms_clip_cov(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None, rng: jax.Array | None = None
) -> LossTerms:
    """Clip-Cov: PPO's clipped loss with a random few high-covariance tokens detached.

    r = exp(logπ - logπ_old) (no clamp); L1 = -A·r, L2 = -A·clip(r, 1-ε_low, 1+ε_high).
    cov_t = (A - mean A)·(logπ - mean logπ) over valid tokens. Candidates: valid tokens not
    clipped by PPO (L2 ≤ L1) with clip_cov_lb < cov < clip_cov_ub (policy_loss.*, defaults 1, 5).
    A uniformly random subset of min(k, #candidates), k = max(⌊N·clip_cov_ratio⌋, 1), gets
    weight 0: loss = max(L1, L2)·corr × rollout_is_weights. The subset is drawn with `rng`, by
    default a key derived from the batch (`batch_key`), so that each micro-batch and epoch draws
    afresh, as verl's does, and a rerun draws the same. Metrics: pg_clipfrac (fraction of tokens
    with corr = 0), ppo_kl, pg_clipfrac_lower (0, as verl's).
    """
    low, high = clip_bounds(settings)
    fraction = _positive_ratio(settings.clip_cov_ratio, "clip_cov_ratio")
    lower, upper = float(settings.clip_cov_lb), float(settings.clip_cov_ub)
    old_log_prob, log_prob, advantages, response_mask, rollout_is_weights = inputs
    neg_kl = log_prob - old_log_prob
    ratio = jnp.exp(neg_kl)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - low, 1 + high)
    valid = response_mask > 0
    cov = _covariance(advantages, log_prob, response_mask)
    candidates = valid & ~(clipped > unclipped) & (cov > lower) & (cov < upper)
    key = batch_key(log_prob, response_mask) if rng is None else rng
    draws = jax.random.uniform(key, log_prob.shape)
    detached = top_k_mask(draws, candidates, fraction_count(jnp.sum(valid), fraction))
    losses = weighted(jnp.where(detached, 0.0, jnp.maximum(unclipped, clipped)), rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": detached.astype(jnp.float32),
        "actor/ppo_kl": -neg_kl,
        "actor/pg_clipfrac_lower": jnp.zeros_like(losses),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics))


def batch_key(log_prob: jax.Array, mask: jax.Array) -> jax.Array:
    """A key for Clip-Cov's draw from the batch itself: key(CLIP_COV_SEED) folded with the bits
    of the masked sum of the current log-probs (which differ between micro-batches, steps and
    epochs)."""
    total = masked_sum(jax.lax.stop_gradient(log_prob).astype(jnp.float32), mask)
    return jax.random.fold_in(
        jax.random.key(CLIP_COV_SEED), jax.lax.bitcast_convert_type(total, jnp.uint32)
    )


@register_policy_loss_terms("kl_cov", options=("kl_cov_ratio", "ppo_kl_coef"))
def policy_loss_terms_kl_cov(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """KL-Cov: unclipped policy gradient with a KL penalty on the highest-covariance tokens.

    r = exp(logπ - logπ_old) (no clamp); loss = -A·r, plus ppo_kl_coef·|logπ - logπ_old| on the
    k = max(⌊N·kl_cov_ratio⌋, 1) valid tokens with the largest
    cov_t = (A - mean A)·(logπ - mean logπ) (means over the N valid tokens); × rollout_is_weights.
    policy_loss.kl_cov_ratio defaults to 2e-4, policy_loss.ppo_kl_coef to 1 when null or without
    `settings` (the configuration's default is 0.1). Metrics: ppo_kl = |log ratio|, and
    pg_clipfrac and pg_clipfrac_lower 0, as verl's.
    """
    options = settings or PolicyLossSettings()
    fraction = _positive_ratio(options.kl_cov_ratio, "kl_cov_ratio")
    coef = float(options.ppo_kl_coef)
    old_log_prob, log_prob, advantages, response_mask, rollout_is_weights = inputs
    neg_kl = log_prob - old_log_prob
    abs_kl = jnp.abs(neg_kl)
    pg_losses = -advantages * jnp.exp(neg_kl)
    valid = response_mask > 0
    cov = _covariance(advantages, log_prob, response_mask)
    penalised = top_k_mask(cov, valid, fraction_count(jnp.sum(valid), fraction))
    losses = weighted(
        jnp.where(penalised, pg_losses + coef * abs_kl, pg_losses), rollout_is_weights
    )
    zeros = jnp.zeros_like(losses)  # verl's kl_cov reports no clipping
    metrics = {"actor/pg_clipfrac": zeros, "actor/ppo_kl": abs_kl, "actor/pg_clipfrac_lower": zeros}
    return LossTerms(losses, jax.lax.stop_gradient(metrics))


def _covariance(advantages: jax.Array, log_prob: jax.Array, mask: jax.Array) -> jax.Array:
    """(A - mean A)·(logπ - mean logπ) per token, means over the valid tokens, no gradient."""
    advantages, log_prob = jax.lax.stop_gradient((advantages, log_prob))
    count = jnp.sum(mask > 0)
    mean_adv = safe_divide(masked_sum(advantages, mask), count)
    mean_lp = safe_divide(masked_sum(log_prob, mask), count)
    return (advantages - mean_adv) * (log_prob - mean_lp)


compute_policy_loss_clip_cov = verl_policy_loss("clip_cov", policy_loss_terms_clip_cov)
compute_policy_loss_kl_cov = verl_policy_loss("kl_cov", policy_loss_terms_kl_cov)
