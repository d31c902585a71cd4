"""Advantage estimators (`algorithm.adv_estimator`): GAE and GRPO, plus their registry.

Estimators return (advantages, returns), both [B, R], and carry no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jrl.algos.numerics import masked_whiten
from jrl.algos.registry import Registry

AdvantageFn = Callable[..., tuple[jax.Array, jax.Array]]
ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.adv_estimator")
register_adv_est = ADV_ESTIMATORS.register
get_adv_estimator_fn = ADV_ESTIMATORS.get


@register_adv_est("gae")
def compute_gae_advantage_return(
    token_level_rewards: jax.Array,
    values: jax.Array,
    response_mask: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over the response tokens.

    Reverse scan from nextv=0, lastgae=0: δ_t = r_t + γ·nextv - V_t, g_t = δ_t + γλ·lastgae, and
    only tokens with mask 1 replace nextv←V_t and lastgae←g_t (masked tokens are skipped, the
    carried values pass through them). returns = lastgae + V (un-whitened); advantages =
    masked_whiten(lastgae, mask) over the whole batch.
    """
    return _gae(token_level_rewards, values, response_mask, gamma, lam)


@jax.jit
def _gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: jax.Array, lam: jax.Array
) -> tuple[jax.Array, jax.Array]:
    rewards, values, mask = (
        jax.lax.stop_gradient(x).astype(jnp.float32) for x in (rewards, values, mask)
    )

    def step(carry, xs):
        next_value, last_gae = carry
        reward, value, valid = xs
        delta = reward + gamma * next_value - value
        gae = delta + gamma * lam * last_gae
        next_value = value * valid + (1 - valid) * next_value
        last_gae = gae * valid + (1 - valid) * last_gae
        return (next_value, last_gae), last_gae

    start = jnp.zeros(rewards.shape[:1], jnp.float32)
    _, gaes = jax.lax.scan(step, (start, start), (rewards.T, values.T, mask.T), reverse=True)
    advantages = gaes.T
    return masked_whiten(advantages, mask), advantages + values


def group_ids_to_segments(index: Sequence | np.ndarray) -> tuple[np.ndarray, int]:
    """Map per-row group ids (any comparable values, e.g. uid strings) to int32 ids 0..G-1.

    Returns (segment_ids, num_groups); equal ids share a segment.
    """
    ids = np.asarray(index)
    if ids.ndim != 1:
        raise ValueError(f"Group index must be one id per row (1-D), got shape {ids.shape}")
    try:
        uniques, inverse = np.unique(ids, return_inverse=True)
    except TypeError as err:
        raise ValueError(
            "Group ids must be mutually comparable values of one type (e.g. all `uid` strings)"
        ) from err
    return inverse.reshape(-1).astype(np.int32), len(uniques)


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    index: Sequence | np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """GRPO outcome advantage: each row's summed reward normalised within its group.

    s_i = Σ_t r_it; μ, σ = mean and unbiased std of s over rows sharing `index[i]` (a singleton
    group gets μ=0, σ=1). A_i = (s_i - μ)/(σ + epsilon), or s_i - μ when
    `norm_adv_by_std_in_grpo` is False; broadcast over tokens and masked. returns = advantages.
    """
    segment_ids, _ = group_ids_to_segments(index)
    rows = token_level_rewards.shape[0]
    if len(segment_ids) != rows:
        raise ValueError(
            f"GRPO index has {len(segment_ids)} group ids but token_level_rewards has {rows} rows; "
            "pass one id (the prompt's `uid`) per row"
        )
    return _grpo(token_level_rewards, response_mask, segment_ids, epsilon, norm_adv_by_std_in_grpo)


@partial(jax.jit, static_argnames="norm_by_std")
def _grpo(
    rewards: jax.Array,
    mask: jax.Array,
    segment_ids: jax.Array,
    epsilon: jax.Array,
    norm_by_std: bool,
) -> tuple[jax.Array, jax.Array]:
    scores = jnp.sum(jax.lax.stop_gradient(rewards).astype(jnp.float32), axis=-1)
    rows = scores.shape[0]

    def group_sum(x: jax.Array) -> jax.Array:
        return jax.ops.segment_sum(x, segment_ids, num_segments=rows)[segment_ids]

    count = group_sum(jnp.ones_like(scores))
    grouped = count > 1
    mean = jnp.where(grouped, group_sum(scores) / count, 0.0)
    sq_dev = group_sum(jnp.square(scores - mean))
    std = jnp.where(grouped, jnp.sqrt(sq_dev / jnp.where(grouped, count - 1, 1.0)), 1.0)
    advantages = scores - mean
    if norm_by_std:
        advantages = advantages / (std + epsilon)
    advantages = advantages[:, None] * jax.lax.stop_gradient(mask).astype(jnp.float32)
    return advantages, advantages
