"""The typed settings `jrl.algos` takes (the resolver, `jrl.runspec.algorithm`, builds them from
the config once): the policy losses' options, KL in the reward and in the actor's loss, and the
read-only view of a verl section that users' functions registered with verl's calling convention
receive (`VerlSection`). Rollout correction's are in `jrl.algos.correction_settings`, the
advantage estimators' in `jrl.algos.estimator`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from jrl.algos.correction_settings import CorrectionOptions

# The policy losses' own defaults, for options the config leaves null (verl's).
CLIP_RATIO_C = 3.0
SAPO_TAU_POS = 1.0
SAPO_TAU_NEG = 1.05
CLIP_COV_RATIO = 0.0002
CLIP_COV_LB = 1.0
CLIP_COV_UB = 5.0
KL_COV_RATIO = 0.0002
KL_COV_COEF = 1.0
VANILLA = "vanilla"


class VerlSection(Mapping[str, Any]):
    """A verl config section, read-only and hashable, as jrl hands it to users' functions
    registered with verl's calling convention: ``section[key]``, ``section.get(key)`` and
    ``section.key`` as on verl's config objects; nested sections are VerlSections, lists
    tuples."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = {key: _frozen(value) for key, value in values.items()}

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_") or key not in self._values:
            raise AttributeError(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return f"VerlSection({self._values!r})"


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return VerlSection(value)
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


@dataclasses.dataclass(frozen=True)
class PolicyLossSettings:
    """The policy loss (``actor.policy_loss.loss_mode``) and the options the built-in losses
    read, under verl's names: the clip range (``clip_ratio_low``/``_high``, each falling back to
    ``clip_ratio``; `jrl.algos.policy_loss.clip_bounds`), dual-clip ``clip_ratio_c``,
    ``loss_scale_factor``, SAPO's temperatures, Clip-Cov's and KL-Cov's options
    (``actor.policy_loss.*``). A field the config leaves null keeps the loss's own default.

    In bypass mode the loss is ``bypass_mode`` with `rollout_correction`, the
    ``algorithm.rollout_correction`` options. A loss a user registers is handed `verl_config`,
    the actor section, instead (verl's calling convention). Frozen and hashable: the learner
    compiles one update per loss."""

    loss_mode: str = VANILLA
    clip_ratio: float | None = None
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = CLIP_RATIO_C
    loss_scale_factor: float | None = None
    tau_pos: float = SAPO_TAU_POS
    tau_neg: float = SAPO_TAU_NEG
    clip_cov_ratio: float = CLIP_COV_RATIO
    clip_cov_lb: float = CLIP_COV_LB
    clip_cov_ub: float = CLIP_COV_UB
    kl_cov_ratio: float = KL_COV_RATIO
    ppo_kl_coef: float = KL_COV_COEF
    rollout_correction: CorrectionOptions | None = None
    verl_config: VerlSection | None = None


@dataclasses.dataclass(frozen=True)
class KLControl:
    """``algorithm.kl_ctrl``: the controller of the in-reward KL coefficient
    (`jrl.algos.kl.get_kl_controller`: fixed or adaptive towards `target_kl` over `horizon`)."""

    type: str
    kl_coef: float
    target_kl: float | None = None  # adaptive only
    horizon: float | None = None  # adaptive only


@dataclasses.dataclass(frozen=True)
class KLInReward:
    """``algorithm.use_kl_in_reward``: rewards = scores - β·KL, the estimator `kl_penalty`
    between the old and the reference log-probs, β from `kl_ctrl`."""

    kl_penalty: str
    kl_ctrl: KLControl


@dataclasses.dataclass(frozen=True)
class KLLoss:
    """``actor.use_kl_loss``: the actor's loss adds kl_loss_coef x the KL estimator
    `kl_loss_type` to the reference."""

    kl_loss_coef: float
    kl_loss_type: str
