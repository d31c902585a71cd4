"""Policy-gradient losses (`actor.policy_loss.loss_mode`): their descriptors, their registries
and the vanilla PPO loss.

A loss's descriptor (`PolicyLoss`, registry `POLICY_LOSS_TERMS`) holds its per-token form, which
returns `LossTerms` (exact accumulation over micro-batches, see `jrl.algos.aggregation`), and the
`PolicyLossSettings` options it reads (the no-effect notice asks it). jrl's losses take one
`PolicyInputs` and their settings:

    @register_policy_loss_terms("my_loss", options=("clip_ratio",))
    def policy_loss_terms_my_loss(inputs: PolicyInputs, settings: PolicyLossSettings) -> LossTerms:
        ...

A loss registered without `options` follows verl's calling convention: it is called
``terms(old_log_prob, log_prob, advantages, response_mask, config, rollout_is_weights=...)`` with
the actor section, read-only, as `config` (`settings.verl_config`). verl's single-batch form
``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
-> (loss, metrics)`` of each of jrl's losses is in `POLICY_LOSSES` (`get_policy_loss_fn`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import LossTerms, reduce_loss_terms
from jrl.algos.registry import Registry
from jrl.algos.settings import PolicyLossSettings

LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
PolicyLossTermsFn = Callable[..., LossTerms]
# The PolicyLossSettings fields a loss may declare (the others name the loss, hand verl's section
# or scale every loss's aggregation).
OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(PolicyLossSettings)
    if f.name not in ("loss_mode", "verl_config", "loss_scale_factor")
)
# The clip range (`clip_bounds`), and with dual clip's c (`clip_ranges`).
CLIP_BOUNDS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high")
CLIP_RANGES = (*CLIP_BOUNDS, "clip_ratio_c")


class PolicyInputs(NamedTuple):
    """The per-token arrays of one (micro-)batch that a policy loss reads."""

    old_log_prob: jax.Array  # (batch, response): logπ_old (the rollout's in bypass mode)
    log_prob: jax.Array  # (batch, response): logπ_θ, the one differentiated
    advantages: jax.Array  # (batch, response): A
    response_mask: jax.Array  # (batch, response): 1 on response tokens, 0 on padding
    rollout_is_weights: jax.Array | None = None  # (batch, response): IS weights, or None


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """A policy loss: its per-token function `terms` and the `PolicyLossSettings` `options` it
    reads (besides ``loss_scale_factor``, which the aggregation reads for every loss);
    `follows_verl`: registered without options, called with verl's arguments (module
    docstring)."""

    name: str
    terms: PolicyLossTermsFn
    options: tuple[str, ...]
    follows_verl: bool = False

    def reads(self, option: str) -> bool:
        """Whether it reads `option` (verl's convention: it may read any)."""
        return self.follows_verl or option in self.options

    def __call__(self, inputs: PolicyInputs, settings: PolicyLossSettings) -> LossTerms:
        """Its per-token terms; a loss that follows verl gets `settings.verl_config`."""
        if not self.follows_verl:
            return self.terms(inputs, settings)
        *arrays, weights = inputs
        return self.terms(*arrays, settings.verl_config, rollout_is_weights=weights)


# The modules that register jrl's losses besides this one's vanilla.
_LOSS_MODULES = (
    "jrl.algos.bypass_loss",
    "jrl.algos.covariance_losses",
    "jrl.algos.sequence_losses",
    "jrl.algos.token_losses",
)
POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss", "actor.policy_loss.loss_mode", built_in=_LOSS_MODULES
)
POLICY_LOSS_TERMS: Registry[PolicyLoss] = Registry(
    "per-token policy loss",
    "actor.policy_loss.loss_mode",
    lambda entry: entry.terms,
    built_in=_LOSS_MODULES,
)
register_policy_loss = POLICY_LOSSES.register
get_policy_loss_fn = POLICY_LOSSES.get


def register_policy_loss_terms(
    name: object, *, options: Sequence[str] | None = None
) -> Callable[[PolicyLossTermsFn], PolicyLossTermsFn]:
    """Decorator registering a per-token loss under `name` with the `options` (fields of
    `PolicyLossSettings`) it reads; without `options` it follows verl's calling convention."""
    follows_verl = options is None
    options = tuple(options or ())
    unknown = [option for option in options if option not in OPTIONS]
    if unknown:
        raise ValueError(
            f"policy loss {name!r}: unknown options {unknown}; options are {', '.join(OPTIONS)}"
        )

    return POLICY_LOSS_TERMS.register_with(
        name, lambda key, fn: PolicyLoss(key, fn, options, follows_verl)
    )


def get_policy_loss(name: object) -> PolicyLoss:
    """The descriptor registered under `name` (an unknown name lists the registered ones)."""
    return POLICY_LOSS_TERMS.get(name)


def get_policy_loss_terms_fn(name: object) -> PolicyLossTermsFn:
    """The per-token function registered under `name`."""
    return POLICY_LOSS_TERMS.get(name).terms


