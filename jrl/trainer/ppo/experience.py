"""The advantage phase of a PPO step: in-reward KL, the advantage estimator and rollout
correction, from the batch's scores, log-probs and values (`jrl.algos`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jrl import algos
from jrl.algos.rollout_correction import rollout_correction_step
from jrl.batch import Batch
from jrl.runspec.rollout_correction_checks import legacy_rollout_is


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
    batch: Batch, algorithm: Mapping[str, Any], actor: Mapping[str, Any] | None = None
) -> tuple[Batch, dict[str, float]]:
    """Rollout correction from whichever spelling the config uses (`actor`: the actor section,
    whose ``rollout_is*`` keys stand in for unset ``algorithm.rollout_is*`` ones).

    verl v0.6 (``algorithm.rollout_is*``): `mismatch/` metrics and, with ``rollout_is``, weights
    zeroed where mask mode or the veto reject; response_mask is unchanged. Current verl
    (``algorithm.rollout_correction``): `rollout_corr/` metrics whenever the batch has
    rollout log-probs, weights with ``rollout_is``, and rejection removes tokens from
    response_mask (run it before the advantage estimator, as verl does)."""
    t = batch.tensors
    legacy = legacy_rollout_is(algorithm, actor)
    if legacy["rollout_is_threshold"] is None and not legacy["rollout_is"]:
        return _current_correction(batch, algorithm["rollout_correction"])
    weights, kept, metrics = algos.rollout_importance_sampling(
        legacy, t["old_log_probs"], t.get("rollout_log_probs"), t["response_mask"]
    )
    if weights is None:
        return batch, metrics
    weights = np.asarray(weights, np.float32) * np.asarray(kept, np.float32)
    return batch.union(Batch({"rollout_is_weights": weights})), metrics


def _current_correction(batch: Batch, section: Mapping[str, Any]) -> tuple[Batch, dict[str, float]]:
    t = batch.tensors
    weights, mask, metrics = rollout_correction_step(
        section, t["old_log_probs"], t.get("rollout_log_probs"), t["response_mask"]
    )
    new = {"response_mask": np.asarray(mask)}
    if weights is not None:
        new["rollout_is_weights"] = np.asarray(weights, np.float32)
    return batch.union(Batch(new)), metrics
