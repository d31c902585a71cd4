"""The advantage phase of a PPO step: in-reward KL, the advantage estimator and rollout
importance sampling, from the batch's scores, log-probs and values (`jrl.algos`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jrl import algos
from jrl.batch import Batch


def compute_advantage(
    batch: Batch, algorithm: Mapping[str, Any], kl_ctrl: Any = None
) -> tuple[Batch, dict[str, float]]:
    """In-reward KL with `kl_ctrl` (or a copy of the scores), then the estimator of the
    ``algorithm`` section: adds ``token_level_rewards``, ``advantages`` and ``returns``."""
    t = batch.tensors
    metrics: dict[str, float] = {}
    if kl_ctrl is not None:
        rewards, metrics = algos.apply_kl_penalty(
            t["token_level_scores"],
            t["old_log_probs"],
            t["ref_log_prob"],
            t["response_mask"],
            kl_ctrl,
            kl_penalty=algorithm["kl_penalty"],
        )
    else:
        rewards = t["token_level_scores"]
    advantages, returns = algos.compute_advantage(
        algorithm["adv_estimator"],
        token_level_rewards=rewards,
        response_mask=t["response_mask"],
        config=algorithm,
        index=batch.meta["uid"],
        values=t.get("values"),
        reward_baselines=t.get("reward_baselines"),
        gamma=algorithm["gamma"],
        lam=algorithm["lam"],
        norm_adv_by_std_in_grpo=algorithm["norm_adv_by_std_in_grpo"],
    )
    new = {
        "token_level_rewards": np.asarray(rewards),
        "advantages": np.asarray(advantages),
        "returns": np.asarray(returns),
    }
    return batch.union(Batch(new)), {k: float(v) for k, v in metrics.items()}


def rollout_correction(
    batch: Batch, algorithm: Mapping[str, Any]
) -> tuple[Batch, dict[str, float]]:
    """Rollout importance sampling (``algorithm.rollout_is*``): mismatch metrics, and with
    ``rollout_is`` the per-token weights that the policy loss multiplies by. Mask mode and the
    veto zero the weights of rejected tokens/rows (verl 0.6); response_mask is unchanged."""
    t = batch.tensors
    weights, kept, metrics = algos.rollout_importance_sampling(
        algorithm,
        t["old_log_probs"],
        t.get("rollout_log_probs"),
        t["response_mask"],
    )
    if weights is None:
        return batch, metrics
    weights = np.asarray(weights, np.float32) * np.asarray(kept, np.float32)
    return batch.union(Batch({"rollout_is_weights": weights})), metrics
