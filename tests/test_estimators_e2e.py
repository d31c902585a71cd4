"""Every advantage estimator and policy loss runs end to end on the `:tiny` preset (one step)."""

from __future__ import annotations

import math

import pytest

from jrl import train

ONE_STEP = [
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
]


def _run(tmp_path, card: str, *overrides: str) -> dict[str, float]:
    argv = [f"--config=configs/{card}.py:tiny", f"trainer.default_local_dir={tmp_path}"]
    return train.main([*argv, *ONE_STEP, *overrides])


def _assert_finite(metrics: dict[str, float], *keys: str) -> None:
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/advantages/mean", *keys):
        assert math.isfinite(metrics[key]), (key, metrics[key])


@pytest.mark.parametrize(
    "estimator",
    [
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "rloo",
        "rloo_vectorized",
        "opo",
        "gpg",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "reward",
        "none",
    ],
)
def test_every_group_estimator_runs(estimator, tmp_path):
    metrics = _run(tmp_path, "gsm8k_grpo", f"algorithm.adv_estimator={estimator}")
    _assert_finite(metrics)
    if estimator == "remax":
        assert "timing_s/gen_max" in metrics


def test_gae_with_critic_and_kl_in_reward(tmp_path):
    metrics = _run(
        tmp_path, "gsm8k_ppo", "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive"
    )
    _assert_finite(
        metrics, "critic/vf_loss", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"
    )


@pytest.mark.parametrize(
    "loss_mode", ["gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]
)
def test_every_policy_loss_runs(loss_mode, tmp_path):
    metrics = _run(
        tmp_path, "gsm8k_grpo", f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"
    )
    _assert_finite(metrics)


def test_rollout_importance_sampling_runs(tmp_path):
    metrics = _run(
        tmp_path,
        "gsm8k_grpo",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.rollout_is=True",
        "algorithm.rollout_is_threshold=2.0",
        "algorithm.rollout_is_mode=mask",
    )
    _assert_finite(metrics, "mismatch/rollout_is_mean")


def test_bypass_mode_skips_the_old_log_prob_pass_and_trains_alike(tmp_path):
    """On-policy (one mini-batch, one epoch) the old log-probs are the current ones either way,
    so bypass mode (ppo_clip) makes the same update without the old-log-prob pass."""
    log_probs = "actor_rollout_ref.rollout.calculate_log_probs=True"
    plain = _run(tmp_path / "plain", "gsm8k_grpo", log_probs)
    bypass = _run(
        tmp_path / "bypass",
        "gsm8k_grpo",
        log_probs,
        "algorithm.rollout_correction.bypass_mode=True",
    )
    _assert_finite(bypass)
    assert "timing_s/old_log_prob" in plain and "timing_s/old_log_prob" not in bypass
    assert "actor/entropy" not in bypass
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac"):
        assert math.isclose(bypass[key], plain[key], rel_tol=1e-5, abs_tol=1e-7), key
    assert bypass["rollout_corr/kl"] == 0.0  # on-policy: verl's actor compares π_θ with itself


def test_bypass_mode_with_rejection_sampling_runs(tmp_path):
    """Off-policy (two epochs) bypass mode with a rejection criterion: the run trains and reports
    the rejection metrics (their formulas: tests/test_rollout_correction.py)."""
    metrics = _run(
        tmp_path,
        "gsm8k_grpo",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "algorithm.rollout_correction.bypass_mode=True",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    )
    _assert_finite(metrics, "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl")
