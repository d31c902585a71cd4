"""jrl.algos against straightforward numpy loops written from the formulas (float64)."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from reference import (
    MASK,
    UIDS,
    B,
    R,
    close,
    outcome_rewards,
    rand,
    ref_agg,
    ref_gae,
    ref_grpo,
    ref_masked_mean,
    ref_whiten,
)

from jrl import algos

MODES = algos.LOSS_AGG_MODES


# ---------------------------------------------------------------- numpy references
# (those other test modules use too are in reference.py)


def ref_vanilla(old, new, adv, lo, hi, c, weights):
    loss, clipfrac, clipfrac_lower = np.zeros((B, R)), np.zeros((B, R)), np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            a = float(adv[i, t])
            ratio = math.exp(min(max(float(new[i, t]) - float(old[i, t]), -20), 20))
            l1, l2 = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
            lc = max(l1, l2)
            l3 = -a * c
            loss[i, t] = (min(l3, lc) if a < 0 else lc) * weights[i, t]
            clipfrac[i, t] = l2 > l1
            clipfrac_lower[i, t] = a < 0 and lc > l3
    return loss, clipfrac, clipfrac_lower


def ref_kl(lp, ref, name):
    d = lp.astype(np.float64) - ref
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return np.abs(d)
    if name in ("mse", "k2"):
        return 0.5 * d**2
    x = np.clip(-d, -20, 20)
    return np.clip(np.exp(x) - x - 1, -10, 10)


# ---------------------------------------------------------------- helpers


def test_masked_helpers_match_formulas():
    x = rand(0)
    close(algos.masked_mean(x, MASK), ref_masked_mean(x, MASK))
    valid = x[MASK > 0].astype(np.float64)
    close(algos.masked_var(x, MASK), np.var(valid, ddof=1))
    close(algos.masked_var(x, MASK, unbiased=False), np.var(valid), 1e-5)
    close(algos.masked_whiten(x, MASK), ref_whiten(x, MASK), 1e-4)
    close(algos.masked_whiten(x, MASK, shift_mean=False), ref_whiten(x, MASK) + valid.mean(), 1e-4)
    close(algos.masked_mean(x, MASK, axis=-1), (x * MASK).sum(-1) / (MASK.sum(-1) + 1e-8))
    # NaN/inf under the mask are ignored.
    dirty = np.where(MASK > 0, x, np.nan)
    close(algos.masked_mean(dirty, MASK), ref_masked_mean(x, MASK))


def test_masked_var_and_whiten_stay_finite_below_two_tokens():
    x = rand(1)
    for count in (0, 1):
        mask = np.zeros_like(MASK)
        mask[0, :count] = 1
        assert np.isfinite(float(algos.masked_var(x, mask)))
        whitened = np.asarray(algos.masked_whiten(x, mask))
        assert np.isfinite(whitened).all()
        if count:
            assert abs(whitened[0, 0]) < 1e-3


# ---------------------------------------------------------------- advantages


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95)])
def test_gae_matches_loop(gamma, lam):
    rewards, values = rand(2), rand(3)
    advantages, returns = algos.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=MASK, gamma=gamma, lam=lam
    )
    ref_adv, ref_ret = ref_gae(rewards, values, MASK, gamma, lam)
    close(returns, ref_ret, 1e-4)
    close(advantages, ref_adv, 1e-4)
    assert algos.get_adv_estimator_fn("gae") is algos.compute_gae_advantage_return


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop(norm):
    rewards = outcome_rewards(np.array([1.0, 0.5, 0.0, 0.7, 0.5, 0.0, 2.0, -1.0]))
    rewards[0, :3] += rand(4)[0, :3]  # a dense reward on one row
    advantages, returns = algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards,
        response_mask=MASK,
        index=UIDS,
        norm_adv_by_std_in_grpo=norm,
    )
    expected = ref_grpo(rewards, MASK, list(UIDS), 1e-6, norm)
    close(advantages, expected, 1e-4)
    np.testing.assert_array_equal(np.asarray(advantages), np.asarray(returns))
    assert np.all(np.asarray(advantages)[1] == 0) and np.all(np.asarray(advantages)[4] == 0)
    close(advantages[3, 0], 0.7 / (1 + 1e-6) if norm else 0.7)  # singleton: s/(1+eps)


def test_grpo_with_one_sample_per_prompt():
    rewards = outcome_rewards(np.arange(B, dtype=np.float32))
    advantages, _ = algos.compute_grpo_outcome_advantage(rewards, MASK, np.arange(B))
    close(advantages, ref_grpo(rewards, MASK, list(range(B)), 1e-6, True), 1e-5)


def test_group_ids_to_segments_and_bad_index():
    ids, groups = algos.group_ids_to_segments(UIDS)
    assert groups == 4 and ids.dtype == np.int32
    for i in range(B):
        for j in range(B):
            assert (ids[i] == ids[j]) == (UIDS[i] == UIDS[j])
    with pytest.raises(ValueError, match="one id per row"):
        algos.group_ids_to_segments(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="4 group ids but token_level_rewards has 8 rows"):
        algos.compute_grpo_outcome_advantage(rand(5), MASK, UIDS[:4])


def test_registries_list_known_names():
    assert algos.get_adv_estimator_fn("grpo") is algos.compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="algorithm.adv_estimator.*registered: gae, gpg, grpo"):
        algos.get_adv_estimator_fn("nope")
    assert algos.get_policy_loss_fn("vanilla") is algos.compute_policy_loss_vanilla
    assert algos.get_policy_loss_terms_fn("vanilla") is algos.policy_loss_terms_vanilla
    with pytest.raises(ValueError, match="registered: bypass_mode, cispo, clip_cov, .*, vanilla"):
        algos.get_policy_loss_fn("ppo")
    with pytest.raises(ValueError, match="already registered"):
        algos.register_adv_est("gae")(lambda **kwargs: None)


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_matches_loop(mode):
    loss = rand(6)
    close(algos.agg_loss(loss, MASK, mode), ref_agg(loss, MASK, mode), 1e-5)
    close(algos.agg_loss(loss, MASK, mode, 3.0), ref_agg(loss, MASK, mode, 3.0), 1e-5)
    assert float(algos.agg_loss(loss, np.zeros_like(MASK), mode)) == 0.0
    close(algos.agg_loss(loss, MASK.astype(bool), mode), ref_agg(loss, MASK, mode), 1e-5)


def test_agg_loss_rejects_bad_mode_and_factor():
    with pytest.raises(ValueError, match="loss_agg_mode 'mean'.*token-mean"):
        algos.agg_loss(rand(6), MASK, "mean")
    with pytest.raises(ValueError, match="loss_scale_factor must be positive"):
        algos.agg_loss(rand(6), MASK, "seq-mean-token-sum-norm", 0)


@pytest.mark.parametrize("mode", MODES)
def test_accumulation_over_micro_batches_is_exact(mode):
    loss = rand(7)
    whole = float(algos.agg_loss(loss, MASK, mode))
    denominator = algos.global_denominator(MASK, mode)
    for splits in (1, 2, 4):
        terms = [
            algos.agg_loss_terms(lc, mc, mode)
            for lc, mc in zip(np.split(loss, splits), np.split(MASK, splits), strict=True)
        ]
        close(sum(float(n) for n, _ in terms) / float(denominator), whole, 1e-5)
        if mode != "seq-mean-token-sum-norm":
            close(sum(float(d) for _, d in terms), float(denominator))


@pytest.mark.parametrize("mode", MODES)
def test_accumulated_policy_gradient_equals_whole_batch_gradient(mode):
    old, adv = rand(8, scale=0.3), rand(9)
    config = algos.PolicyLossSettings(clip_ratio=0.2, clip_ratio_c=3.0)
    new = old + rand(10, scale=0.3)
    terms_fn = algos.get_policy_loss_terms_fn("vanilla")

    def whole(lp):
        return algos.compute_policy_loss_vanilla(old, lp, adv, MASK, mode, config)[0]

    def accumulated(lp):
        denominator = algos.global_denominator(MASK, mode)
        total = 0.0
        for rows in np.split(np.arange(B), 2):
            rows_in = algos.PolicyInputs(old[rows], lp[rows], adv[rows], MASK[rows])
            terms = terms_fn(rows_in, config)
            total += algos.agg_loss_terms(terms.loss_mat, MASK[rows], mode)[0] / denominator
        return total

    close(jax.grad(accumulated)(jnp.asarray(new)), jax.grad(whole)(jnp.asarray(new)), 1e-5)


# ---------------------------------------------------------------- policy / value / entropy losses


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_vanilla_policy_loss_matches_loop(mode):
    old, adv = rand(11), rand(12)
    new = old + rand(13, scale=0.5)
    new[0, 0] = old[0, 0] + 30.0  # exercises the ±20 log-ratio clamp
    weights = np.abs(rand(14)) + 0.5
    config = algos.PolicyLossSettings(
        clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28, clip_ratio_c=3.0
    )
    loss, metrics = algos.compute_policy_loss_vanilla(
        old_log_prob=old,
        log_prob=new,
        advantages=adv,
        response_mask=MASK,
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights,
    )
    ref_loss, clipfrac, lower = ref_vanilla(old, new, adv, 0.2, 0.28, 3.0, weights)
    assert clipfrac[MASK > 0].any() and lower[MASK > 0].any()
    close(loss, ref_agg(ref_loss, MASK, mode), 1e-4)
    close(metrics["actor/pg_clipfrac"], ref_masked_mean(clipfrac, MASK))
    close(metrics["actor/pg_clipfrac_lower"], ref_masked_mean(lower, MASK))
    ppo_kl = np.clip(new.astype(np.float64) - old, -20, 20)
    close(metrics["actor/ppo_kl"], ref_masked_mean(-ppo_kl, MASK), 1e-4)


def test_legacy_policy_loss_entry_and_config_errors():
    old, adv = rand(11), rand(12)
    new = old + rand(13, scale=0.5)
    loss, clipfrac, ppo_kl, lower = algos.compute_policy_loss(
        old, new, adv, MASK, cliprange=0.2, cliprange_high=0.28
    )
    ones = np.ones_like(old)
    ref_loss, ref_clipfrac, ref_lower = ref_vanilla(old, new, adv, 0.2, 0.28, 3.0, ones)
    close(loss, ref_agg(ref_loss, MASK, "token-mean"), 1e-4)
    close(clipfrac, ref_masked_mean(ref_clipfrac, MASK))
    close(lower, ref_masked_mean(ref_lower, MASK))
    close(ppo_kl, ref_masked_mean(old.astype(np.float64) - new, MASK), 1e-4)
    with pytest.raises(ValueError, match="clip_ratio_c must be greater than 1"):
        algos.compute_policy_loss(old, new, adv, MASK, cliprange=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="needs the actor config"):
        algos.compute_policy_loss_vanilla(old, new, adv, MASK)


def test_value_loss_matches_loop():
    vpreds, returns, values = rand(15), rand(16), rand(17)
    vf_loss, vf_clipfrac = algos.compute_value_loss(
        vpreds=vpreds, returns=returns, values=values, response_mask=MASK, cliprange_value=0.5
    )
    per_token, clipped_more = np.zeros((B, R)), np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            v, ret, old = float(vpreds[i, t]), float(returns[i, t]), float(values[i, t])
            v_clip = min(max(v, old - 0.5), old + 0.5)
            per_token[i, t] = max((v - ret) ** 2, (v_clip - ret) ** 2)
            clipped_more[i, t] = (v_clip - ret) ** 2 > (v - ret) ** 2
    assert clipped_more[MASK > 0].any()
    close(vf_loss, 0.5 * ref_agg(per_token, MASK, "token-mean"), 1e-5)
    close(vf_clipfrac, ref_masked_mean(clipped_more, MASK))


def test_entropy_and_logprobs_match_loop():
    logits = rand(18, (B, R, 5), scale=3.0)
    labels = np.random.default_rng(19).integers(0, 5, (B, R))
    z = logits.astype(np.float64)
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    entropy = -(np.exp(log_softmax) * log_softmax).sum(-1)
    close(algos.entropy_from_logits(logits), entropy, 1e-5)
    picked = np.take_along_axis(log_softmax, labels[..., None], -1)[..., 0]
    close(algos.logprobs_from_logits(logits, labels), picked, 1e-5)
    assert algos.logprobs_from_logits(logits.astype(jnp.bfloat16), labels).dtype == jnp.float32
    close(algos.compute_entropy_loss(logits, MASK), ref_agg(entropy, MASK, "token-mean"), 1e-5)


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_estimators_match_formulas(name):
    lp, ref = rand(20, scale=2.0), rand(21, scale=2.0)
    lp[0, :2] = [-40.0, 40.0]  # k3 clamps (input ±20, output ±10)
    close(algos.kl_penalty(lp, ref, name), ref_kl(lp, ref, name), 1e-5)


def test_kl_penalty_rejects_full_and_unknown():
    lp = rand(20)
    with pytest.raises(NotImplementedError, match="full"):
        algos.kl_penalty(lp, lp, "full")
    with pytest.raises(ValueError, match="Unknown kl_penalty 'k4'.*low_var_kl"):
        algos.kl_penalty(lp, lp, "k4")


@pytest.mark.parametrize("name", ["k1+", "abs+", "low_var_kl+", "k3+"])
def test_plus_kl_has_forward_value_and_k2_gradient(name):
    lp, ref = rand(22), rand(23)
    close(algos.kl_penalty(lp, ref, name), ref_kl(lp, ref, name[:-1]), 1e-5)
    # the estimator's own float32 value, bit for bit (current verl's k2 - sg(k2) + sg(value))
    np.testing.assert_array_equal(
        algos.kl_penalty(lp, ref, name), algos.kl_penalty(lp, ref, name[:-1])
    )
    grad = jax.grad(lambda x: jnp.sum(algos.kl_penalty(x, ref, name)))(jnp.asarray(lp))
    close(grad, lp.astype(np.float64) - ref, 1e-5)


def test_kl_controllers():
    cfg = ml_collections.ConfigDict(
        {"type": "adaptive", "kl_coef": 0.1, "horizon": 100, "target_kl": 0.5}
    )
    ctrl = algos.get_kl_controller(cfg)
    ctrl.update(current_kl=0.55, n_steps=10)  # error 0.1
    close(ctrl.value, 0.1 * (1 + 0.1 * 10 / 100))
    ctrl.update(current_kl=5.0, n_steps=10)  # error clipped to 0.2
    close(ctrl.value, 0.1 * 1.01 * 1.02)
    fixed = algos.get_kl_controller(ml_collections.ConfigDict({"type": "fixed", "kl_coef": 0.3}))
    fixed.update(current_kl=9.0, n_steps=10)
    assert fixed.value == 0.3
    cfg.horizon = 0
    with pytest.raises(ValueError, match="horizon must be positive"):
        algos.get_kl_controller(cfg)
    cfg.type = "pid"
    with pytest.raises(ValueError, match="kl_ctrl.type 'pid'"):
        algos.get_kl_controller(cfg)


def test_apply_kl_penalty_matches_trainer_formula():
    scores, old, ref = rand(24), rand(25), rand(26)
    ctrl = algos.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=1000)
    rewards, metrics = algos.apply_kl_penalty(scores, old, ref, MASK, ctrl, kl_penalty="low_var_kl")
    kld = ref_kl(old, ref, "low_var_kl") * MASK
    close(rewards, scores - 0.2 * kld, 1e-5)
    row_kl = (kld * MASK).sum(-1) / (MASK.sum(-1) + 1e-8)
    close(metrics["actor/reward_kl_penalty"], row_kl.mean(), 1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2
    error = np.clip(row_kl.mean() / 0.1 - 1, -0.2, 0.2)
    close(ctrl.value, 0.2 * (1 + error * B / 1000))


# ---------------------------------------------------------------- jit


def test_losses_trace_under_jit():
    old, adv, new = rand(11), rand(12), rand(13)
    config = algos.PolicyLossSettings(clip_ratio=0.2)

    @jax.jit
    def step(lp):
        loss, metrics = algos.compute_policy_loss_vanilla(old, lp, adv, MASK, "token-mean", config)
        kl = algos.agg_loss(algos.kl_penalty(lp, old, "k3+"), MASK, "token-mean")
        return loss + kl, metrics

    jitted_loss, jitted_metrics = step(new)
    eager_loss, eager_metrics = algos.compute_policy_loss_vanilla(
        old, new, adv, MASK, "token-mean", config
    )
    eager_kl = algos.agg_loss(algos.kl_penalty(new, old, "k3+"), MASK, "token-mean")
    close(jitted_loss, float(eager_loss + eager_kl), 1e-5)
    for key, value in eager_metrics.items():
        close(jitted_metrics[key], float(value), 1e-6)
