"""Rollout correction (`algorithm.rollout_correction`, current verl) against numpy float64 versions
of verl's formulas, its config checks and its equivalence with the v0.6 spelling."""

import math
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import MASK, B, close, rand, ref_agg

from jrl import algos
from jrl.algos import correction_settings as cs
from jrl.algos import rollout_correction as rc
from jrl.batch import Batch
from jrl.config import ConfigError
from jrl.runspec import load_config
from jrl.runspec.algorithm import resolve_algorithm
from jrl.trainer.ppo.experience import advantage_phase, rollout_correction
from jrl.trainer.roles.actor import ActorLoss

GRPO = str(Path(__file__).resolve().parents[1] / "configs" / "gsm8k_grpo.py")
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=True"
RC = "algorithm.rollout_correction"
VALID = MASK > 0
ROWS = VALID.any(-1)


def log_probs():
    """Trainer and rollout log-probs; row 0 has a ratio of e^25, beyond the ±20 safety bound."""
    old = rand(60, scale=0.5) - 1.5
    rollout = old + rand(61, scale=0.3)
    rollout[0, 4] = old[0, 4] - 25.0
    return old, rollout


def ell():
    old, rollout = log_probs()
    return old.astype(np.float64) - rollout


def mm(x, axis=None):
    x = np.broadcast_to(x, MASK.shape)
    return (x * MASK).sum(axis) / (MASK.sum(axis) + 1e-8)


def row_stats(prefix, values, rows, hi, lo, center):
    v = values[rows]
    out = {
        "mean": v.mean(),
        "std": statistics.stdev(v) if len(v) > 1 else 0.0,
        "max": v.max(),
        "min": v.min(),
        "max_deviation": np.abs(v - center).max(),
        "fraction_high": (v > hi).mean(),
    }
    if lo is not None:
        out["fraction_low"] = (v < lo).mean()
    return {f"{prefix}_{k}": x for k, x in out.items()}


def ref_is(level, upper, normalize, icepop_lower=None):
    """verl's weights and `rollout_is_*` metrics; with `icepop_lower`, current verl's IcePop
    (weights outside [lower, upper] zeroed, `rollout_is_oob_ratio`)."""
    x = ell()
    log_w = x if level == "token" else (x * MASK).sum(-1, keepdims=True)
    w = np.broadcast_to(np.exp(np.clip(log_w, -20, 20)), MASK.shape) * MASK
    lower = 1 / upper if icepop_lower is None else icepop_lower
    m = {"rollout_is_mean": mm(w)}
    if level == "token":
        m["rollout_is_max"], m["rollout_is_min"] = w[VALID].max(), w[VALID].min()
        m["rollout_is_ratio_fraction_high"] = mm(w > upper)
        m["rollout_is_ratio_fraction_low"] = mm(w < lower)
    else:
        m["rollout_is_max"] = math.exp(min(log_w.max(), 20))
        m["rollout_is_min"] = math.exp(log_w.min())
        m["rollout_is_ratio_fraction_high"] = (log_w > math.log(upper)).mean()
        m["rollout_is_ratio_fraction_low"] = (log_w < math.log(lower)).mean()
    c = np.clip(w, lower, upper)
    m["rollout_is_std"] = math.sqrt(max(mm(c**2) - mm(c) ** 2, 0))
    m["rollout_is_eff_sample_size"] = 1 / mm((c / (mm(c) + 1e-8)) ** 2)
    m.update(row_stats("rollout_is_seq", mm(w, -1), np.ones(B, bool), upper, lower, 1.0))
    weights = np.minimum(w, upper)
    if icepop_lower is not None:
        kept = (w >= icepop_lower) & (w <= upper)
        m["rollout_is_oob_ratio"] = mm(~kept)
        weights = np.where(kept, w, 0.0)
    if normalize:
        rows = ROWS.astype(float)
        mean = mm(weights) if level == "token" else (mm(weights, -1) * rows).sum() / rows.sum()
        weights, m["rollout_is_batch_norm_factor"] = weights / mean, mean
    return weights, m


def ref_statistic(option):
    s = np.clip(ell(), -20, 20)
    k = {"k1": -s, "k2": 0.5 * s**2, "k3": np.exp(s) - 1 - s}[option[-2:]]
    if option.startswith("token"):
        return k, mm(k, -1)
    if option.startswith("seq_sum"):
        v = (k * MASK).sum(-1)
    elif option.startswith("seq_mean"):
        v = mm(k, -1)
    else:
        v = np.array([k[i][VALID[i]].max() if ROWS[i] else 0.0 for i in range(B)])
    return np.broadcast_to(v[:, None], MASK.shape), v


