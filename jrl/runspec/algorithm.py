"""The algorithm of a PPO-family run, resolved once from verl's keys (``algorithm.*`` and the
actor's loss keys) into `AlgorithmSpec`, the typed settings that `jrl.algos` takes.

Translated here, once: a null loss option to the loss's own default; verl v0.6's ``rollout_is*``
keys (on ``algorithm`` or the actor) next to current verl's ``algorithm.rollout_correction``;
bypass mode into its policy loss. Users' estimators and losses registered with verl's calling
convention get their section read-only (`VerlSection`), as verl hands it to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ml_collections import ConfigDict

from jrl.algos.bypass_loss import BYPASS_LOSS_MODE
from jrl.algos.correction_settings import CorrectionOptions, LegacyRolloutIS, RolloutCorrection
from jrl.algos.estimator import Estimator, EstimatorOptions, get_adv_estimator
from jrl.algos.policy_loss import POLICY_LOSS_TERMS
from jrl.algos.settings import (
    VANILLA,
    KLControl,
    KLInReward,
    KLLoss,
    PolicyLossSettings,
    VerlSection,
)
from jrl.runspec.reads import KeyReads
from jrl.runspec.rollout_correction_checks import legacy_rollout_is

T = TypeVar("T")
# The actor's keys that the policy losses read: on the actor section and under policy_loss.
ACTOR_LOSS_KEYS = (
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_scale_factor",
    "tau_pos",
    "tau_neg",
)
POLICY_LOSS_KEYS = (
    "loss_mode",
    "clip_cov_ratio",
    "clip_cov_lb",
    "clip_cov_ub",
    "kl_cov_ratio",
    "ppo_kl_coef",
)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """What a PPO-family step computes, besides the models: the advantage `estimator` with the
    options it reads (`estimator_config`: the ``algorithm`` section, only for an estimator that
    follows verl's calling convention), KL in the reward (None: off), the actor's objective
    (`policy_loss`, its `loss_agg_mode`, `entropy_coeff`, the KL loss or None) and rollout
    correction."""

    estimator: Estimator
    estimator_options: EstimatorOptions
    estimator_config: VerlSection | None
    kl_in_reward: KLInReward | None
    policy_loss: PolicyLossSettings
    loss_agg_mode: str
    entropy_coeff: float
    kl_loss: KLLoss | None
    rollout_correction: RolloutCorrection


def resolve_algorithm(config: ConfigDict | KeyReads) -> AlgorithmSpec:
    """The algorithm of a checked PPO-family config, read through `config` when it is a
    `KeyReads` view (the RunSpec's, so that its ledger records each key's field)."""
    view = config if isinstance(config, KeyReads) else KeyReads(config)
    algorithm, actor = view.algorithm, view.actor_rollout_ref.actor

    def part(field: str, build: Callable[..., T], *args: Any) -> T:
        return view.resolve(f"algorithm.{field}", build, *args)

    estimator = part("estimator", get_adv_estimator, algorithm.adv_estimator)
    correction = part("rollout_correction", _rollout_correction, algorithm, actor)
    return AlgorithmSpec(
        estimator=estimator,
        estimator_options=part("estimator_options", _estimator_options, algorithm, estimator),
        estimator_config=part("estimator_config", _estimator_config, algorithm, estimator),
        kl_in_reward=part("kl_in_reward", _kl_in_reward, algorithm),
        policy_loss=part("policy_loss", _policy_loss, actor, correction),
        loss_agg_mode=part("loss_agg_mode", actor.get, "loss_agg_mode"),
        entropy_coeff=part("entropy_coeff", actor.get, "entropy_coeff"),
        kl_loss=part("kl_loss", _kl_loss, actor),
        rollout_correction=correction,
    )


def _estimator_options(algorithm: KeyReads, estimator: Estimator) -> EstimatorOptions:
    """The options the estimator reads (the others stay None, unread)."""
    return EstimatorOptions(**{key: algorithm[key] for key in estimator.options})


def _estimator_config(algorithm: KeyReads, estimator: Estimator) -> VerlSection | None:
    """The whole section, for an estimator that follows verl's calling convention."""
    return VerlSection(algorithm.whole()) if estimator.follows_verl else None


def _kl_loss(actor: KeyReads) -> KLLoss | None:
    return KLLoss(actor.kl_loss_coef, actor.kl_loss_type) if actor.use_kl_loss else None


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values the config sets: a null one keeps the settings' own default."""
    return {key: value for key, value in values.items() if value is not None}


def _policy_loss(actor: KeyReads, correction: RolloutCorrection) -> PolicyLossSettings:
    options = _given({key: actor[key] for key in ACTOR_LOSS_KEYS})
    options |= _given({key: actor.policy_loss[key] for key in POLICY_LOSS_KEYS})
    if correction.bypass_mode:
        options |= {"loss_mode": BYPASS_LOSS_MODE, "rollout_correction": correction.current}
    elif POLICY_LOSS_TERMS.get(options.get("loss_mode", VANILLA)).follows_verl:
        options["verl_config"] = VerlSection(actor.whole())
    return PolicyLossSettings(**options)


def _kl_in_reward(algorithm: KeyReads) -> KLInReward | None:
    if not algorithm.use_kl_in_reward:
        return None
    ctrl = algorithm.kl_ctrl
    control = KLControl(ctrl.type, ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
    return KLInReward(algorithm.kl_penalty, control)


def _rollout_correction(algorithm: KeyReads, actor: KeyReads) -> RolloutCorrection:
    """Current verl's options, and verl v0.6's when its keys switch it on (a threshold, or
    ``rollout_is``), which then act instead (validation keeps the two apart)."""
    section = algorithm.rollout_correction
    names = [field.name for field in dataclasses.fields(CorrectionOptions)]
    current = CorrectionOptions(**_given({name: section[name] for name in names}))
    legacy = legacy_rollout_is(algorithm, actor)
    on = legacy["rollout_is_threshold"] is not None or bool(legacy["rollout_is"])
    return RolloutCorrection(
        current=current,
        bypass_mode=bool(section.bypass_mode),
        legacy=LegacyRolloutIS(**legacy) if on else None,
    )
