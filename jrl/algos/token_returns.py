"""Estimators built on per-token returns: REINFORCE++, ReMax, plain reward, and none.

None of them needs groups. `reward` and `none` are the two extra options the configuration
document lists for `algorithm.adv_estimator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jrl.algos.estimator import register_adv_est
from jrl.algos.numerics import masked_whiten

Returns = tuple[jax.Array, jax.Array]  # (advantages, returns), each (batch, response)


def _on_rewards(fn: Callable[..., Returns]) -> Callable[..., Returns]:
    """`fn(rewards, mask, *extra)` jitted, rewards and mask taken as float32 without gradient."""

    @jax.jit
    def jitted(rewards: jax.Array, mask: jax.Array, *extra: jax.Array) -> Returns:
        rewards, mask = (jax.lax.stop_gradient(x).astype(jnp.float32) for x in (rewards, mask))
        return fn(rewards, mask, *extra)

    return jitted


def reward_to_go(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """Undiscounted reverse cumulative sum of the masked rewards along the response."""
    return jax.lax.cumsum(rewards * mask, axis=rewards.ndim - 1, reverse=True)


@register_adv_est("reinforce_plus_plus", options=("gamma",))
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++: discounted returns, whitened over the batch.

    Reverse scan G_t = r_t + γ·G_{t+1}, where the running return is multiplied by mask_t after
    each step (so it restarts after EOS and at masked tokens). returns = G;
    advantages = masked_whiten(G, mask)·mask. γ is `gamma` (``algorithm.gamma``).
    """
    if gamma is None:
        raise ValueError("reinforce_plus_plus needs the discount algorithm.gamma: pass gamma=...")
    return _reinforce_pp(token_level_rewards, response_mask, gamma)


@_on_rewards
def _reinforce_pp(rewards: jax.Array, mask: jax.Array, gamma: jax.Array) -> Returns:

    def step(running, xs):
        reward, valid = xs
        running = reward + gamma * running
        return running * valid, running

    start = jnp.zeros(rewards.shape[:1], jnp.float32)
    _, returns = jax.lax.scan(step, start, (rewards.T, mask.T), reverse=True)
    returns = returns.T
    return masked_whiten(returns, mask) * mask, returns


@register_adv_est("remax", inputs=("reward_baselines",))
def compute_remax_outcome_advantage(
    token_level_rewards: jax.Array,
    response_mask: jax.Array,
    reward_baselines: jax.Array | None = None,
    **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
    """ReMax: returns = reward-to-go of the masked rewards; advantages = returns - b·mask, where
    b (`reward_baselines`, one per row) is the summed reward of a greedy rollout of the same
    prompt."""
    rows = token_level_rewards.shape[0]
    if reward_baselines is None:
        raise ValueError(
            "remax needs a greedy baseline rollout: pass reward_baselines, the summed reward of "
            "a greedy (do_sample=False) response to each row's prompt"
        )
    if jnp.shape(reward_baselines) != (rows,):
        raise ValueError(
            f"remax reward_baselines must hold one value per row, shape ({rows},); "
            f"got {jnp.shape(reward_baselines)}"
        )
    return _remax(token_level_rewards, response_mask, reward_baselines)


@_on_rewards
def _remax(rewards: jax.Array, mask: jax.Array, baselines: jax.Array) -> Returns:
    returns = reward_to_go(rewards, mask)
    baselines = jax.lax.stop_gradient(jnp.asarray(baselines, jnp.float32))
    return returns - baselines[:, None] * mask, returns


@register_adv_est("reward", inputs=())
def compute_reward_advantage(
    token_level_rewards: jax.Array, response_mask: jax.Array, **kwargs: Any
) -> tuple[jax.Array, jax.Array]:
    """Reward only (no baseline, no critic): advantages = returns = reward-to-go of the masked
    token-level rewards, masked. With an outcome reward every valid token gets the score."""
    return _reward(token_level_rewards, response_mask)


@_on_rewards
def _reward(rewards: jax.Array, mask: jax.Array) -> Returns:
    returns = reward_to_go(rewards, mask) * mask
    return returns, returns


@register_adv_est("none", inputs=())
def compute_no_advantage(
    token_level_rewards: jax.Array, response_mask: jax.Array, **kwargs: Any
) -> tuple[jax.Array, jax.Array]:
    """No advantage estimation: advantages = returns = 0, so the policy-gradient term vanishes and
    only the other loss terms (KL, entropy) train the actor."""
    zeros = jnp.zeros(token_level_rewards.shape, jnp.float32)
    return zeros, zeros
