"""Rollout correction (`algorithm.rollout_correction`, current verl): importance weights and
rejection sampling for the gap between the rollout engine's and the trainer's log-probabilities.

ℓ = old_log_prob - rollout_log_prob (trainer minus rollout), m the response mask.

IS weights (`rollout_is`): token w_t = exp(clip(ℓ_t, ±20)); sequence w = exp(clip(Σ_t ℓ·m, ±20))
broadcast over the row. Weights are masked, truncated w ← min(w·m, rollout_is_threshold) (with
current verl's "lo_hi" threshold, IcePop: w ← w·m where lo ≤ w·m ≤ hi, else 0, the token staying
in the mask) and, with `rollout_is_batch_normalize`, divided by their batch mean (token: over
valid tokens; sequence: over the per-row means of rows with a valid token) when that mean exceeds
1e-8.

Rejection (`rollout_rs`, comma-separated criteria that must all pass), on ℓs = clip(ℓ, ±20):
k1 = -ℓs, k2 = ½ℓs², k3 = exp(ℓs) - 1 - ℓs, per token (`token_k*`) or per row as the masked sum
(`seq_sum_k*`), mean (`seq_mean_k*`) or max (`seq_max_k2/k3`). k1 keeps log(lo) ≤ stat ≤ log(hi)
(threshold "lo_hi", or one number hi with lo = 1/hi); k2/k3 keep stat ≤ hi. Rejected tokens (or
whole rows) leave the response mask.

Metrics are `rollout_corr/`-prefixed floats: `rollout_is_*` (IS weights; IcePop's bounds are
the fractions' bounds and `rollout_is_oob_ratio` the valid tokens zeroed), `rollout_rs_<option>_*`
and `rollout_rs_{masked,seq_masked}_fraction` (rejection) and the off-policy diagnostics
`training_ppl`, `kl`, `k3_kl`, `chi2_token`, ... (`offpolicy_metrics`).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from jrl.algos.correction_settings import (
    IS_LEVELS,
    Bounds,
    CorrectionOptions,
    is_bounds,
    rs_options,
    rs_thresholds,
)
from jrl.algos.numerics import MEAN_EPS, masked_mean, masked_sum

SAFETY_BOUND = 20.0
METRIC_PREFIX = "rollout_corr/"


def compute_rollout_correction(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[jax.Array | None, jax.Array, dict[str, float]]:
    """(rollout_is_weights or None, response mask after rejection, `rollout_corr/` metrics).

    Weights come only with both `rollout_is` and `rollout_is_threshold` set; the off-policy
    metrics are always computed.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "old_log_prob, rollout_log_prob and response_mask must share one [B, R] shape; got "
            f"{old_log_prob.shape}, {rollout_log_prob.shape}, {response_mask.shape}"
        )
    if not bool(jnp.any(response_mask > 0)):
        raise ValueError("Rollout correction needs at least one valid response token")
    level = rollout_is if rollout_is_threshold is not None else None
    if level is not None and level not in IS_LEVELS:
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is={level!r}; use one of token, sequence"
        )
    if level is not None:
        is_bounds(rollout_is_threshold)  # a ValueError naming the key when it is not valid
    options = CorrectionOptions(
        rollout_is=rollout_is,
        rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize,
        rollout_rs=rollout_rs,
        rollout_rs_threshold=rollout_rs_threshold,
    )
    weights, mask, metrics = correction_arrays(
        options, old_log_prob, rollout_log_prob, response_mask
    )
    return weights, mask, {METRIC_PREFIX + key: float(value) for key, value in metrics.items()}


def correction_arrays(
    options: CorrectionOptions,
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
) -> tuple[jax.Array | None, jax.Array, dict[str, jax.Array]]:
    """`compute_rollout_correction` of `options` without its host-side checks, so that it traces
    inside a loss: (weights or None, mask after rejection, metrics as arrays, unprefixed)."""
    threshold = options.rollout_is_threshold
    level = options.rollout_is if threshold is not None else None
    upper, lower = is_bounds(threshold) if level is not None else (1.0, None)
    criteria = rs_options(options.rollout_rs) if options.rollout_rs is not None else ()
    bounds = rs_thresholds(criteria, options.rollout_rs_threshold)
    return _correction(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        upper,
        level=level,
        icepop_lower=lower,
        batch_normalize=bool(options.rollout_is_batch_normalize),
        criteria=tuple(zip(criteria, bounds, strict=True)),
    )


