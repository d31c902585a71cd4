"""Estimator descriptors: an estimator's registration alone tells dispatch, validation, the run's
shape and the no-effect notice what it needs and reads; verl's plain decorator keeps verl's
calling convention."""

import math
import subprocess
import sys

import numpy as np
import pytest
from reference import MASK, UIDS, B, close, rand

from jrl import algos, train
from jrl.algos.policy_loss import POLICY_LOSSES
from jrl.config import ConfigError
from jrl.config.overrides import command_line_keys
from jrl.runspec import load_config, uses_critic
from jrl.runspec.effects import ignored_settings
from jrl.runspec.spec import resolve_run

GRPO = "--config=configs/gsm8k_grpo.py:tiny"
PPO = "--config=configs/gsm8k_ppo.py:tiny"


@pytest.fixture
def registry(monkeypatch):
    """The estimator registry; what a test registers is gone after it."""
    algos.ADV_ESTIMATORS.names()  # jrl's own estimators are in before the copy
    entries = dict(algos.ADV_ESTIMATORS._entries)
    monkeypatch.setattr(algos.ADV_ESTIMATORS, "_entries", entries)
    return algos.ADV_ESTIMATORS


def test_a_registry_reached_through_its_own_module_holds_every_built_in():
    """The package imports its names lazily; each registry imports jrl's own entries itself."""
    probe = (
        "from jrl.algos.estimator import ADV_ESTIMATORS; "
        "from jrl.algos.policy_loss import POLICY_LOSSES, POLICY_LOSS_TERMS; "
        "print([r.names() for r in (ADV_ESTIMATORS, POLICY_LOSSES, POLICY_LOSS_TERMS)])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    registries = (algos.ADV_ESTIMATORS, POLICY_LOSSES, algos.POLICY_LOSS_TERMS)
    assert out.stdout.strip() == str([r.names() for r in registries])
    assert "rloo" in algos.ADV_ESTIMATORS.names() and "gspo" in POLICY_LOSSES.names()


def register_greedy_discounted(calls: list) -> None:
    """An estimator that needs a greedy baseline and reads γ: A = γ·(s - b), per row."""

    @algos.register_adv_est("greedy_discounted", inputs=("reward_baselines",), options=("gamma",))
    def greedy_discounted(token_level_rewards, response_mask, reward_baselines, gamma, **kwargs):
        calls.append(sorted(kwargs) + ["gamma", "reward_baselines"])
        scores = np.asarray(token_level_rewards).sum(-1) - np.asarray(reward_baselines)
        advantages = gamma * scores[:, None] * np.asarray(response_mask)
        return advantages, advantages


def notice(*argv: str) -> set[str]:
    config = load_config(list(argv))[0]
    keys = resolve_run(config).keys
    found = ignored_settings(config, keys, "jax", command_line_keys(list(argv)))
    return {key for pairs in found.values() for key, _ in pairs}


def test_the_descriptor_drives_dispatch(registry):
    calls = []
    register_greedy_discounted(calls)
    estimator = algos.get_adv_estimator("greedy_discounted")
    assert estimator.needs_greedy_baseline and not estimator.needs_critic
    assert estimator.reads("gamma") and not estimator.reads("lam")
    rewards, baselines = rand(70), rand(71, (B,))
    advantages, _ = algos.compute_advantage(
        "greedy_discounted",
        token_level_rewards=rewards,
        response_mask=MASK,
        options=algos.EstimatorOptions(gamma=0.5),
        index=UIDS,
        values=rand(72),
        reward_baselines=baselines,
    )
    close(advantages, 0.5 * (rewards.sum(-1) - baselines)[:, None] * MASK, 1e-6)
    assert calls == [["gamma", "reward_baselines"]]  # neither index nor values: not declared
    with pytest.raises(ValueError, match="needs `reward_baselines`: a greedy baseline rollout"):
        algos.compute_advantage(
            "greedy_discounted", token_level_rewards=rewards, response_mask=MASK, gamma=0.5
        )
    with pytest.raises(ValueError, match="needs `gamma`: the discount algorithm.gamma"):
        algos.compute_advantage(
            "greedy_discounted",
            token_level_rewards=rewards,
            response_mask=MASK,
            reward_baselines=baselines,
        )


def test_a_plain_decorator_follows_verl(registry):
    seen = {}

    @algos.register_adv_est("verl_style")
    def verl_style(token_level_rewards, response_mask, index, config=None):
        seen.update(index=index, config=config)
        return np.zeros(np.shape(token_level_rewards)), np.zeros(np.shape(token_level_rewards))

    estimator = algos.get_adv_estimator("verl_style")
    assert estimator.follows_verl and estimator.inputs == ("index",)
    assert all(estimator.reads(option) for option in ("gamma", "lam", "anything"))
    section = {"gamma": 0.7}
    algos.compute_advantage(
        "verl_style",
        token_level_rewards=rand(73),
        response_mask=MASK,
        options=algos.EstimatorOptions(gamma=0.9),
        config=section,
        index=UIDS,
        values=rand(74),
        lam=0.5,
    )
    assert seen["index"] is UIDS and seen["config"] is section


def test_registration_refuses_unknown_needs(registry):
    with pytest.raises(ValueError, match=r"unknown inputs or options \['critic', 'beta'\]"):
        algos.register_adv_est("bad", inputs=("critic",), options=("beta",))
    with pytest.raises(ValueError, match="already registered"):
        algos.register_adv_est("grpo", inputs=("index",))(lambda **kwargs: None)


def test_validation_shape_and_notice_ask_the_descriptor(registry):
    register_greedy_discounted([])
    chosen = "algorithm.adv_estimator=greedy_discounted"
    config, _ = load_config([GRPO, chosen])  # validates: the registry knows the name
    assert not uses_critic(config)
    ignored = notice(GRPO, chosen, "algorithm.gamma=0.9", "algorithm.lam=0.9")
    assert "algorithm.lam" in ignored and "algorithm.gamma" not in ignored

    @algos.register_adv_est("valued", inputs=("values",))
    def valued(token_level_rewards, response_mask, values, **kwargs):
        return values, values

    assert uses_critic(load_config([PPO, "algorithm.adv_estimator=valued"])[0])
    with pytest.raises(ConfigError, match="'valued' needs the critic's values, but critic.enabl"):
        load_config([GRPO, "algorithm.adv_estimator=valued"])  # the card has critic.enable=False
    assert "critic.enable" in notice(PPO, "algorithm.adv_estimator=valued", "critic.enable=True")
    assert "critic.enable" not in notice(PPO, "critic.enable=True", chosen)


def test_the_trainer_rolls_out_the_greedy_baseline_the_descriptor_asks_for(registry, tmp_path):
    """One tiny step with a registered estimator that needs a greedy baseline and reads γ: the
    trainer scores the greedy answers (``gen_max``) and hands them over with the card's γ."""
    calls = []
    register_greedy_discounted(calls)
    metrics = train.main(
        [
            GRPO,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "algorithm.adv_estimator=greedy_discounted",
        ]
    )
    assert "timing_s/gen_max" in metrics and math.isfinite(metrics["actor/pg_loss"])
    assert calls == [["gamma", "reward_baselines"]]