def ref_rs(criteria):
    keep_all, m = np.ones(MASK.shape), {}
    for option, (lower, upper) in criteria:
        stat, seq = ref_statistic(option)
        lo, hi = (None, upper) if lower is None else (math.log(lower), math.log(upper))
        keep = (stat <= hi) if lo is None else (stat >= lo) & (stat <= hi)
        keep_all = keep_all * keep
        p = f"rollout_rs_{option}"
        values = seq[ROWS] if option.startswith("seq") else stat[VALID]
        m[f"{p}_mean"] = mm(stat)
        m[f"{p}_max"], m[f"{p}_min"] = values.max(), values.min()
        m[f"{p}_fraction_high"] = (values > hi).mean()
        m[f"{p}_fraction_low"] = 0.0 if lo is None else (values < lo).mean()
        c = np.clip(stat, 0.0 if lo is None else lo, hi)
        m[f"{p}_std"] = math.sqrt(max(mm(c**2) - mm(c) ** 2, 0))
        m.update(row_stats(f"{p}_seq", seq, ROWS, hi, lo, 0.0))
        m[f"{p}_masked_fraction"] = mm(1 - keep)
        m[f"{p}_seq_masked_fraction"] = (~keep & VALID).any(-1)[ROWS].mean()
    m["rollout_rs_masked_fraction"] = mm(1 - keep_all)
    m["rollout_rs_seq_masked_fraction"] = ((keep_all == 0) & VALID).any(-1).mean()
    return MASK * keep_all, m


def ref_offpolicy():
    old, rollout = (x.astype(np.float64) for x in log_probs())
    x = old - rollout
    train, roll = mm(old, -1), mm(rollout, -1)
    diff = roll - train
    return {
        "training_ppl": np.exp(-train).mean(),
        "training_log_ppl": -train.mean(),
        "kl": mm(rollout - old),
        "k3_kl": mm(np.exp(x) - x - 1),
        "rollout_ppl": np.exp(-roll).mean(),
        "rollout_log_ppl": -roll.mean(),
        "log_ppl_diff": diff.mean(),
        "log_ppl_abs_diff": np.abs(diff).mean(),
        "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(),
        "ppl_ratio": np.exp(diff).mean(),
        "chi2_token": mm(np.exp(np.clip(x, -20, 20)) ** 2) - 1,
        "chi2_seq": np.exp(2 * np.clip((x * MASK).sum(-1), -20, 20)).mean() - 1,
    }


def assert_metrics(metrics, expected):
    expected = {rc.METRIC_PREFIX + k: v for k, v in {**expected, **ref_offpolicy()}.items()}
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[key], value, rtol=2e-5, atol=1e-6, err_msg=key)


# ---------------------------------------------------------------- the computation


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", [False, True])
def test_is_weights_truncation_normalisation_and_metrics(level, normalize):
    old, rollout = log_probs()
    weights, mask, metrics = rc.compute_rollout_correction(
        old, rollout, MASK, rollout_is=level, rollout_is_threshold=1.5,
        rollout_is_batch_normalize=normalize,
    )  # fmt: skip
    ref_weights, ref_metrics = ref_is(level, 1.5, normalize)
    assert (ref_weights > 0).any() and metrics["rollout_corr/rollout_is_ratio_fraction_high"] > 0
    close(weights, ref_weights, 1e-5)
    np.testing.assert_array_equal(np.asarray(mask), MASK)
    assert_metrics(metrics, ref_metrics)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("normalize", [False, True])
def test_icepop_zeroes_the_weights_outside_its_bounds(level, normalize):
    """Current verl's "lower_upper" rollout_is_threshold: tokens (or rows) whose weight leaves
    [lower, upper] keep their place in the mask with weight 0; the others keep their weight."""
    old, rollout = log_probs()
    weights, mask, metrics = rc.compute_rollout_correction(
        old, rollout, MASK, rollout_is=level, rollout_is_threshold="0.9_1.2",
        rollout_is_batch_normalize=normalize,
    )  # fmt: skip
    ref_weights, ref_metrics = ref_is(level, 1.2, normalize, icepop_lower=0.9)
    zeroed = VALID & (ref_weights == 0)
    assert zeroed.any() and (VALID & (ref_weights > 0)).any()
    assert 0 < metrics["rollout_corr/rollout_is_oob_ratio"] < 1
    close(weights, ref_weights, 1e-5)
    np.testing.assert_array_equal(np.asarray(mask), MASK)
    assert_metrics(metrics, ref_metrics)