def rollout_correction_step(
    options: CorrectionOptions,
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array | None,
    response_mask: jax.Array,
) -> tuple[jax.Array | None, jax.Array, dict[str, float]]:
    """`compute_rollout_correction` with the run's ``algorithm.rollout_correction`` options.

    Without rollout log-probs: an error when IS or RS is asked for, else nothing (verl skips).
    """
    if rollout_log_prob is None:
        if options.rollout_is is not None or options.rollout_rs is not None:
            raise ValueError(
                "algorithm.rollout_correction needs rollout_log_probs in the batch; set "
                "actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        return None, response_mask, {}
    return compute_rollout_correction(
        old_log_prob,
        rollout_log_prob,
        response_mask,
        rollout_is=options.rollout_is,
        rollout_is_threshold=options.rollout_is_threshold,
        rollout_is_batch_normalize=options.rollout_is_batch_normalize,
        rollout_rs=options.rollout_rs,
        rollout_rs_threshold=options.rollout_rs_threshold,
    )


@partial(jax.jit, static_argnames=("level", "icepop_lower", "batch_normalize", "criteria"))
def _correction(
    old_log_prob: jax.Array,
    rollout_log_prob: jax.Array,
    response_mask: jax.Array,
    upper: float,
    *,
    level: str | None,
    icepop_lower: float | None,
    batch_normalize: bool,
    criteria: tuple[tuple[str, Bounds], ...],
) -> tuple[jax.Array | None, jax.Array, dict[str, jax.Array]]:
    old, rollout = (
        jax.lax.stop_gradient(x).astype(jnp.float32) for x in (old_log_prob, rollout_log_prob)
    )
    mask = response_mask.astype(jnp.float32)
    log_ratio = old - rollout
    metrics = {}
    weights = None
    if level is not None:
        log_metric = is_log_weights(log_ratio, mask, level)
        ratio = jnp.broadcast_to(
            jnp.exp(jnp.clip(log_metric, -SAFETY_BOUND, SAFETY_BOUND)), mask.shape
        )
        lower = 1.0 / upper if icepop_lower is None else icepop_lower
        metrics.update(is_metrics(ratio, log_metric, mask, upper, lower, level))
        weights = ratio * mask
        if icepop_lower is None:
            weights = jnp.minimum(weights, upper)
        else:
            kept = (weights >= icepop_lower) & (weights <= upper)
            metrics["rollout_is_oob_ratio"] = masked_mean(1.0 - kept, mask)
            weights = jnp.where(kept, weights, 0.0)
        if batch_normalize:
            weights, metrics["rollout_is_batch_norm_factor"] = batch_normalized(
                weights, mask, level
            )
    kept = mask
    if criteria:
        keep, rs_metrics = rejection_mask(log_ratio, mask, criteria)
        kept = mask * keep
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(old, rollout, mask))
    return weights, kept.astype(response_mask.dtype), metrics


def is_log_weights(log_ratio: jax.Array, mask: jax.Array, level: str) -> jax.Array:
    """log w per `level`: token ℓ [B, R]; sequence Σℓ·m, geometric Σℓ·m / (Σm + 1e-8) [B, 1]."""
    if level == "token":
        return log_ratio
    if level == "sequence":
        return masked_sum(log_ratio, mask, axis=-1)[:, None]
    return masked_mean(log_ratio, mask, axis=-1)[:, None]


def is_metrics(
    ratio: jax.Array,
    log_metric: jax.Array,
    mask: jax.Array,
    upper: float | jax.Array,
    lower: float | jax.Array,
    level: str,
) -> dict[str, jax.Array]:
    """verl's `rollout_is_*` statistics of the safety-clamped, untruncated weights `ratio`.

    mean/ESS/std (std and ESS of the weights clipped to [lower, upper]); max/min/fractions
    outside the bounds from `ratio` (token) or the unclamped log-weights (row levels); `seq_*`
    from the per-row mean weights.
    """
    metrics = {"rollout_is_mean": masked_mean(ratio, mask)}
    if level == "token":
        valid = mask > 0
        metrics["rollout_is_max"] = jnp.max(jnp.where(valid, ratio, -jnp.inf))
        metrics["rollout_is_min"] = jnp.min(jnp.where(valid, ratio, jnp.inf))
        high, low = ratio > upper, ratio < lower
    else:
        metrics["rollout_is_max"] = jnp.exp(jnp.minimum(jnp.max(log_metric), SAFETY_BOUND))
        metrics["rollout_is_min"] = jnp.exp(jnp.min(log_metric))
        high, low = log_metric > jnp.log(upper), log_metric < jnp.log(lower)
    for name, hit in (("high", high), ("low", low)):
        if level == "sequence":
            fraction = jnp.mean(hit.astype(jnp.float32))
        else:
            fraction = masked_mean(jnp.broadcast_to(hit, mask.shape), mask)
        metrics[f"rollout_is_ratio_fraction_{name}"] = fraction
    bounded = jnp.clip(ratio, lower, upper)
    metrics["rollout_is_std"] = _masked_std(bounded, mask)
    normalised = bounded / (masked_mean(bounded, mask) + MEAN_EPS)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(jnp.square(normalised), mask)
    row_means = masked_mean(ratio, mask, axis=-1)
    rows = jnp.ones_like(row_means)
    metrics.update(_row_stats("rollout_is_seq", row_means, rows, upper, lower, center=1.0))
    return metrics


