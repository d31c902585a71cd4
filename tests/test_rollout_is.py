"""Rollout importance sampling (`algorithm.rollout_is*`) against numpy loops of verl's formulas."""

import math
import statistics

import numpy as np
import pytest
from reference import MASK, B, R, close, rand

from jrl import algos

UPPER, LOWER, VETO = 2.0, 0.6, 1e-4
ROWS = range(B)


def log_probs():
    """Trainer and rollout log-probs with one catastrophic token (row 5) and one huge ratio."""
    old = rand(50, scale=0.5) - 1.5
    rollout = old + rand(51, scale=0.4)
    rollout[5, 2] = old[5, 2] + 12.0  # ratio e^-12 < 1e-4: vetoes row 5
    rollout[0, 4] = old[0, 4] - 25.0  # ratio e^25, beyond the ±20 safety bound
    return old, rollout


def masked_tokens(x):
    return [float(x[i, t]) for i in ROWS for t in range(R) if MASK[i, t]]


def row_mean(x, i):
    return sum(float(x[i, t]) * MASK[i, t] for t in range(R)) / (MASK[i].sum() + 1e-8)


def mmean(x):
    return sum(masked_tokens(x)) / (MASK.sum() + 1e-8)


# ---------------------------------------------------------------- numpy reference


def ref_rollout_is(old, rollout, level, mode):
    ell = old.astype(np.float64) - rollout
    if level == "token":
        log_w = ell
    elif level == "sequence":
        log_w = np.array([[sum(ell[i, t] * MASK[i, t] for t in range(R))] for i in ROWS])
    else:
        log_w = np.array([[row_mean(ell, i)] for i in ROWS])
    w = np.broadcast_to(np.exp(np.clip(log_w, -20, 20)), (B, R))
    catastrophic = (ell < math.log(VETO)) & (MASK > 0)
    vetoed = catastrophic.any(-1)
    m = {
        "rollout_is_veto_fraction": vetoed.mean(),
        "rollout_is_catastrophic_token_fraction": mmean(catastrophic),
        "rollout_is_mean": mmean(w),
    }
    if level == "token":
        m["rollout_is_max"], m["rollout_is_min"] = max(masked_tokens(w)), min(masked_tokens(w))
        high, low = w > UPPER, w < LOWER
    else:
        m["rollout_is_max"] = math.exp(min(log_w.max(), 20))
        m["rollout_is_min"] = math.exp(log_w.min())
        high, low = log_w > math.log(UPPER), log_w < math.log(LOWER)
    if level == "sequence":
        m["rollout_is_ratio_fraction_high"] = high.mean()
        m["rollout_is_ratio_fraction_low"] = low.mean()
    else:
        m["rollout_is_ratio_fraction_high"] = mmean(np.broadcast_to(high, (B, R)))
        m["rollout_is_ratio_fraction_low"] = mmean(np.broadcast_to(low, (B, R)))
    bounded = np.clip(w, LOWER, UPPER)
    m["rollout_is_std"] = math.sqrt(max(mmean(bounded**2) - mmean(bounded) ** 2, 0))
    m["rollout_is_eff_sample_size"] = 1 / mmean((bounded / (mmean(bounded) + 1e-8)) ** 2)
    seq = [row_mean(w, i) for i in ROWS]
    m["rollout_is_seq_mean"] = statistics.mean(seq)
    m["rollout_is_seq_std"] = statistics.stdev(seq)
    m["rollout_is_seq_max"], m["rollout_is_seq_min"] = max(seq), min(seq)
    m["rollout_is_seq_max_deviation"] = max(abs(s - 1) for s in seq)
    m["rollout_is_seq_fraction_high"] = statistics.mean(float(s > UPPER) for s in seq)
    m["rollout_is_seq_fraction_low"] = statistics.mean(float(s < LOWER) for s in seq)
    for p in (25, 50, 75, 95, 99):
        m[f"rollout_is_p{p}"] = np.quantile(masked_tokens(w), p / 100)
    train = [row_mean(old, i) for i in ROWS]
    roll = [row_mean(rollout, i) for i in ROWS]
    diff = [r - t for r, t in zip(roll, train, strict=True)]
    m.update(
        {
            "mismatch_training_ppl": statistics.mean(math.exp(-x) for x in train),
            "mismatch_training_log_ppl": -statistics.mean(train),
            "mismatch_kl": mmean(rollout.astype(np.float64) - old),
            "mismatch_k3_kl": mmean(np.exp(ell) - ell - 1),
            "mismatch_rollout_ppl": statistics.mean(math.exp(-x) for x in roll),
            "mismatch_rollout_log_ppl": -statistics.mean(roll),
            "mismatch_log_ppl_diff": statistics.mean(diff),
            "mismatch_log_ppl_abs_diff": statistics.mean(abs(d) for d in diff),
            "mismatch_log_ppl_diff_max": max(diff),
            "mismatch_log_ppl_diff_min": min(diff),
            "mismatch_ppl_ratio": statistics.mean(math.exp(d) for d in diff),
            "mismatch_chi2_token": mmean(np.exp(np.clip(ell, -20, 20)) ** 2) - 1,
            "mismatch_chi2_seq": statistics.mean(
                math.exp(2 * min(max(sum(ell[i] * MASK[i]), -20), 20)) for i in ROWS
            )
            - 1,
        }
    )
    keep = np.ones((B, R))
    if mode == "truncate":
        weights = np.minimum(w, UPPER)
    else:
        keep = ((w >= LOWER) & (w <= UPPER)).astype(float)
        weights = w
        m["rollout_is_masked_fraction"] = mmean(1 - keep)
        rejected = [float(((1 - keep[i]) * MASK[i]).sum() > 0) for i in ROWS]
        m["rollout_is_seq_masked_fraction"] = statistics.mean(rejected)
    new_mask = MASK * keep * (~vetoed)[:, None]
    return weights * MASK, new_mask, {"mismatch/" + k: float(v) for k, v in m.items()}


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_weights_mask_and_metrics_match_loop(level, mode):
    old, rollout = log_probs()
    weights, mask, metrics = algos.compute_rollout_importance_weights(
        old_log_prob=old,
        rollout_log_prob=rollout,
        response_mask=MASK,
        rollout_is_level=level,
        rollout_is_mode=mode,
        rollout_is_threshold=UPPER,
        rollout_is_threshold_lower=LOWER,
        rollout_is_veto_threshold=VETO,
    )
    ref_weights, ref_mask, ref_metrics = ref_rollout_is(old, rollout, level, mode)
    close(weights, ref_weights, 1e-5)
    np.testing.assert_array_equal(np.asarray(mask), ref_mask)
    assert np.all(np.asarray(mask)[5] == 0) and np.asarray(mask).dtype == MASK.dtype
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():
        np.testing.assert_allclose(metrics[key], value, rtol=2e-5, atol=1e-6, err_msg=key)
    assert isinstance(metrics["mismatch/rollout_is_mean"], float)


