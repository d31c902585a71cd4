"""Per-token policy losses without PPO's max-of-two: SAPO, GPG and CISPO.

Each token's loss depends only on that token, so all three are exact under micro-batch
accumulation. SAPO fixes its aggregation to seq-mean-token-mean; GPG and CISPO use
`loss_agg_mode`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import SEQ_MEAN_TOKEN_MEAN, LossTerms
from jrl.algos.policy_loss import (
    CLIP_BOUNDS,
    PolicyInputs,
    clip_bounds,
    log_ratio,
    register_policy_loss_terms,
    verl_policy_loss,
    weighted,
)
from jrl.algos.settings import PolicyLossSettings


@register_policy_loss_terms("sapo", options=("tau_pos", "tau_neg"))
def policy_loss_terms_sapo(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """SAPO: a smooth sigmoid gate instead of a hard clip.

    r = exp(clamp(logπ - logπ_old, ±20)); τ = actor.tau_pos (1.0) where A > 0 else actor.tau_neg
    (1.05; those defaults without `settings`); loss = -sigmoid(τ·(r - 1))·(4/τ)·A ×
    rollout_is_weights; aggregated seq-mean-token-mean whatever `loss_agg_mode` says. Metrics:
    ppo_kl; pg_clipfrac and pg_clipfrac_lower are always 0.
    """
    options = settings or PolicyLossSettings()
    tau_pos, tau_neg = float(options.tau_pos), float(options.tau_neg)
    log_r = log_ratio(inputs.log_prob, inputs.old_log_prob)
    tau = jnp.where(inputs.advantages > 0, tau_pos, tau_neg)
    gate = jax.nn.sigmoid(tau * (jnp.exp(log_r) - 1.0)) * (4.0 / tau)
    losses = weighted(-gate * inputs.advantages, inputs.rollout_is_weights)
    zeros = jnp.zeros_like(losses)
    metrics = {"actor/pg_clipfrac": zeros, "actor/ppo_kl": -log_r, "actor/pg_clipfrac_lower": zeros}
    return LossTerms(losses, jax.lax.stop_gradient(metrics), SEQ_MEAN_TOKEN_MEAN)


@register_policy_loss_terms("gpg", options=())
def policy_loss_terms_gpg(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """GPG: plain policy gradient, loss = -logπ·A × rollout_is_weights (no ratio); its metrics
    pg_clipfrac, ppo_kl and pg_clipfrac_lower are 0, as verl's."""
    losses = weighted(-inputs.log_prob * inputs.advantages, inputs.rollout_is_weights)
    zeros = jnp.zeros_like(losses)
    names = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    return LossTerms(losses, dict.fromkeys(names, zeros))


@register_policy_loss_terms("cispo", options=CLIP_BOUNDS)
def policy_loss_terms_cispo(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient ratio.

    r = exp(clamp(logπ - logπ_old, ±20)); loss = -sg(clip(r, 1-ε_low, 1+ε_high))·A·logπ ×
    rollout_is_weights. Metrics: pg_clipfrac (r was clipped), ppo_kl, pg_clipfrac_lower (0).
    """
    low, high = clip_bounds(settings)
    log_prob = inputs.log_prob
    log_r = log_ratio(log_prob, inputs.old_log_prob)
    ratio = jnp.exp(log_r)
    clipped_ratio = jax.lax.stop_gradient(jnp.clip(ratio, 1 - low, 1 + high))
    losses = weighted(-clipped_ratio * inputs.advantages * log_prob, inputs.rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": (ratio != clipped_ratio).astype(jnp.float32),
        "actor/ppo_kl": -log_r,
        "actor/pg_clipfrac_lower": jnp.zeros_like(losses),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics))


compute_policy_loss_sapo = verl_policy_loss("sapo", policy_loss_terms_sapo)
compute_policy_loss_gpg = verl_policy_loss("gpg", policy_loss_terms_gpg)
compute_policy_loss_cispo = verl_policy_loss("cispo", policy_loss_terms_cispo)