def _masked_std(values: jax.Array, mask: jax.Array) -> jax.Array:
    """√max(E[x²] - E[x]², 0) over the valid entries; 0 with fewer than two."""
    variance = masked_mean(jnp.square(values), mask) - jnp.square(masked_mean(values, mask))
    return jnp.where(jnp.sum(mask) > 1, jnp.sqrt(jnp.maximum(variance, 0.0)), 0.0)


def _row_stats(
    prefix: str,
    values: jax.Array,
    rows: jax.Array,
    upper: float,
    lower: float | None,
    center: float,
) -> dict[str, jax.Array]:
    """{prefix}_{mean,std,max,min,max_deviation,fraction_high[,fraction_low]} over `rows`
    (std with Bessel's correction, 0 for one row; deviation = max |v - center|)."""
    count = jnp.sum(rows)
    mean = jnp.sum(values * rows) / count
    variance = jnp.sum(jnp.square(values - mean) * rows) / jnp.maximum(count - 1, 1)
    on = rows > 0
    stats = {
        f"{prefix}_mean": mean,
        f"{prefix}_std": jnp.where(count > 1, jnp.sqrt(variance), 0.0),
        f"{prefix}_max": jnp.max(jnp.where(on, values, -jnp.inf)),
        f"{prefix}_min": jnp.min(jnp.where(on, values, jnp.inf)),
        f"{prefix}_max_deviation": jnp.max(jnp.where(on, jnp.abs(values - center), -jnp.inf)),
        f"{prefix}_fraction_high": jnp.sum((values > upper) * rows) / count,
    }
    if lower is not None:
        stats[f"{prefix}_fraction_low"] = jnp.sum((values < lower) * rows) / count
    return stats


def batch_normalized(
    weights: jax.Array, mask: jax.Array, level: str
) -> tuple[jax.Array, jax.Array]:
    """(weights / mean, mean) with the batch mean of `level` (token: valid tokens; sequence:
    row means of rows with a valid token); unchanged with factor 1 when mean ≤ 1e-8."""
    if level == "token":
        mean = masked_mean(weights, mask)
    else:
        rows = (jnp.sum(mask, axis=-1) > 0).astype(weights.dtype)
        mean = jnp.sum(masked_mean(weights, mask, axis=-1) * rows) / jnp.maximum(
            jnp.sum(rows), MEAN_EPS
        )
    usable = mean > MEAN_EPS
    return jnp.where(usable, weights / mean, weights), jnp.where(usable, mean, 1.0)


def rs_statistic(log_ratio: jax.Array, mask: jax.Array, option: str) -> jax.Array:
    """The criterion's k1/k2/k3 statistic: [B, R] for `token_*`, [B, 1] for `seq_*`."""
    safe = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    k = {"k1": -safe, "k2": 0.5 * jnp.square(safe), "k3": jnp.exp(safe) - 1.0 - safe}[option[-2:]]
    if option.startswith("token"):
        return k
    if option.startswith("seq_sum"):
        return masked_sum(k, mask, axis=-1)[:, None]
    if option.startswith("seq_mean"):
        return masked_mean(k, mask, axis=-1)[:, None]
    row_max = jnp.max(jnp.where(mask > 0, k, -jnp.inf), axis=-1)
    return jnp.where(jnp.isfinite(row_max), row_max, 0.0)[:, None]


