"""KL estimators between the policy and the reference, KL controllers, and KL-in-reward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jrl.algos.numerics import masked_mean
from jrl.algos.settings import KLControl

K3_INPUT_CLAMP = 20.0
K3_OUTPUT_CLAMP = 10.0
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_CONTROLLERS = ("fixed", "adaptive")


def kl_penalty_forward(logprob: jax.Array, ref_logprob: jax.Array, kl_penalty: str) -> jax.Array:
    """Per-token KL estimate named by `kl_penalty` (without a "+" suffix).

    kl/k1: logp - ref; abs: |logp - ref|; mse/k2: ½(logp - ref)²;
    low_var_kl/k3: x = clamp(ref - logp, ±20), clamp(eˣ - x - 1, ±10).
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return jnp.abs(logprob - ref_logprob)
    if kl_penalty in ("mse", "k2"):
        return 0.5 * jnp.square(logprob - ref_logprob)
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = jnp.clip(ref_logprob - logprob, -K3_INPUT_CLAMP, K3_INPUT_CLAMP)
        kld = jnp.exp(log_ratio) - log_ratio - 1
        return jnp.clip(kld, -K3_OUTPUT_CLAMP, K3_OUTPUT_CLAMP)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty 'full' (KL over the whole vocabulary) is not implemented; "
            f"use one of {', '.join(KL_ESTIMATORS)}"
        )
    raise ValueError(
        f"Unknown kl_penalty {kl_penalty!r} (algorithm.kl_penalty / actor.kl_loss_type); "
        f"choose one of {', '.join(KL_ESTIMATORS)}, optionally with a '+' suffix"
    )


def kl_penalty(logprob: jax.Array, ref_logprob: jax.Array, kl_penalty: str) -> jax.Array:
    """Per-token KL estimate; a "+" suffix (e.g. "k3+") keeps the value of the named estimator but
    takes the gradient of k2 (straight-through, current verl's form, whose value is the
    estimator's exactly): k2 - stop_gradient(k2) + stop_gradient(value)."""
    if not kl_penalty.endswith("+"):
        return kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
    k2 = kl_penalty_forward(logprob, ref_logprob, "k2")
    return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)


# `apply_kl_penalty` takes verl's keyword `kl_penalty`, which shadows the function inside it.
_estimate = kl_penalty


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No change."""


class AdaptiveKLController:
    """KL coefficient steered towards `target_kl` (Ziegler et al., 2019).

    update: e = clip(kl/target - 1, ±0.2); value *= 1 + e·n_steps/horizon.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be positive, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient after observing `current_kl` over `n_steps` samples."""
        error = float(np.clip(float(current_kl) / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def get_kl_controller(kl_ctrl_config: KLControl) -> KLController:
    """Controller from `algorithm.kl_ctrl` (type fixed|adaptive, kl_coef, target_kl, horizon)."""
    kind = kl_ctrl_config.type
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_ctrl_config.kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=kl_ctrl_config.kl_coef,
            target_kl=kl_ctrl_config.target_kl,
            horizon=kl_ctrl_config.horizon,
        )
    raise ValueError(
        f"Unknown algorithm.kl_ctrl.type {kind!r}; choose one of {', '.join(KL_CONTROLLERS)}"
    )


def apply_kl_penalty(
    token_level_scores: jax.Array,
    old_log_probs: jax.Array,
    ref_log_prob: jax.Array,
    response_mask: jax.Array,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[jax.Array, dict[str, float]]:
    """KL-in-reward (`algorithm.use_kl_in_reward`): rewards = scores - β·kld·mask.

    β is the controller value before this step; the controller is then updated with the batch
    mean of per-row masked-mean KL and n_steps = number of rows. Metrics:
    `actor/reward_kl_penalty` (that mean KL) and `actor/reward_kl_penalty_coeff` (β).
    """
    kld = _estimate(old_log_probs, ref_log_prob, kl_penalty) * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(jnp.mean(masked_mean(kld, response_mask, axis=-1)))
    kl_ctrl.update(current_kl=current_kl, n_steps=int(token_level_scores.shape[0]))
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics
