"""The three spellings of rollout correction and their load-time checks.

Current verl: `algorithm.rollout_correction.*`. verl v0.6: `algorithm.rollout_is*`, with
`actor_rollout_ref.actor.rollout_is*` a third spelling of the same six keys (set on one side, it
acts; set on both sides, the values must agree). The v0.6 and current spellings exclude each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from jrl.algos.correction_settings import (
    IS_LEVELS,
    LOSS_TYPES,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    is_bounds,
    rs_options,
    rs_thresholds,
)
from jrl.config.defaults import default_config

LEGACY_KEYS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_is_threshold_lower",
    "rollout_is_level",
    "rollout_is_mode",
    "rollout_is_veto_threshold",
)
ACTOR = "actor_rollout_ref.actor"
RC = "algorithm.rollout_correction"
_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"


@cache
def _defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    algorithm = default_config().algorithm
    return {k: algorithm[k] for k in LEGACY_KEYS}, algorithm.rollout_correction.to_dict()


def _changed(section: Mapping[str, Any] | None, defaults: dict[str, Any]) -> list[str]:
    if section is None:
        return []
    return [k for k, v in defaults.items() if section.get(k, v) != v]


def legacy_rollout_is(algorithm: Mapping[str, Any], actor: Mapping[str, Any] | None) -> dict:
    """The six v0.6 keys: the `algorithm` value where it is not the default, else the actor's."""
    defaults = _defaults()[0]
    changed = _changed(algorithm, defaults)
    return {
        k: algorithm[k] if k in changed or actor is None else actor.get(k, default)
        for k, default in defaults.items()
    }


def rollout_correction_problems(config: Any) -> Iterator[str]:
    """Problems of the rollout-correction keys, each naming the key and the fix."""
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    legacy_defaults, current_defaults = _defaults()
    on_algorithm, on_actor = _changed(algorithm, legacy_defaults), _changed(actor, legacy_defaults)
    for key in on_algorithm:
        if key in on_actor and algorithm[key] != actor[key]:
            yield (
                f"algorithm.{key}={algorithm[key]!r} and {ACTOR}.{key}={actor[key]!r} disagree; "
                "set one of them (or both to the same value)"
            )
    current = _changed(algorithm.rollout_correction, current_defaults)
    legacy = [f"algorithm.{k}" for k in on_algorithm] + [f"{ACTOR}.{k}" for k in on_actor]
    if legacy and current:
        yield (
            f"{legacy[0]} (verl v0.6) and {RC}.{current[0]} (current verl) are two spellings of "
            "rollout correction; use only one of them"
        )
    log_probs = bool(config.actor_rollout_ref.rollout.calculate_log_probs)
    names = {k: f"{ACTOR}.{k}" if k in on_actor else f"algorithm.{k}" for k in LEGACY_KEYS}
    names.update({k: f"algorithm.{k}" for k in on_algorithm})
    yield from _legacy_problems(legacy_rollout_is(algorithm, actor), names, log_probs)
    yield from _current_problems(algorithm.rollout_correction, current, log_probs)
    if algorithm.rollout_correction["bypass_mode"]:
        yield from _bypass_problems(algorithm.rollout_correction, actor, log_probs)
    elif _loss_mode(actor) == "bypass_mode":
        yield (
            f"{ACTOR}.policy_loss.loss_mode='bypass_mode' is the loss of {RC}.bypass_mode=True; "
            f"set that instead (it selects this loss) and reset loss_mode to vanilla"
        )


def _not_one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    return f"{key}={value!r} is not supported; use one of {', '.join(allowed)}"


def _legacy_problems(
    values: dict[str, Any], names: dict[str, str], log_probs: bool
) -> Iterator[str]:
    for key, allowed in (
        ("rollout_is_level", ROLLOUT_IS_LEVELS),
        ("rollout_is_mode", ROLLOUT_IS_MODES),
    ):
        if values[key] not in allowed:
            yield _not_one_of(names[key], values[key], allowed)
    for key in ("rollout_is_threshold", "rollout_is_threshold_lower", "rollout_is_veto_threshold"):
        if values[key] is not None and not values[key] > 0:
            yield f"{names[key]} must be positive (or null), got {values[key]}"
    if values["rollout_is_threshold"] is None:
        idle = [k for k in _changed(values, _defaults()[0]) if k != "rollout_is_threshold"]
        if idle:
            yield (
                f"{names[idle[0]]} has no effect without {names['rollout_is_threshold']}; set "
                "it (e.g. 2.0) or reset the key"
            )
    elif not log_probs:
        yield (
            f"{names['rollout_is_threshold']} needs the rollout's log-probs: set {_LOG_PROBS}=True"
        )


def _current_problems(
    section: Mapping[str, Any], changed: list[str], log_probs: bool
) -> Iterator[str]:
    level, threshold = section["rollout_is"], section["rollout_is_threshold"]
    if level is not None and level not in IS_LEVELS:
        yield _not_one_of(f"{RC}.rollout_is", level, (*IS_LEVELS, "null"))
    if level is not None and threshold is None:
        yield f"{RC}.rollout_is={level!r} needs a positive {RC}.rollout_is_threshold (e.g. 2.0)"
    elif level is not None:
        try:
            is_bounds(threshold)
        except ValueError as error:
            yield str(error)
    for key in ("rollout_is_threshold", "rollout_is_batch_normalize"):
        if level is None and key in changed:
            yield f"{RC}.{key} has no effect without {RC}.rollout_is (token or sequence)"
    yield from _rejection_problems(section)
    if section["loss_type"] not in LOSS_TYPES:
        yield _not_one_of(f"{RC}.loss_type", section["loss_type"], LOSS_TYPES)
    elif "loss_type" in changed and not section["bypass_mode"]:
        yield f"{RC}.loss_type only applies with {RC}.bypass_mode=True; reset it to ppo_clip"
    if (level is not None or section["rollout_rs"] is not None) and not log_probs:
        yield f"{RC}.rollout_is/rollout_rs need the rollout's log-probs: set {_LOG_PROBS}=True"


def _loss_mode(actor: Mapping[str, Any]) -> str:
    """The actor's policy loss mode, vanilla when unset."""
    return (actor.get("policy_loss") or {}).get("loss_mode") or "vanilla"


def _bypass_problems(
    section: Mapping[str, Any], actor: Mapping[str, Any], log_probs: bool
) -> Iterator[str]:
    """Bypass mode takes the rollout's log-probs as the old ones and its own policy loss."""
    if not log_probs:
        yield f"{RC}.bypass_mode=True uses the rollout's log-probs: set {_LOG_PROBS}=True"
    loss_mode = _loss_mode(actor)
    if loss_mode != "vanilla":
        yield (
            f"{RC}.bypass_mode=True replaces {ACTOR}.policy_loss.loss_mode={loss_mode!r} by its "
            f"own loss ({RC}.loss_type ppo_clip or reinforce); reset loss_mode to vanilla"
        )


def _rejection_problems(section: Mapping[str, Any]) -> Iterator[str]:
    criteria, threshold = section["rollout_rs"], section["rollout_rs_threshold"]
    if criteria is None:
        if threshold is not None:
            yield f"{RC}.rollout_rs_threshold has no effect without {RC}.rollout_rs"
        return
    try:
        rs_thresholds(rs_options(criteria), threshold)
    except ValueError as error:
        yield str(error)
