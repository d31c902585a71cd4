"""Rollout importance sampling: correct for the gap between the rollout engine's and the trainer's
log-probabilities of the same tokens (the `algorithm.rollout_is*` keys).

ℓ = old_log_prob - rollout_log_prob (trainer minus rollout). Weights per `rollout_is_level`:
token w_t = exp(clamp(ℓ_t, ±20)); sequence w = exp(clamp(Σ_t ℓ·m, ±20)); geometric
w = exp(clamp(Σ_t ℓ·m / (Σ_t m + 1e-8), ±20)), the last two broadcast over the row. Per
`rollout_is_mode`: truncate → weights min(w, upper), mask unchanged; mask → weights keep the true
ratios and tokens with w outside [lower, upper] leave the response mask (rejection). Veto: a row
with any valid token whose ℓ < log(rollout_is_veto_threshold) leaves the mask entirely. Weights
are finally multiplied by the original mask and carry no gradient.

This is the verl v0.6 spelling mapped onto `jrl.algos.rollout_correction` (current verl's
`algorithm.rollout_correction`): the log-weights, the weight statistics and the off-policy metrics
are that module's; the geometric level, mask mode, veto, percentiles and the `mismatch/` names are
v0.6's. The resolver merges the actor-level copies (`actor_rollout_ref.actor.rollout_is*`) into
these keys (`jrl.algos.correction_settings.LegacyRolloutIS`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jrl.algos import rollout_correction as rc
from jrl.algos.correction_settings import ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES, LegacyRolloutIS
from jrl.algos.numerics import masked_mean, masked_sum

SAFETY_BOUND = rc.SAFETY_BOUND
PERCENTILES = (25, 50, 75, 95, 99)
METRIC_PREFIX = "mismatch/"


def compute_rollout_importance_weights(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
    rollout_is_level: str = "token",
    rollout_is_mode: str = "truncate",
    rollout_is_threshold: float | None = None,
    rollout_is_threshold_lower: float | None = None,
    rollout_is_veto_threshold: float | None = None,
) -> tuple[jax.Array | None, jax.Array, dict[str, float]]:
    """(rollout_is_weights or None, modified_response_mask, metrics) for one batch.

    `rollout_is_threshold` (the upper bound) switches the computation on; when it is None this
    returns (None, response_mask, {}). The lower bound defaults to 1/upper. Metrics are floats named
    `mismatch/...` (verl's names): rollout_is_{mean,max,min,std,eff_sample_size,
    ratio_fraction_high,ratio_fraction_low,veto_fraction,catastrophic_token_fraction,seq_mean,
    seq_std,seq_max,seq_min,seq_max_deviation,seq_fraction_high,seq_fraction_low,p25..p99}
    (mean/std/ESS/percentiles from the safety-clamped weights before truncation; max/min/fractions
    of sequence/geometric levels from the unclamped log-ratios), rollout_is_{masked_fraction,
    seq_masked_fraction} in mask mode, and mismatch_{training_ppl,training_log_ppl,kl,k3_kl,
    rollout_ppl,rollout_log_ppl,log_ppl_diff,log_ppl_abs_diff,log_ppl_diff_max,log_ppl_diff_min,
    ppl_ratio,chi2_token,chi2_seq}, where kl = mean(rollout - old) and chi2 = E[ρ²] - 1 per token
    or per sequence (ρ = the clamped token or sequence ratio).
    """
    if rollout_is_threshold is None:
        return None, response_mask, {}
    _check_choice(rollout_is_level, ROLLOUT_IS_LEVELS, "rollout_is_level")
    _check_choice(rollout_is_mode, ROLLOUT_IS_MODES, "rollout_is_mode")
    upper = _positive(rollout_is_threshold, "rollout_is_threshold")
    lower = 1.0 / upper
    if rollout_is_threshold_lower is not None:
        lower = _positive(rollout_is_threshold_lower, "rollout_is_threshold_lower")
    log_veto = -np.inf
    if rollout_is_veto_threshold is not None:
        log_veto = float(np.log(_positive(rollout_is_veto_threshold, "rollout_is_veto_threshold")))
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "old_log_prob, rollout_log_prob and response_mask must share one [B, R] shape; got "
            f"{old_log_prob.shape}, {rollout_log_prob.shape}, {response_mask.shape}"
        )
    if not bool(jnp.any(response_mask > 0)):
        raise ValueError("Rollout importance sampling needs at least one valid response token")
    weights, mask, metrics = _rollout_is(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        upper,
        lower,
        log_veto,
        level=rollout_is_level,
        mode=rollout_is_mode,
    )
    return weights, mask, {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}


def rollout_importance_sampling(
    settings: LegacyRolloutIS,
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array | None,
    response_mask: jax.Array,
) -> tuple[jax.Array | None, jax.Array, dict[str, float]]:
    """The trainer's step with the run's v0.6 settings: (weights or None, mask, metrics).

    Off (None, mask, {}) while `rollout_is_threshold` is null. Otherwise the rejection (mask mode,
    veto) always applies to the returned mask and the metrics are always computed, but the
    weights are returned only when `rollout_is` is true (false = metrics only).
    """
    threshold = settings.rollout_is_threshold
    if threshold is None:
        if settings.rollout_is:
            raise ValueError(
                "algorithm.rollout_is=True needs algorithm.rollout_is_threshold (e.g. 2.0)"
            )
        return None, response_mask, {}
    if rollout_log_prob is None:
        raise ValueError(
            "algorithm.rollout_is_threshold is set but the batch has no rollout_log_probs; set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    weights, mask, metrics = compute_rollout_importance_weights(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        rollout_is_level=settings.rollout_is_level,
        rollout_is_mode=settings.rollout_is_mode,
        rollout_is_threshold=threshold,
        rollout_is_threshold_lower=settings.rollout_is_threshold_lower,
        rollout_is_veto_threshold=settings.rollout_is_veto_threshold,
    )
    return (weights if settings.rollout_is else None), mask, metrics


def _check_choice(value: str, choices: tuple[str, ...], key: str) -> None:
    if value not in choices:
        raise ValueError(f"Unknown algorithm.{key} {value!r}; choose one of {', '.join(choices)}")


def _positive(value: float, key: str) -> float:
    if not float(value) > 0:
        raise ValueError(f"algorithm.{key} must be positive (or null), got {value}")
    return float(value)


@partial(jax.jit, static_argnames=("level", "mode"))
def _rollout_is(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
    upper: jax.Array,
    lower: jax.Array,
    log_veto: jax.Array,
    *,
    level: str,
    mode: str,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    old, rollout = (
        jax.lax.stop_gradient(x).astype(jnp.float32) for x in (old_log_prob, rollout_log_prob)
    )
    mask = response_mask.astype(jnp.float32)
    log_ratio = old - rollout
    log_metric = rc.is_log_weights(log_ratio, mask, level)
    ratio = jnp.broadcast_to(jnp.exp(jnp.clip(log_metric, -SAFETY_BOUND, SAFETY_BOUND)), mask.shape)
    catastrophic = (log_ratio < log_veto) & (mask > 0)
    vetoed = jnp.any(catastrophic, axis=-1)
    metrics = {
        "rollout_is_veto_fraction": jnp.mean(vetoed.astype(jnp.float32)),
        "rollout_is_catastrophic_token_fraction": masked_mean(catastrophic, mask),
        **rc.is_metrics(ratio, log_metric, mask, upper, lower, level),
        **{f"mismatch_{k}": v for k, v in rc.offpolicy_metrics(old, rollout, mask).items()},
    }
    quantiles = masked_quantiles(ratio, mask, [p / 100 for p in PERCENTILES])
    for percentile, value in zip(PERCENTILES, quantiles, strict=True):
        metrics[f"rollout_is_p{percentile}"] = value
    if mode == "truncate":
        weights, kept = jnp.minimum(ratio, upper), mask
    else:
        inside = ((ratio >= lower) & (ratio <= upper)).astype(jnp.float32)
        metrics["rollout_is_masked_fraction"] = masked_mean(1 - inside, mask)
        if level == "token":
            rejected_rows = masked_sum(1 - inside, mask, axis=-1) > 0
        else:
            rejected_rows = inside[:, 0] == 0
        metrics["rollout_is_seq_masked_fraction"] = jnp.mean(rejected_rows.astype(jnp.float32))
        weights, kept = ratio, mask * inside
    kept = kept * (~vetoed)[:, None]
    return weights * mask, kept.astype(response_mask.dtype), metrics


def masked_quantiles(values: jax.Array, mask: jax.Array, qs: list[float]) -> list[jax.Array]:
    """Quantiles of the valid entries with linear interpolation (numpy's default method).

    Needs at least one valid entry.
    """
    count = jnp.sum(mask > 0)
    ordered = jnp.sort(jnp.where(mask > 0, values, jnp.inf).ravel())
    results = []
    for q in qs:
        position = q * (count - 1).astype(jnp.float32)
        below = jnp.floor(position).astype(jnp.int32)
        above = jnp.minimum(below + 1, count - 1)
        low_value, high_value = ordered[below], ordered[above]
        results.append(low_value + (position - below) * (high_value - low_value))
    return results