def test_is_threshold_specs():
    assert cs.is_bounds(2.0) == (2.0, None) and cs.is_bounds("3") == (3.0, None)
    assert cs.is_bounds("0.5_4.0") == (4.0, 0.5)
    for spec, message in [
        ("4_0.5", "lower bound is above"), ("0_2", "must be positive"), ("a_b", "not a number"),
        (True, "not a number"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            cs.is_bounds(spec)


THRESHOLDS = {"k1": "0.8_1.3", "k2": 0.02, "k3": 0.03}


@pytest.mark.parametrize("option", cs.RS_OPTIONS)
def test_each_rejection_criterion(option):
    old, rollout = log_probs()
    spec = THRESHOLDS[option[-2:]]
    if option.startswith("seq_sum"):
        spec = "0.3_3.0" if option.endswith("k1") else 0.1
    weights, mask, metrics = rc.compute_rollout_correction(
        old, rollout, MASK, rollout_rs=option, rollout_rs_threshold=spec
    )
    ref_mask, ref_metrics = ref_rs([(option, _b(spec))])
    assert weights is None and 0 < ref_mask.sum() < MASK.sum()
    np.testing.assert_array_equal(np.asarray(mask), ref_mask)
    assert np.asarray(mask).dtype == MASK.dtype
    assert_metrics(metrics, ref_metrics)


def _b(spec):
    if isinstance(spec, str):
        lo, hi = spec.split("_")
        return float(lo), float(hi)
    return None, spec


def test_chained_criteria_with_duplicates_and_is():
    old, rollout = log_probs()
    weights, mask, metrics = rc.compute_rollout_correction(
        old, rollout, MASK, rollout_is="token", rollout_is_threshold=2.0,
        rollout_rs="token_k1, seq_max_k3,token_k1", rollout_rs_threshold="0.8_1.3,0.1",
    )  # fmt: skip
    ref_mask, ref_metrics = ref_rs([("token_k1", (0.8, 1.3)), ("seq_max_k3", (None, 0.1))])
    ref_weights, is_metrics = ref_is("token", 2.0, False)
    np.testing.assert_array_equal(np.asarray(mask), ref_mask)
    close(weights, ref_weights, 1e-5)  # rejected tokens keep their weight; the mask drops them
    assert_metrics(metrics, {**ref_metrics, **is_metrics})


def test_thresholds_parse_and_errors():
    assert cs.rs_thresholds(("token_k1", "seq_mean_k3"), 2.0) == ((0.5, 2.0), (None, 2.0))
    assert cs.rs_thresholds(("seq_sum_k1",), "0.9_1.2") == ((0.9, 1.2),)
    assert cs.rs_options("seq_mean_k2,,seq_mean_k2") == ("seq_mean_k2",)
    for options, spec, match in [
        (("token_k2",), "0.5_2", "one upper bound"),
        (("token_k1",), "0_2", "positive"),
        (("token_k1",), None, "required"),
        (("token_k1", "token_k2", "token_k3"), "1,2", "one per rollout_rs"),
        (("token_k2",), "big", "not a number"),
    ]:
        with pytest.raises(ValueError, match=match):
            cs.rs_thresholds(options, spec)
    with pytest.raises(ValueError, match="unknown criteria.*seq_max_k1"):
        cs.rs_options("token_k1,seq_max_k1")


def test_identical_policies_and_all_masked_input():
    old, _ = log_probs()
    weights, mask, metrics = rc.compute_rollout_correction(old, old, MASK, rollout_is="sequence")
    close(weights, MASK)
    for key in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff"):
        close(metrics[f"rollout_corr/{key}"], 0.0, 1e-6)
    with pytest.raises(ValueError, match="at least one valid"):
        rc.compute_rollout_correction(old, old, np.zeros_like(MASK), rollout_is="token")


# ---------------------------------------------------------------- the trainer's step and spellings


def config(*overrides):
    return load_config([f"--config={GRPO}:tiny", LOG_PROBS, *overrides])[0]


def step(cfg, batch=None):
    old, rollout = log_probs()
    batch = batch or Batch(
        {"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": MASK}
    )
    return rollout_correction(batch, resolve_algorithm(cfg).rollout_correction)


def test_current_spelling_in_the_trainer_step():
    batch, metrics = step(
        config(
            f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_rs=seq_mean_k1",
            f"{RC}.rollout_rs_threshold=0.8_1.3",
        )
    )
    ref_mask, _ = ref_rs([("seq_mean_k1", (0.8, 1.3))])
    np.testing.assert_array_equal(batch.tensors["response_mask"], ref_mask)
    close(batch.tensors["rollout_is_weights"], ref_is("sequence", 2.0, False)[0], 1e-5)
    assert "rollout_corr/rollout_rs_seq_mean_k1_mean" in metrics
    batch, metrics = step(config())  # defaults: verl still logs the off-policy metrics
    assert "rollout_is_weights" not in batch.tensors
    assert set(metrics) == {rc.METRIC_PREFIX + k for k in ref_offpolicy()}


def test_the_in_reward_kl_runs_before_rejection_takes_tokens_out():
    """verl applies the in-reward KL over the response mask as generated, then rollout
    rejection: a rejected token keeps its KL penalty in token_level_rewards (GRPO sums them)."""
    cfg = config(
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.kl_coef=0.5",
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold=0.8_1.3",
    )
    algorithm = resolve_algorithm(cfg)
    old, rollout = log_probs()
    reference = old + rand(7, old.shape, 0.1)
    batch = Batch(
        {
            "old_log_probs": old,
            "rollout_log_probs": rollout,
            "ref_log_prob": reference,
            "response_mask": MASK,
            "token_level_scores": np.zeros(MASK.shape, np.float32),
        },
        {"uid": np.arange(B).astype(str).astype(object)},
    )
    kl_ctrl = algos.get_kl_controller(algorithm.kl_in_reward.kl_ctrl)
    out, metrics = advantage_phase(batch, algorithm, kl_ctrl, bypass=False)
    rejected = VALID & (out.tensors["response_mask"] == 0)
    assert rejected.any() and "actor/reward_kl_penalty" in metrics
    penalty = -0.5 * (old - reference) * MASK  # kl_penalty "kl": old - ref, on every real token
    close(out.tensors["token_level_rewards"], penalty, 1e-6)


def test_both_spellings_compute_the_same():
    old_batch, old_metrics = step(
        config("algorithm.rollout_is=True", "algorithm.rollout_is_threshold=2.0")
    )
    new_batch, new_metrics = step(config(f"{RC}.rollout_is=token"))
    close(old_batch.tensors["rollout_is_weights"], new_batch.tensors["rollout_is_weights"], 1e-7)
    shared = [k for k in new_metrics if k.startswith("rollout_corr/rollout_is")]
    assert len(shared) == 14
    for key in shared:
        close(old_metrics[key.replace("rollout_corr/", "mismatch/")], new_metrics[key], 1e-7)
    for key in ref_offpolicy():
        close(old_metrics[f"mismatch/mismatch_{key}"], new_metrics[f"rollout_corr/{key}"], 1e-7)


def test_actor_level_spelling_acts():
    keys = ("rollout_is=True", "rollout_is_threshold=2.0", "rollout_is_level=geometric")
    on_algorithm, _ = step(config(*(f"algorithm.{k}" for k in keys)))
    on_actor, metrics = step(config(*(f"actor_rollout_ref.actor.{k}" for k in keys)))
    assert "mismatch/rollout_is_mean" in metrics
    close(on_actor.tensors["rollout_is_weights"], on_algorithm.tensors["rollout_is_weights"], 0)
    both, _ = step(
        config(*(f"algorithm.{k}" for k in keys), "actor_rollout_ref.actor.rollout_is=True")
    )
    close(both.tensors["rollout_is_weights"], on_algorithm.tensors["rollout_is_weights"], 0)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.rollout_is_threshold=2.0", f"{RC}.rollout_is=token"],
         rf"algorithm.rollout_is_threshold \(verl v0.6\) and {RC}.rollout_is \(current"),
        (["actor_rollout_ref.actor.rollout_is_threshold=2.0", f"{RC}.rollout_rs=token_k2",
          f"{RC}.rollout_rs_threshold=0.1"],
         rf"actor_rollout_ref.actor.rollout_is_threshold \(verl v0.6\) and {RC}.rollout_rs "),
        (["algorithm.rollout_is_threshold=2.0", "actor_rollout_ref.actor.rollout_is_threshold=3.0"],
         "algorithm.rollout_is_threshold=2.0 and actor_rollout_ref.actor.rollout_is_threshold=3.0 "
         "disagree"),
        ([f"{RC}.rollout_is=geometric"], "'geometric' is not supported; use one of token, seq"),
        ([f"{RC}.rollout_rs=token_k4", f"{RC}.rollout_rs_threshold=1.0"], "criteria.*token_k4"),
        ([f"{RC}.rollout_rs=token_k2", f"{RC}.rollout_rs_threshold=0.5_1"], "one upper bound"),
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2.0_0.5"], "lower bound of"),
        ([f"{RC}.rollout_rs=token_k2"], "rollout_rs_threshold is required"),
        ([f"{RC}.rollout_rs_threshold=0.1"], "rollout_rs_threshold has no effect without"),
        ([f"{RC}.loss_type=pg"], "loss_type='pg' is not supported; use one of ppo_clip, reinforce"),
        ([f"{RC}.loss_type=reinforce"], "loss_type only applies with"),
        ([f"{RC}.bypass_mode=True", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
         "bypass_mode=True replaces actor_rollout_ref.actor.policy_loss.loss_mode='gspo'"),
        ([f"{RC}.rollout_is_batch_normalize=True"], "rollout_is_batch_normalize has no effect"),
        ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=null"], "needs a positive"),
        ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=2.0_1.0"], "lower bound is above"),
        (["algorithm.rollout_is_level=seq", "algorithm.rollout_is_threshold=2.0"],
         "rollout_is_level='seq' is not supported; use one of token, sequence, geometric"),
        (["actor_rollout_ref.actor.rollout_is_mode=clip", "algorithm.rollout_is_threshold=2.0"],
         "actor_rollout_ref.actor.rollout_is_mode='clip' is not supported; use one of truncate"),
        (["algorithm.rollout_is_mode=mask"], "rollout_is_mode has no effect without"),
    ],
)  # fmt: skip
def test_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        config(*overrides)