def rejection_mask(
    log_ratio: jax.Array, mask: jax.Array, criteria: tuple[tuple[str, Bounds], ...]
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(keep [B, R] in {0, 1}: every criterion passes, `rollout_rs_*` metrics)."""
    valid = mask > 0
    rows = jnp.any(valid, axis=-1).astype(jnp.float32)
    keep = jnp.ones_like(mask)
    metrics = {}
    for option, (lower, upper) in criteria:
        stat = rs_statistic(log_ratio, mask, option)
        low, high = (None, upper) if lower is None else (math.log(lower), math.log(upper))
        passed = stat <= high if low is None else (stat >= low) & (stat <= high)
        passed = jnp.broadcast_to(passed, mask.shape).astype(mask.dtype)
        keep = keep * passed
        metrics.update(_rs_metrics(f"rollout_rs_{option}", stat, mask, rows, low, high))
        rejected_rows = jnp.any((passed == 0) & valid, axis=-1)
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1 - passed, mask)
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = jnp.sum(
            rejected_rows * rows
        ) / jnp.sum(rows)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - keep, mask)
    metrics["rollout_rs_seq_masked_fraction"] = jnp.mean(jnp.any((keep == 0) & valid, axis=-1))
    return keep, metrics


def _rs_metrics(
    prefix: str,
    stat: jax.Array,
    mask: jax.Array,
    rows: jax.Array,
    low: float | None,
    high: float,
) -> dict[str, jax.Array]:
    """A criterion's statistics: token-weighted mean, max/min and fractions outside [low, high]
    (per token, or per valid row for `seq_*`), std clipped to [low or 0, high], `seq_*` over the
    per-row values (row means for `token_*`). fraction_low is 0 without a lower bound."""
    tokens = jnp.broadcast_to(stat, mask.shape)
    seq_values = stat[:, 0] if stat.shape[-1] == 1 else masked_mean(stat, mask, axis=-1)
    if stat.shape[-1] == 1:
        values, weight = seq_values, rows
    else:
        values, weight = tokens, mask
    on = weight > 0
    metrics = {
        f"{prefix}_mean": masked_mean(tokens, mask),
        f"{prefix}_max": jnp.max(jnp.where(on, values, -jnp.inf)),
        f"{prefix}_min": jnp.min(jnp.where(on, values, jnp.inf)),
        f"{prefix}_fraction_high": jnp.sum((values > high) * weight) / jnp.sum(weight),
        f"{prefix}_fraction_low": (
            jnp.zeros(()) if low is None else jnp.sum((values < low) * weight) / jnp.sum(weight)
        ),
        f"{prefix}_std": _masked_std(jnp.clip(tokens, 0.0 if low is None else low, high), mask),
    }
    metrics.update(_row_stats(f"{prefix}_seq", seq_values, rows, high, low, center=0.0))
    return metrics


def offpolicy_metrics(old: jax.Array, rollout: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """verl's off-policy diagnostics: per-row perplexities exp(-mean log p) averaged over rows,
    kl = mean(rollout - old), k3_kl = mean(e^ℓ - ℓ - 1), log_ppl_diff = row mean of rollout - old
    (mean, |mean|, max, min, ppl_ratio = mean e^diff), chi2_token = E[e^{2ℓ}] - 1 and chi2_seq =
    E_rows[e^{2Σℓ}] - 1 (ℓ and Σℓ clipped to ±20)."""
    log_ratio = old - rollout
    train_mean = masked_mean(old, mask, axis=-1)
    rollout_mean = masked_mean(rollout, mask, axis=-1)
    log_ppl_diff = rollout_mean - train_mean
    token_ratio = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = jnp.clip(masked_sum(log_ratio, mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": jnp.mean(jnp.exp(-train_mean)),
        "training_log_ppl": jnp.mean(-train_mean),
        "kl": masked_mean(rollout - old, mask),
        "k3_kl": masked_mean(jnp.exp(log_ratio) - log_ratio - 1, mask),
        "rollout_ppl": jnp.mean(jnp.exp(-rollout_mean)),
        "rollout_log_ppl": jnp.mean(-rollout_mean),
        "log_ppl_diff": jnp.mean(log_ppl_diff),
        "log_ppl_abs_diff": jnp.mean(jnp.abs(log_ppl_diff)),
        "log_ppl_diff_max": jnp.max(log_ppl_diff),
        "log_ppl_diff_min": jnp.min(log_ppl_diff),
        "ppl_ratio": jnp.mean(jnp.exp(log_ppl_diff)),
        "chi2_token": masked_mean(jnp.square(token_ratio), mask) - 1.0,
        "chi2_seq": jnp.mean(jnp.exp(2.0 * seq_log_ratio)) - 1.0,
    }
