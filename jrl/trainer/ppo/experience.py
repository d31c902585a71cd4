"""The advantage phase of a PPO step: in-reward KL, rollout correction and the advantage
estimator, from the batch's scores, log-probs and values (`jrl.algos`), as the run's
`AlgorithmSpec` says, in verl's order (`advantage_phase`)."""

from __future__ import annotations

import numpy as np

from jrl import algos
from jrl.algos.kl import KLController
from jrl.algos.rollout_correction import rollout_correction_step
from jrl.batch import Batch
from jrl.runspec.algorithm import AlgorithmSpec


def advantage_phase(
    batch: Batch, algorithm: AlgorithmSpec, kl_ctrl: KLController | None, bypass: bool
) -> tuple[Batch, dict[str, float]]:
    """verl's order: the in-reward KL over the response mask as generated (`in_reward_kl`),
    then rollout correction, whose rejection takes tokens out of the mask (not in bypass mode,
    where the actor's loss corrects), then the estimator (`compute_advantage`)."""
    batch, metrics = in_reward_kl(batch, algorithm, kl_ctrl)
    if not bypass:
        batch, correction_metrics = rollout_correction(batch, algorithm.rollout_correction)
        metrics.update(correction_metrics)
    return compute_advantage(batch, algorithm), metrics


def in_reward_kl(
    batch: Batch, algorithm: AlgorithmSpec, kl_ctrl: KLController | None
) -> tuple[Batch, dict[str, float]]:
    """Adds ``token_level_rewards``: the scores less the in-reward KL with `kl_ctrl` (a copy of
    the scores without one)."""
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
    new = Batch({"token_level_rewards": np.asarray(rewards)})
    return batch.union(new), {k: float(v) for k, v in metrics.items()}


def compute_advantage(batch: Batch, algorithm: AlgorithmSpec) -> Batch:
    """The run's estimator over ``token_level_rewards`` and ``response_mask``: adds
    ``advantages`` and ``returns``."""
    t = batch.tensors
    advantages, returns = algos.compute_advantage(
        algorithm.estimator.name,
        token_level_rewards=t["token_level_rewards"],
        response_mask=t["response_mask"],
        options=algorithm.estimator_options,
        config=algorithm.estimator_config,
        index=batch.meta["uid"],
        values=t.get("values"),
        reward_baselines=t.get("reward_baselines"),
    )
    new = {"advantages": np.asarray(advantages), "returns": np.asarray(returns)}
    return batch.union(Batch(new))


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