def test_log_probs_required_at_load():
    for key in (
        f"{RC}.rollout_is=token",
        "algorithm.rollout_is_threshold=2.0",
        f"{RC}.bypass_mode=True",
    ):
        with pytest.raises(ConfigError, match="calculate_log_probs=True"):
            load_config([f"--config={GRPO}:tiny", key])


@pytest.mark.parametrize("name", sorted(cs.PRESETS))
def test_presets_are_valid_config_values(name):
    overrides = [f"{RC}.{key}={value}" for key, value in cs.PRESETS[name].items()]
    section = config(*overrides).algorithm.rollout_correction
    assert section.rollout_is in (None, *cs.IS_LEVELS)
    assert section.rollout_rs == cs.PRESETS[name].get("rollout_rs")


# ---------------------------------------------------------------- bypass mode


def bypass_config(**correction):
    """The bypass loss's settings, as the resolver makes them."""
    options = cs.CorrectionOptions(**correction)
    return algos.PolicyLossSettings(
        loss_mode="bypass_mode", clip_ratio=0.2, clip_ratio_c=3.0, rollout_correction=options
    )


def bypass_loss(config, current, rollout, adv):
    return algos.compute_policy_loss_bypass_mode(rollout, current, adv, MASK, "token-mean", config)


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_without_weights():
    current, rollout = log_probs()  # the trainer's log-probs play the role of verl's "old"
    adv = rand(62)
    config = bypass_config(rollout_is="token", rollout_is_threshold=1.5)
    loss, metrics = bypass_loss(config, current, rollout, adv)
    vanilla, vanilla_metrics = algos.compute_policy_loss_vanilla(
        rollout, current, adv, MASK, "token-mean", config
    )
    close(loss, float(vanilla), 1e-6)
    for key, value in vanilla_metrics.items():
        close(metrics[key], float(value), 1e-6)
    expected = {**ref_is("token", 1.5, False)[1], **ref_offpolicy()}
    correction = {k: v for k, v in metrics.items() if k.startswith(rc.METRIC_PREFIX)}
    assert set(correction) == {rc.METRIC_PREFIX + k for k in expected}
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[rc.METRIC_PREFIX + key], value, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("level", [None, "sequence"])
def test_bypass_reinforce_weights_the_policy_gradient(level):
    current, rollout = log_probs()
    adv = rand(63)
    config = bypass_config(rollout_is=level, loss_type="reinforce")
    weights = ref_is(level, 2.0, False)[0] if level else np.ones_like(MASK)
    loss, metrics = bypass_loss(config, current, rollout, adv)
    close(loss, ref_agg(-adv * current * weights, MASK, "token-mean"), 1e-5)
    close(metrics["actor/ppo_kl"], mm(rollout.astype(np.float64) - current), 1e-5)
    grad = jax.grad(lambda lp: bypass_loss(config, lp, rollout, adv)[0])(jnp.asarray(current))
    close(grad, -adv * weights * MASK / MASK.sum(), 1e-6)  # the weights carry no gradient


def test_bypass_config_selects_the_bypass_loss():
    cfg = config(f"{RC}.bypass_mode=True", f"{RC}.rollout_is=sequence", f"{RC}.loss_type=reinforce")
    loss = ActorLoss.resolve(resolve_algorithm(cfg), 1.0, "naive")
    assert loss.policy_loss.loss_mode == "bypass_mode"
    assert loss.policy_loss.rollout_correction == cs.CorrectionOptions(
        rollout_is="sequence", loss_type="reinforce"
    )
    plain = ActorLoss.resolve(resolve_algorithm(config()), 1.0, "naive")
    assert (plain.policy_loss.loss_mode, plain.policy_loss.rollout_correction) == ("vanilla", None)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_rejection_drops_tokens_from_the_policy_loss(loss_type):
    """verl's bypass loss alone: the rejection mask of the current vs the rollout's log-probs is
    the loss mask (numerator and divisor); the rejection metrics are verl's."""
    current, rollout = log_probs()
    adv = rand(64)
    criteria = [("token_k2", (None, 0.02)), ("seq_max_k2", (None, 5.0))]
    config = bypass_config(
        rollout_rs="token_k2,seq_max_k2", rollout_rs_threshold="0.02,5.0", loss_type=loss_type
    )
    loss, metrics = bypass_loss(config, current, rollout, adv)
    kept, expected = ref_rs(criteria)
    assert 0 < kept.sum() < MASK.sum()
    if loss_type == "ppo_clip":
        reference, _ = algos.compute_policy_loss_vanilla(
            rollout, current, adv, jnp.asarray(kept), "token-mean", config
        )
    else:
        reference = ref_agg(-adv * current, kept, "token-mean")
    close(loss, float(reference), 1e-5)
    for key, value in expected.items():
        np.testing.assert_allclose(metrics[rc.METRIC_PREFIX + key], value, rtol=2e-5, atol=1e-6)


