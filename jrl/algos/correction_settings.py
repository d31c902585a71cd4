"""The settings of rollout correction, as the resolver builds them from the config, and the
names its keys take: current verl's ``algorithm.rollout_correction`` (`CorrectionOptions`, its
rejection criteria and thresholds parsed here), verl v0.6's ``rollout_is*`` keys
(`LegacyRolloutIS`), and the run's choice between them (`RolloutCorrection`). The computation is
`jrl.algos.rollout_correction` and `jrl.algos.rollout_is`."""

from __future__ import annotations

import dataclasses
from typing import Any

# Current verl: the levels of rollout_is, the criteria of rollout_rs, the bypass loss types.
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
LOSS_TYPES = ("ppo_clip", "reinforce")
# verl v0.6: rollout_is_level and rollout_is_mode.
ROLLOUT_IS_LEVELS = ("token", "sequence", "geometric")
ROLLOUT_IS_MODES = ("truncate", "mask")
_GEO = "0.999_1.001"
_BYPASS_PG = {"bypass_mode": True, "loss_type": "reinforce"}
# verl's RolloutCorrectionConfig factory methods, as `algorithm.rollout_correction` values.
PRESETS: dict[str, dict[str, Any]] = {
    "decoupled_token_is": {"rollout_is": "token"},
    "decoupled_seq_is": {"rollout_is": "sequence"},
    "decoupled_seq_is_rs": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_sum_k1",
        "rollout_rs_threshold": "0.5_2.0",
    },
    "decoupled_geo_rs": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": _GEO},
    "decoupled_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": _GEO,
    },
    "decoupled_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": _GEO,
    },
    "decoupled_k3_rs": {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.01},
    "decoupled_k3_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
    },
    "decoupled_k3_rs_token_tis": {
        "rollout_is": "token",
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
    },
    "bypass_ppo_clip": {"bypass_mode": True},
    "bypass_ppo_clip_geo_rs": {
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": _GEO,
        "bypass_mode": True,
    },
    "bypass_ppo_clip_k3_rs": {
        "rollout_rs": "seq_mean_k3",
        "rollout_rs_threshold": 0.01,
        "bypass_mode": True,
    },
    "bypass_pg_is": {"rollout_is": "sequence", **_BYPASS_PG},
    "bypass_pg_geo_rs": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": _GEO, **_BYPASS_PG},
    "bypass_pg_geo_rs_seq_tis": {
        "rollout_is": "sequence",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": _GEO,
        **_BYPASS_PG,
    },
    "bypass_pg_geo_rs_token_tis": {
        "rollout_is": "token",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": _GEO,
        **_BYPASS_PG,
    },
    "disabled": {},
}

Bounds = tuple[float | None, float]


def rs_options(rollout_rs: str) -> tuple[str, ...]:
    """The criteria of a comma-separated `rollout_rs`, duplicates dropped, in order."""
    options = tuple(dict.fromkeys(part.strip() for part in str(rollout_rs).split(",")))
    options = tuple(option for option in options if option)
    unknown = [option for option in options if option not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(
            f"algorithm.rollout_correction.rollout_rs={rollout_rs!r}: unknown criteria "
            f"{unknown}; use a comma-separated list of {', '.join(RS_OPTIONS)}"
        )
    return options


def rs_thresholds(options: tuple[str, ...], spec: str | float | None) -> tuple[Bounds, ...]:
    """(lower, upper) per criterion from `rollout_rs_threshold`: one entry shared by all or one per
    criterion (comma-separated); k1 takes "lo_hi" or hi (lo = 1/hi), k2/k3 a single hi. No
    criteria: no bounds."""
    if not options:
        return ()
    key = "algorithm.rollout_correction.rollout_rs_threshold"
    if spec is None:
        raise ValueError(f"{key} is required with rollout_rs (e.g. 2.0, or '0.5_2.0' for k1)")
    parts = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(parts) not in (1, len(options)):
        raise ValueError(
            f"{key}={spec!r}: give one threshold for all or {len(options)} (one per rollout_rs "
            "criterion)"
        )
    if len(parts) == 1:
        parts = parts * len(options)
    return tuple(_bounds(option, part, key) for option, part in zip(options, parts, strict=True))


def _bounds(option: str, spec: str, key: str) -> Bounds:
    k1 = option.endswith("k1")
    if "_" in spec and not k1:
        raise ValueError(f"{key}: {option} takes one upper bound, not {spec!r}")
    try:
        values = [float(value) for value in spec.split("_", 1)]
    except ValueError:
        raise ValueError(f"{key}: {spec!r} for {option} is not a number") from None
    if not all(value > 0 for value in values):
        raise ValueError(f"{key}: the bounds of {option} must be positive, got {spec!r}")
    if not k1:
        return None, values[0]
    if len(values) == 2 and values[0] > values[1]:
        raise ValueError(
            f"{key}: the lower bound of {option} is above its upper bound in {spec!r} (every "
            "token would be rejected); give lower_upper"
        )
    return (values[0], values[1]) if len(values) == 2 else (1.0 / values[0], values[0])


def is_bounds(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower or None) of ``rollout_is_threshold``: a number (or its text) truncates the
    weights at it; current verl's "lower_upper" (IcePop) zeroes the weights outside
    [lower, upper]. Both bounds positive, lower ≤ upper."""
    key = "algorithm.rollout_correction.rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"{key}={spec!r} is not a number or a 'lower_upper' text")
    parts = str(spec).strip().split("_", 1)
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise ValueError(f"{key}={spec!r} is not a number or a 'lower_upper' text") from None
    if not all(value > 0 for value in values):
        raise ValueError(f"{key}={spec!r}: its bounds must be positive")
    if len(values) == 1:
        return values[0], None
    if values[0] > values[1]:
        raise ValueError(f"{key}={spec!r}: the lower bound is above the upper one")
    return values[1], values[0]


@dataclasses.dataclass(frozen=True)
class CorrectionOptions:
    """Current verl's ``algorithm.rollout_correction`` options (verl's defaults where the config
    leaves a key null), hashable: the bypass-mode loss keeps them in its policy-loss settings
    (`jrl.algos.settings.PolicyLossSettings`), as verl hands them to it."""

    rollout_is: str | None = None
    rollout_is_threshold: float | str | None = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    loss_type: str = "ppo_clip"


@dataclasses.dataclass(frozen=True)
class LegacyRolloutIS:
    """verl v0.6's rollout importance sampling: the ``algorithm.rollout_is*`` keys, each taken
    from the actor's copy (``actor_rollout_ref.actor.rollout_is*``) where the algorithm's is at
    its default; on while `rollout_is_threshold` is set (`rollout_is`: apply the weights, else
    metrics and rejection only)."""

    rollout_is: bool
    rollout_is_threshold: float | None
    rollout_is_threshold_lower: float | None
    rollout_is_level: str
    rollout_is_mode: str
    rollout_is_veto_threshold: float | None


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """The run's rollout correction: verl v0.6's (`legacy`, None unless its keys switch it on)
    or else current verl's `current` options; in `bypass_mode` the rollout's log-probs are the
    old ones and the actor's loss corrects (`jrl.algos.bypass_loss`)."""

    current: CorrectionOptions
    bypass_mode: bool
    legacy: LegacyRolloutIS | None = None