def test_defaults_lower_threshold_and_no_veto():
    old, rollout = log_probs()
    weights, mask, metrics = algos.compute_rollout_importance_weights(
        old, rollout, MASK, rollout_is_mode="mask", rollout_is_threshold=UPPER
    )
    w = np.exp(np.clip(old.astype(np.float64) - rollout, -20, 20))
    keep = (w >= 1 / UPPER) & (w <= UPPER)
    np.testing.assert_array_equal(np.asarray(mask), MASK * keep)  # row 5 is not vetoed
    assert metrics["mismatch/rollout_is_veto_fraction"] == 0.0
    close(weights, w * MASK, 1e-5)


def test_disabled_and_bad_settings():
    old, rollout = log_probs()
    weights, mask, metrics = algos.compute_rollout_importance_weights(old, rollout, MASK)
    assert weights is None and mask is MASK and metrics == {}
    with pytest.raises(ValueError, match="algorithm.rollout_is_level 'seq'.*geometric"):
        algos.compute_rollout_importance_weights(
            old, rollout, MASK, rollout_is_level="seq", rollout_is_threshold=2.0
        )
    with pytest.raises(ValueError, match="algorithm.rollout_is_mode 'clip'.*truncate, mask"):
        algos.compute_rollout_importance_weights(
            old, rollout, MASK, rollout_is_mode="clip", rollout_is_threshold=2.0
        )
    with pytest.raises(ValueError, match="rollout_is_threshold must be positive"):
        algos.compute_rollout_importance_weights(old, rollout, MASK, rollout_is_threshold=0.0)
    with pytest.raises(ValueError, match="at least one valid response token"):
        algos.compute_rollout_importance_weights(
            old, rollout, np.zeros_like(MASK), rollout_is_threshold=2.0
        )
    with pytest.raises(ValueError, match="share one"):
        algos.compute_rollout_importance_weights(old, rollout[:4], MASK, rollout_is_threshold=2.0)


def algorithm(**overrides):
    values = {
        "rollout_is": False,
        "rollout_is_threshold": UPPER,
        "rollout_is_threshold_lower": LOWER,
        "rollout_is_level": "token",
        "rollout_is_mode": "mask",
        "rollout_is_veto_threshold": VETO,
        **overrides,
    }
    return algos.LegacyRolloutIS(**values)


def test_config_entry_point_metrics_only_or_applied():
    old, rollout = log_probs()
    ref_weights, ref_mask, ref_metrics = ref_rollout_is(old, rollout, "token", "mask")
    weights, mask, metrics = algos.rollout_importance_sampling(algorithm(), old, rollout, MASK)
    assert weights is None  # rollout_is=False: metrics (and rejection) only
    np.testing.assert_array_equal(np.asarray(mask), ref_mask)
    assert set(metrics) == set(ref_metrics)
    weights, _, _ = algos.rollout_importance_sampling(
        algorithm(rollout_is=True), old, rollout, MASK
    )
    close(weights, ref_weights, 1e-5)
    off = algorithm(rollout_is_threshold=None)
    assert algos.rollout_importance_sampling(off, old, None, MASK) == (None, MASK, {})
    with pytest.raises(ValueError, match="rollout_is=True needs algorithm.rollout_is_threshold"):
        algos.rollout_importance_sampling(
            algorithm(rollout_is=True, rollout_is_threshold=None), old, rollout, MASK
        )
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        algos.rollout_importance_sampling(algorithm(), old, None, MASK)


def test_identical_policies_give_unit_weights():
    old, _ = log_probs()
    weights, mask, metrics = algos.compute_rollout_importance_weights(
        old, old, MASK, rollout_is_level="sequence", rollout_is_threshold=UPPER
    )
    close(weights, MASK)
    np.testing.assert_array_equal(np.asarray(mask), MASK)
    for key in ("mismatch_kl", "mismatch_k3_kl", "mismatch_chi2_token", "mismatch_log_ppl_diff"):
        close(metrics[f"mismatch/{key}"], 0.0, 1e-6)
    close(metrics["mismatch/rollout_is_eff_sample_size"], 1.0, 1e-6)
