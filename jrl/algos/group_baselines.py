"""Outcome estimators with a per-prompt baseline: RLOO, REINFORCE++-baseline, OPO and GPG.

Each row's score s_i = Σ_t r_it is compared with a baseline computed over the rows that share its
group id (`index`, the prompt's `uid`); the result is broadcast over the row's tokens and masked.
returns = advantages for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jrl.algos.advantages import broadcast_masked, outcome_scores
from jrl.algos.estimator import register_adv_est
from jrl.algos.groups import group_mean, group_sum, segments_for
from jrl.algos.numerics import masked_whiten, safe_divide

RLOO = "rloo"
RLOO_VECTORIZED = "rloo_vectorized"
REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
OPO = "opo"
GPG = "gpg"


@register_adv_est(RLOO, inputs=("index",))
def compute_rloo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """REINFORCE leave-one-out: A_i = s_i - mean of the other rows of its group.

    Equivalently (s_i - μ_g)·n/(n-1) for a group of n > 1; a singleton keeps A = s.
    """
    return _baseline(token_level_rewards, response_mask, index, RLOO)


@register_adv_est(RLOO_VECTORIZED, inputs=("index",))
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """RLOO from segment sums: (n·s_i - Σ_g s)/(n - 1) for n > 1; a singleton gets A = 0."""
    return _baseline(token_level_rewards, response_mask, index, RLOO_VECTORIZED)


@register_adv_est(REINFORCE_PLUS_PLUS_BASELINE, inputs=("index",))
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++ with a group baseline: a_i = s_i - μ_g (singleton μ=0), spread over the row's
    valid tokens, then whitened over all valid tokens of the batch (masked_whiten) and masked."""
    return _baseline(token_level_rewards, response_mask, index, REINFORCE_PLUS_PLUS_BASELINE)


@register_adv_est(OPO, inputs=("index",))
def compute_opo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """OPO: A_i = s_i - b_g with the length-weighted baseline b_g = Σ_j L_j s_j / Σ_j L_j
    (L = number of valid tokens). A singleton, or a group whose responses are all empty (verl
    divides 0 by 0 there), gets b = 0."""
    return _baseline(token_level_rewards, response_mask, index, OPO)


@register_adv_est(GPG, inputs=("index",))
def compute_gpg_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    f_norm: float = 1.0,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """GPG: A_i = α·(s_i - μ_g)/f_norm with α = B / max(#rows with s ≠ 0, 1) over the whole
    batch (singleton μ=0)."""
    return _baseline(token_level_rewards, response_mask, index, GPG, f_norm)


def _baseline(
    rewards: jax.Array,
    mask: jax.Array,
    index: Sequence | np.ndarray,
    estimator: str,
    *args: float,
) -> tuple[jax.Array, jax.Array]:
    segment_ids = segments_for(index, rewards.shape[0], estimator)
    advantages = _run(_CORES[estimator], rewards, mask, segment_ids, *args)
    return advantages, advantages


@partial(jax.jit, static_argnums=0)
def _run(
    core: Callable[..., jax.Array],
    rewards: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    *args: float,
) -> jax.Array:
    mask = jax.lax.stop_gradient(mask).astype(jnp.float32)
    return core(outcome_scores(rewards), mask, segment_ids, *args)


def _rloo(scores: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
    count, mean = group_mean(scores, segment_ids)
    grouped = count > 1
    scale = count / jnp.where(grouped, count - 1, 1.0)
    return broadcast_masked(jnp.where(grouped, (scores - mean) * scale, scores), mask)


def _rloo_vectorized(scores: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
    count = group_sum(jnp.ones_like(scores), segment_ids)
    others = (count * scores - group_sum(scores, segment_ids)) / jnp.maximum(count - 1, 1.0)
    return broadcast_masked(jnp.where(count > 1, others, 0.0), mask)


def _rf_baseline(scores: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
    _, mean = group_mean(scores, segment_ids)
    return masked_whiten(broadcast_masked(scores - mean, mask), mask) * mask


def _opo(scores: jax.Array, mask: jax.Array, segment_ids: jax.Array) -> jax.Array:
    count = group_sum(jnp.ones_like(scores), segment_ids)
    lengths = jnp.sum(mask, axis=-1)
    weighted = safe_divide(
        group_sum(lengths * scores, segment_ids), group_sum(lengths, segment_ids)
    )
    return broadcast_masked(scores - jnp.where(count > 1, weighted, 0.0), mask)


def _gpg(
    scores: jax.Array, mask: jax.Array, segment_ids: jax.Array, f_norm: jax.Array
) -> jax.Array:
    _, mean = group_mean(scores, segment_ids)
    alpha = scores.shape[0] / jnp.maximum(jnp.count_nonzero(scores), 1)
    return broadcast_masked(alpha * (scores - mean) / f_norm, mask)


_CORES = {
    RLOO: _rloo,
    RLOO_VECTORIZED: _rloo_vectorized,
    REINFORCE_PLUS_PLUS_BASELINE: _rf_baseline,
    OPO: _opo,
    GPG: _gpg,
}
