"""verl's bypass mode (`algorithm.rollout_correction.bypass_mode`, current verl): the rollout's
log-probs serve as the old log-probs, so the trainer skips its old-log-prob pass, and the policy
loss ``bypass_mode`` corrects for the rollout itself.

With π_θ the policy being trained and π_r the rollout's (the old log-probs here), ℓ = logπ_θ -
logπ_r (no gradient) gives the importance weights w and the rollout-correction metrics of
`jrl.algos.rollout_correction` (the options ``PolicyLossSettings.rollout_correction``), then by its
``loss_type``:

- ``ppo_clip``: the vanilla PPO loss with ratio π_θ / π_r; w is not applied (the ratio already
  is the correction);
- ``reinforce``: -A·logπ_θ·w (w = 1 without ``rollout_is``), with ``actor/ppo_kl`` =
  mean(logπ_r - logπ_θ).

w is normalised (``rollout_is_batch_normalize``) over the micro-batch the loss sees, as verl's
actor does. Rejection sampling (``rollout_rs``, criteria on ℓ) drops tokens from the policy
loss's numerator only: the normaliser stays the whole mini-batch's response mask (verl's
``global_batch_info``), so a rejected token weighs nothing and the rest keep their weight however
the mini-batch is split; entropy and KL terms and the metrics keep every response token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import LossTerms
from jrl.algos.correction_settings import CorrectionOptions
from jrl.algos.policy_loss import (
    CLIP_RANGES,
    PolicyInputs,
    policy_loss_terms_vanilla,
    register_policy_loss_terms,
    verl_policy_loss,
)
from jrl.algos.rollout_correction import METRIC_PREFIX, correction_arrays
from jrl.algos.settings import PolicyLossSettings
from jrl.algos.token_losses import policy_loss_terms_gpg

BYPASS_LOSS_MODE = "bypass_mode"


def bypass_correction(settings: PolicyLossSettings | None) -> CorrectionOptions:
    """The ``algorithm.rollout_correction`` options that the bypass loss's settings carry."""
    options = None if settings is None else settings.rollout_correction
    if options is None:
        raise ValueError(
            "policy_loss.loss_mode='bypass_mode' needs the algorithm.rollout_correction "
            "options as PolicyLossSettings.rollout_correction (the resolver sets them when "
            "algorithm.rollout_correction.bypass_mode=True)"
        )
    return options


@register_policy_loss_terms(BYPASS_LOSS_MODE, options=(*CLIP_RANGES, "rollout_correction"))
def policy_loss_terms_bypass_mode(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """Per-token bypass-mode loss, `inputs.old_log_prob` being the rollout's log-probs (see the
    module docstring); `inputs.rollout_is_weights` is ignored: the weights are computed here."""
    section = bypass_correction(settings)
    old_log_prob, log_prob, _, response_mask, _ = inputs
    current = jax.lax.stop_gradient(log_prob)
    weights, kept, correction = correction_arrays(section, current, old_log_prob, response_mask)
    loss_type = section.loss_type
    if loss_type == "ppo_clip":
        terms = policy_loss_terms_vanilla(inputs._replace(rollout_is_weights=None), settings)
    elif loss_type == "reinforce":  # GPG's plain policy gradient, with the bypass weights
        terms = policy_loss_terms_gpg(inputs._replace(rollout_is_weights=weights), settings)
        terms.metrics["actor/ppo_kl"] = jax.lax.stop_gradient(old_log_prob - log_prob)
    else:
        raise ValueError(
            f"algorithm.rollout_correction.loss_type={loss_type!r}; use ppo_clip or reinforce"
        )
    # Batch-level statistics, one value per micro-batch: their token-weighted mean is reported.
    shape = response_mask.shape
    per_token = {
        METRIC_PREFIX + name: jnp.broadcast_to(value.astype(jnp.float32), shape)
        for name, value in correction.items()
    }
    rejects = section.rollout_rs is not None
    return terms._replace(
        metrics={**terms.metrics, **per_token}, loss_mask=kept if rejects else None
    )


compute_policy_loss_bypass_mode = verl_policy_loss(BYPASS_LOSS_MODE, policy_loss_terms_bypass_mode)
