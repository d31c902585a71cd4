"""The advantage phase of a PPO step: in-reward KL, the advantage estimator and rollout
correction, from the batch's scores, log-probs and values (`jrl.algos`), as the run's
`AlgorithmSpec` says."""

from __future__ import annotations

import numpy as np

from jrl import algos
from jrl.algos.kl import KLController
from jrl.algos.rollout_correction import rollout_correction_step
from jrl.batch import Batch
from jrl.runspec.algorithm import AlgorithmSpec


def compute_advantage(
    batch: Batch, algorithm: AlgorithmSpec, kl_ctrl: KLController | None = None
) -> tuple[Batch, dict[str, float]]:
    """In-reward KL with `kl_ctrl` (or a copy of the scores), then the run's estimator: adds
    ``token_level_rewards``, ``advantages`` and ``returns``."""
    t = batch.tensors
    metrics: dict[str, float] = {}
    if kl_ctrl is not None:
        rewards, metrics = algos.apply_kl_penalty(
            t["token_level_scores"],
            t["old_log_probs"],
            t["ref_log_prob"],
            t["response_mask"],
            kl_ctrl,
            kl_penalty=algorithm.kl_in_reward.kl_penalty,
        )
    else:
        rewards = t["token_level_scores"]
    advantages, returns = algos.compute_advantage(
        algorithm.estimator.name,
        token_level_rewards=rewards,
        response_mask=t["response_mask"],
        options=algorithm.estimator_options,
        config=algorithm.estimator_config,
        index=batch.meta["uid"],
        values=t.get("values"),
        reward_baselines=t.get("reward_baselines"),
    )
    new = {
        "token_level_rewards": np.asarray(rewards),
        "advantages": np.asarray(advantages),
        "returns": np.asarray(returns),
    }
    return batch.union(Batch(new)), {k: float(v) for k, v in metrics.items()}


def rollout_correction(
    batch: Batch, correction: algos.RolloutCorrection
) -> tuple[Batch, dict[str, float]]:
    """Rollout correction in the spelling the config uses.

    verl v0.6 (`correction.legacy`): `mismatch/` metrics and, with ``rollout_is``, weights
    zeroed where mask mode or the veto reject; response_mask is unchanged. Current verl
    (``algorithm.rollout_correction``): `rollout_corr/` metrics whenever the batch has rollout
    log-probs, weights with ``rollout_is``, and rejection removes tokens from response_mask (run
    it before the advantage estimator, as verl does)."""
    t = batch.tensors
    if correction.legacy is None:
        return _current_correction(batch, correction.current)
    weights, kept, metrics = algos.rollout_importance_sampling(
        correction.legacy, t["old_log_probs"], t.get("rollout_log_probs"), t["response_mask"]
    )
    if weights is None:
        return batch, metrics
    weights = np.asarray(weights, np.float32) * np.asarray(kept, np.float32)
    return batch.union(Batch({"rollout_is_weights": weights})), metrics


def _current_correction(
    batch: Batch, options: algos.CorrectionOptions
) -> tuple[Batch, dict[str, float]]:
    t = batch.tensors
    weights, mask, metrics = rollout_correction_step(
        options, t["old_log_probs"], t.get("rollout_log_probs"), t["response_mask"]
    )
    new = {"response_mask": np.asarray(mask)}
    if weights is not None:
        new["rollout_is_weights"] = np.asarray(weights, np.float32)
    return batch.union(Batch(new)), metrics