def clip_bounds(config: PolicyLossSettings | None) -> tuple[float, float]:
    """(ε_low, ε_high); each falls back to `clip_ratio` when null."""
    if config is None:
        raise ValueError(
            "The policy loss needs the actor config's loss options (clip_ratio, clip_ratio_low, "
            "clip_ratio_high, clip_ratio_c, policy_loss.*); pass config=PolicyLossSettings(...)"
        )
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    if low is None or high is None:
        raise ValueError(
            "actor.clip_ratio is null and actor.clip_ratio_low/clip_ratio_high are not both set; "
            "set actor.clip_ratio (e.g. 0.2)"
        )
    return float(low), float(high)


def clip_ranges(config: PolicyLossSettings | None) -> tuple[float, float, float]:
    """(ε_low, ε_high, c); c (`clip_ratio_c`) must exceed 1."""
    low, high = clip_bounds(config)
    clip_ratio_c = config.clip_ratio_c
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"actor.clip_ratio_c must be greater than 1 for dual-clip PPO, got {clip_ratio_c}"
        )
    return low, high, float(clip_ratio_c)


def log_ratio(log_prob: jax.Array, old_log_prob: jax.Array) -> jax.Array:
    """logπ - logπ_old clamped to ±20 (the ratio then stays finite)."""
    return jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def weighted(losses: jax.Array, rollout_is_weights: jax.Array | None) -> jax.Array:
    """Per-token losses times the rollout importance weights, when given."""
    return losses if rollout_is_weights is None else losses * rollout_is_weights


def verl_policy_loss(name: str, terms_fn: PolicyLossTermsFn) -> PolicyLossFn:
    """verl's single-batch form of jrl's per-token loss `terms_fn`, registered under `name`.

    The result takes (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
    rollout_is_weights, **extra), `config` a `PolicyLossSettings`, and returns (loss, metrics):
    the loss aggregated with the loss's own mode when it fixes one, else `loss_agg_mode` (and
    `config.loss_scale_factor`); each metric the masked mean of its per-token matrix. `extra`
    goes to `terms_fn` (e.g. `rng`).
    """

    def loss_fn(
        old_log_prob: jax.Array,
        log_prob: jax.Array,
        advantages: jax.Array,
        response_mask: jax.Array,
        loss_agg_mode: str = "token-mean",
        config: PolicyLossSettings | None = None,
        rollout_is_weights: jax.Array | None = None,
        **extra: Any,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        inputs = PolicyInputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
        terms = terms_fn(inputs, config, **extra)
        factor = None if config is None else config.loss_scale_factor
        return reduce_loss_terms(terms, response_mask, loss_agg_mode, factor)

    loss_fn.__name__ = loss_fn.__qualname__ = f"compute_policy_loss_{name}"
    loss_fn.__doc__ = (
        f"`{name}` policy loss over one batch: (loss, metrics), from `{terms_fn.__name__}`."
    )
    return register_policy_loss(name)(loss_fn)


@register_policy_loss_terms("vanilla", options=CLIP_RANGES)
def policy_loss_terms_vanilla(
    inputs: PolicyInputs, settings: PolicyLossSettings | None = None
) -> LossTerms:
    """Per-token PPO clipped loss with dual clip for negative advantages.

    r = exp(clamp(logπ - logπ_old, ±20)); L1 = -A·r; L2 = -A·clip(r, 1-ε_low, 1+ε_high);
    Lc = max(L1, L2); L3 = -A·c; loss = min(L3, Lc) where A < 0 else Lc; × rollout_is_weights.
    `response_mask` only matters to the aggregation and metrics done by the caller.
    """
    low, high, clip_ratio_c = clip_ranges(settings)
    advantages = inputs.advantages
    log_r = log_ratio(inputs.log_prob, inputs.old_log_prob)
    ratio = jnp.exp(log_r)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - low, 1 + high)
    clip_max = jnp.maximum(unclipped, clipped)
    dual = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = weighted(
        jnp.where(negative, jnp.minimum(dual, clip_max), clip_max), inputs.rollout_is_weights
    )
    metrics = {
        "actor/pg_clipfrac": (clipped > unclipped).astype(jnp.float32),
        "actor/ppo_kl": -log_r,
        "actor/pg_clipfrac_lower": ((clip_max > dual) & negative).astype(jnp.float32),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics))


compute_policy_loss_vanilla = verl_policy_loss("vanilla", policy_loss_terms_vanilla)


def compute_policy_loss(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """verl's older entry point: the vanilla loss with explicit clip ranges.

    Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower).
    """
    config = PolicyLossSettings(
        clip_ratio=cliprange,
        clip_ratio_low=cliprange_low,
        clip_ratio_high=cliprange_high,
        clip_ratio_c=clip_ratio_c,
    )
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config
    )
    return (
        loss,
        metrics["actor/pg_clipfrac"],
        metrics["actor/ppo_kl"],
        metrics["actor/pg_clipfrac_lower"],
    )


def policy_loss_terms(
    settings: PolicyLossSettings,
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    rollout_is_weights: jax.Array | None = None,
) -> LossTerms:
    """The per-token terms of `settings.loss_mode` (its descriptor calls it: jrl's losses get
    `settings`, a loss that follows verl the actor section)."""
    inputs = PolicyInputs(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    return get_policy_loss(settings.loss_mode)(inputs, settings)
