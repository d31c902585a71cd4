"""The algorithm resolver (`jrl.runspec.algorithm`): verl's keys become the typed settings of
`jrl.algos` once, with verl's null defaults, legacy spellings and bypass mode translated; users'
functions registered with verl's calling convention get their section read-only."""

import dataclasses

import numpy as np
import pytest
from reference import MASK, rand

from jrl import algos
from jrl.algos.policy_loss import clip_bounds
from jrl.algos.settings import KL_COV_COEF, SAPO_TAU_NEG
from jrl.runspec import load_config
from jrl.runspec.algorithm import AlgorithmSpec, resolve_algorithm

GRPO = "--config=configs/gsm8k_grpo.py:tiny"
PPO = "--config=configs/gsm8k_ppo.py:tiny"
ACTOR = "actor_rollout_ref.actor"
RC = "algorithm.rollout_correction"
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=True"


def resolved(*argv: str) -> AlgorithmSpec:
    return resolve_algorithm(load_config(list(argv))[0])


@pytest.fixture
def registries(monkeypatch):
    """The estimator and per-token loss registries; what a test registers is gone after it."""
    for registry in (algos.ADV_ESTIMATORS, algos.POLICY_LOSS_TERMS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))


def test_the_cards_resolve_to_their_algorithms():
    grpo = resolved(GRPO)
    assert grpo.estimator is algos.get_adv_estimator("grpo")
    assert grpo.estimator_options == algos.EstimatorOptions(norm_adv_by_std_in_grpo=True)
    assert grpo.estimator_config is None and grpo.kl_in_reward is None
    assert grpo.kl_loss == algos.KLLoss(0.001, "low_var_kl")
    # vanilla reads the clip range (clip_ratio only as the fallback of a null bound)
    assert grpo.policy_loss == algos.PolicyLossSettings(clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert grpo.rollout_correction.legacy is None and not grpo.rollout_correction.bypass_mode
    ppo = resolved(PPO, "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive")
    assert ppo.estimator_options == algos.EstimatorOptions(gamma=1.0, lam=1.0)
    assert ppo.kl_in_reward == algos.KLInReward(
        "kl", algos.KLControl("adaptive", 0.005, 0.1, 10000)
    )
    assert ppo.kl_loss is None


def test_null_loss_options_keep_the_loss_defaults():
    mode = f"{ACTOR}.policy_loss.loss_mode"
    kl_cov = resolved(GRPO, f"{mode}=kl_cov", f"{ACTOR}.policy_loss.ppo_kl_coef=null")
    sapo = resolved(GRPO, f"{mode}=sapo", f"{ACTOR}.tau_neg=null")
    assert (kl_cov.policy_loss.ppo_kl_coef, sapo.policy_loss.tau_neg) == (KL_COV_COEF, SAPO_TAU_NEG)
    settings = resolved(GRPO, f"{ACTOR}.clip_ratio_low=null").policy_loss
    assert settings.clip_ratio_low is None  # falls back to clip_ratio in the loss
    assert clip_bounds(settings) == (0.2, 0.2)


def test_rollout_correction_spellings_and_bypass():
    on_actor = resolved(
        GRPO, LOG_PROBS, f"{ACTOR}.rollout_is_threshold=1.5", f"{ACTOR}.rollout_is_level=geometric"
    ).rollout_correction
    assert on_actor.legacy == algos.LegacyRolloutIS(False, 1.5, None, "geometric", "truncate", None)
    bypass = resolved(GRPO, LOG_PROBS, f"{RC}.bypass_mode=True", f"{RC}.loss_type=reinforce")
    assert bypass.rollout_correction.bypass_mode
    assert bypass.policy_loss.loss_mode == "bypass_mode"
    assert bypass.policy_loss.rollout_correction == algos.CorrectionOptions(loss_type="reinforce")


def test_users_verl_style_functions_get_their_section(registries):
    seen = {}

    @algos.register_adv_est("verl_style")
    def verl_style(token_level_rewards, response_mask, index, config=None):
        seen["gamma"] = (config.gamma, config["gamma"], config.kl_ctrl.type)
        return np.zeros_like(token_level_rewards), np.zeros_like(token_level_rewards)

    @algos.register_policy_loss_terms("verl_style_loss")
    def verl_style_loss(old, log_prob, advantages, mask, config, rollout_is_weights=None):
        seen["loss"] = (config.clip_ratio, config.policy_loss.loss_mode)
        return algos.LossTerms(-advantages * log_prob, {})

    spec = resolved(
        GRPO,
        "algorithm.adv_estimator=verl_style",
        "algorithm.gamma=0.5",
        f"{ACTOR}.policy_loss.loss_mode=verl_style_loss",
    )
    assert spec.estimator.follows_verl and spec.estimator_options == algos.EstimatorOptions()
    hash(spec.policy_loss)  # the learner keys its compiled update by the loss
    algos.compute_advantage(
        "verl_style",
        token_level_rewards=rand(80),
        response_mask=MASK,
        options=spec.estimator_options,
        config=spec.estimator_config,
        index=np.arange(len(MASK)),
    )
    algos.policy_loss_terms(spec.policy_loss, rand(81), rand(82), rand(83), MASK)
    assert seen == {"gamma": (0.5, 0.5, "fixed"), "loss": (0.2, "verl_style_loss")}
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.policy_loss.clip_ratio = 0.3
    with pytest.raises(TypeError):
        spec.estimator_config["gamma"] = 0.3