def test_bypass_rejection_in_the_actor_keeps_the_mini_batch_normaliser():
    """In the trainer's actor, a rejected token adds nothing to the policy loss and the divisor
    stays the mini-batch's token count (verl's global_batch_info), however it is split."""
    from helpers import tiny_llama

    from jrl.models import init_random
    from jrl.trainer.roles.log_probs import response_log_probs
    from jrl.trainer.update.learner import normalisers

    model = init_random(tiny_llama(), seed=1)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (4, 8)).astype(np.int32)
    batch = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.tile(np.arange(8, dtype=np.int32), (4, 1)),
        "responses": ids[:, 4:],
        "response_mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], "f4"),
        "advantages": rng.standard_normal((4, 4)).astype(np.float32),
    }
    current = np.asarray(response_log_probs(model, batch, 1.0, None, impl="naive")[0])
    batch["old_log_probs"] = current + rng.normal(0.0, 0.3, (4, 4)).astype(np.float32)
    cfg = config(
        f"{RC}.bypass_mode=True",
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold=0.8_1.2",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
    )
    loss = ActorLoss.resolve(resolve_algorithm(cfg), 1.0, "naive")
    mask = batch["response_mask"]
    log_ratio = current - batch["old_log_probs"]
    k1 = -log_ratio  # kept within [log 0.8, log 1.2]
    kept = mask * (k1 >= math.log(0.8)) * (k1 <= math.log(1.2))
    assert 0 < kept.sum() < mask.sum()
    ratio = np.exp(log_ratio)
    adv = batch["advantages"]
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2))  # no dual clip at these ratios
    expected = (pg * kept).sum() / mask.sum()
    norm = normalisers(mask, None)
    whole, _ = loss(model, batch, norm)
    halves = sum(loss(model, {k: v[i : i + 2] for k, v in batch.items()}, norm)[0] for i in (0, 2))
    close(whole, expected, 1e-5)
    close(halves, expected, 1e-5)
