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

from jrl.algos.aggregation import SEQ_MEAN_TOKEN_SUM_NORM
from jrl.algos.bypass_loss import BYPASS_LOSS_MODE
from jrl.algos.correction_settings import CorrectionOptions, LegacyRolloutIS, RolloutCorrection
from jrl.algos.estimator import ADV_ESTIMATORS, Estimator, EstimatorOptions, get_adv_estimator
from jrl.algos.estimator import OPTIONS as ESTIMATOR_OPTIONS
from jrl.algos.policy_loss import POLICY_LOSS_TERMS, PolicyLoss
from jrl.algos.settings import (
    VANILLA,
    KLControl,
    KLInReward,
    KLLoss,
    PolicyLossSettings,
    VerlSection,
)
from jrl.runspec.dynamic_sampling import FilterGroups, filter_groups
from jrl.runspec.reads import KeyReads
from jrl.runspec.rollout_correction_checks import legacy_rollout_is

T = TypeVar("T")
ACTOR = "actor_rollout_ref.actor"
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
LOSS_OPTION_KEYS = tuple(key for key in POLICY_LOSS_KEYS if key != "loss_mode")


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """What a PPO-family step computes, besides the models: the advantage `estimator` with the
    options it reads (`estimator_config`: the ``algorithm`` section, only for an estimator that
    follows verl's calling convention), KL in the reward (None: off), the actor's objective
    (`policy_loss`, its `loss_agg_mode`, `entropy_coeff`, the KL loss or None), rollout
    correction and DAPO's group filter (`filter_groups`; None: off)."""

    estimator: Estimator
    estimator_options: EstimatorOptions
    estimator_config: VerlSection | None
    kl_in_reward: KLInReward | None
    policy_loss: PolicyLossSettings
    loss_agg_mode: str
    entropy_coeff: float
    kl_loss: KLLoss | None
    rollout_correction: RolloutCorrection
    filter_groups: FilterGroups | None = None


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
        filter_groups=part("filter_groups", filter_groups, view),
    )


def _estimator_options(algorithm: KeyReads, estimator: Estimator) -> EstimatorOptions:
    """The options the estimator reads (the others stay None, unread)."""
    for option in ESTIMATOR_OPTIONS:
        if not estimator.reads(option):
            readers = [n for n in ADV_ESTIMATORS.names() if ADV_ESTIMATORS.get(n).reads(option)]
            why = f"the {estimator.name} estimator ignores it: only {', '.join(readers)} read it"
            algorithm.skip(option, why)
    return EstimatorOptions(**{key: algorithm[key] for key in estimator.options})


def _estimator_config(algorithm: KeyReads, estimator: Estimator) -> VerlSection | None:
    """The whole section, for an estimator that follows verl's calling convention."""
    return VerlSection(algorithm.whole()) if estimator.follows_verl else None


def _kl_loss(actor: KeyReads) -> KLLoss | None:
    if not actor.use_kl_loss:
        actor.skip(("kl_loss_coef", "kl_loss_type"), f"{ACTOR}.use_kl_loss is False")
        return None
    return KLLoss(actor.kl_loss_coef, actor.kl_loss_type)


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values the config sets: a null one keeps the settings' own default."""
    return {key: value for key, value in values.items() if value is not None}


def _loss_option_read(actor: KeyReads, loss: PolicyLoss, key: str) -> bool:
    """Whether the run reads the actor's loss option `key` under `loss` (skipped, with why, when
    not): the aggregation's ``loss_scale_factor`` under its one mode, ``clip_ratio`` as the
    fallback of a null ``clip_ratio_low`` / ``_high``, the others as the loss declares."""
    if key == "loss_scale_factor":
        why = f"the divisor of loss_agg_mode={SEQ_MEAN_TOKEN_SUM_NORM} only"
        read = actor.loss_agg_mode == SEQ_MEAN_TOKEN_SUM_NORM
    elif not loss.reads(key):
        readers = [
            name for name in POLICY_LOSS_TERMS.names() if POLICY_LOSS_TERMS.get(name).reads(key)
        ]
        why = f"the {loss.name} policy loss ignores it: only {', '.join(readers)} read it"
        read = False
    elif key == "clip_ratio" and not loss.follows_verl:
        why = "actor.clip_ratio_low and clip_ratio_high are both set: clip_ratio is their fallback"
        read = actor.clip_ratio_low is None or actor.clip_ratio_high is None
    else:
        return True
    if not read:
        (actor if key in ACTOR_LOSS_KEYS else actor.policy_loss).skip(key, why)
    return read


def _policy_loss(actor: KeyReads, correction: RolloutCorrection) -> PolicyLossSettings:
    """The actor's objective: the loss ``policy_loss.loss_mode`` names (bypass mode's in bypass
    mode, which reads what vanilla reads) with the options it reads."""
    options = _given({"loss_mode": actor.policy_loss.loss_mode})
    loss = POLICY_LOSS_TERMS.get(options.get("loss_mode", VANILLA))
    for section, keys in ((actor, ACTOR_LOSS_KEYS), (actor.policy_loss, LOSS_OPTION_KEYS)):
        read = [key for key in keys if _loss_option_read(actor, loss, key)]
        options |= _given({key: section[key] for key in read})
    if correction.bypass_mode:
        options |= {"loss_mode": BYPASS_LOSS_MODE, "rollout_correction": correction.current}
    elif loss.follows_verl:
        options["verl_config"] = VerlSection(actor.whole())
    return PolicyLossSettings(**options)


def _kl_in_reward(algorithm: KeyReads) -> KLInReward | None:
    if not algorithm.use_kl_in_reward:
        algorithm.skip(("kl_penalty", "kl_ctrl"), "algorithm.use_kl_in_reward is False")
        return None
    ctrl = algorithm.kl_ctrl
    if ctrl.type == "adaptive":
        control = KLControl(ctrl.type, ctrl.kl_coef, ctrl.target_kl, ctrl.horizon)
    else:
        ctrl.skip(
            ("target_kl", "horizon"),
            "algorithm.kl_ctrl.type is fixed: the coefficient stays kl_coef",
        )
        control = KLControl(ctrl.type, ctrl.kl_coef)
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
