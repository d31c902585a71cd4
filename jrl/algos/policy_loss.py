"""Policy-gradient losses (`actor.policy_loss.loss_mode`) and their registry.

Each loss exists in two forms sharing one implementation: a per-token form returning `LossTerms`
(for exact accumulation over micro-batches, see `jrl.algos.aggregation`) and verl's single-batch
form `(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (loss, metrics)`. `config` is the actor config section (attribute access;
an ml_collections ConfigDict, a dataclass or a mapping).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jrl.algos.aggregation import LossTerms, reduce_loss_terms
from jrl.algos.registry import Registry

LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
PolicyLossTermsFn = Callable[..., LossTerms]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "actor.policy_loss.loss_mode")
POLICY_LOSS_TERMS: Registry[PolicyLossTermsFn] = Registry(
    "per-token policy loss", "actor.policy_loss.loss_mode"
)
register_policy_loss = POLICY_LOSSES.register
get_policy_loss_fn = POLICY_LOSSES.get
register_policy_loss_terms = POLICY_LOSS_TERMS.register
get_policy_loss_terms_fn = POLICY_LOSS_TERMS.get


def config_option(config: Any, key: str, default: Any = None) -> Any:
    """`config.key`, or `default` when the key is absent or null."""
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def clip_ranges(config: Any) -> tuple[float, float, float]:
    """(ε_low, ε_high, c) from the actor config; low/high fall back to `clip_ratio`."""
    if config is None:
        raise ValueError(
            "The policy loss needs the actor config (clip_ratio, clip_ratio_low, clip_ratio_high, "
            "clip_ratio_c); pass config=<actor_rollout_ref.actor section>"
        )
    clip_ratio = config_option(config, "clip_ratio")
    low = config_option(config, "clip_ratio_low", clip_ratio)
    high = config_option(config, "clip_ratio_high", clip_ratio)
    if low is None or high is None:
        raise ValueError(
            "actor.clip_ratio is null and actor.clip_ratio_low/clip_ratio_high are not both set; "
            "set actor.clip_ratio (e.g. 0.2)"
        )
    clip_ratio_c = config_option(config, "clip_ratio_c", 3.0)
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"actor.clip_ratio_c must be greater than 1 for dual-clip PPO, got {clip_ratio_c}"
        )
    return float(low), float(high), float(clip_ratio_c)


@register_policy_loss_terms("vanilla")
def policy_loss_terms_vanilla(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
) -> LossTerms:
    """Per-token PPO clipped loss with dual clip for negative advantages.

    r = exp(clamp(logπ - logπ_old, ±20)); L1 = -A·r; L2 = -A·clip(r, 1-ε_low, 1+ε_high);
    Lc = max(L1, L2); L3 = -A·c; loss = min(L3, Lc) where A < 0 else Lc; × rollout_is_weights.
    `response_mask` only matters to the aggregation and metrics done by the caller.
    """
    low, high, clip_ratio_c = clip_ranges(config)
    log_ratio = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - low, 1 + high)
    clip_max = jnp.maximum(unclipped, clipped)
    dual = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = jnp.where(negative, jnp.minimum(dual, clip_max), clip_max)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    metrics = {
        "actor/pg_clipfrac": (clipped > unclipped).astype(jnp.float32),
        "actor/ppo_kl": -log_ratio,
        "actor/pg_clipfrac_lower": ((clip_max > dual) & negative).astype(jnp.float32),
    }
    return LossTerms(losses, jax.lax.stop_gradient(metrics))


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: jax.Array,
    log_prob: jax.Array,
    advantages: jax.Array,
    response_mask: jax.Array,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Dual-clip PPO loss over one batch and its metrics (`actor/pg_clipfrac`, `actor/ppo_kl`,
    `actor/pg_clipfrac_lower`, each a masked mean over valid tokens)."""
    terms = policy_loss_terms_vanilla(
        old_log_prob, log_prob, advantages, response_mask, config, rollout_is_weights
    )
    factor = config_option(config, "loss_scale_factor")
    return reduce_loss_terms(terms, response_mask, loss_agg_mode, factor)


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
    config = types.SimpleNamespace(
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
