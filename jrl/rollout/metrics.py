"""How far the rollout's token probabilities, and a mixture of experts' routes, are from the
trainer's recomputation of them."""

from __future__ import annotations

import numpy as np


def log_prob_mismatch_metrics(
    rollout_log_probs: np.ndarray, old_log_probs: np.ndarray, response_mask: np.ndarray
) -> dict[str, float]:
    """verl's rollout-vs-trainer probability metrics over the valid response tokens.

    With p = exp(log-prob) of each token under the rollout and under the trainer (`old_log_probs`):
    `training/rollout_probs_diff_{max,mean,std}` of |p_trainer - p_rollout| (std with one degree
    of freedom), `training/rollout_actor_probs_pearson_corr` of the two (1 where both are the same
    constant, 0 where only one is constant), and `training/rollout_probs_diff_valid` (0 with no
    valid token, and then nothing else).
    """
    shapes = {np.shape(rollout_log_probs), np.shape(old_log_probs), np.shape(response_mask)}
    if len(shapes) != 1:
        raise ValueError(
            "rollout_log_probs, old_log_probs and response_mask must share one [B, R] shape; "
            f"got {np.shape(rollout_log_probs)}, {np.shape(old_log_probs)}, "
            f"{np.shape(response_mask)}"
        )
    valid = np.asarray(response_mask) > 0
    if not valid.any():
        return {"training/rollout_probs_diff_valid": 0.0}
    rollout = np.exp(np.asarray(rollout_log_probs, np.float64)[valid])
    trainer = np.exp(np.asarray(old_log_probs, np.float64)[valid])
    diff = np.abs(trainer - rollout)
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std(ddof=1)) if diff.size > 1 else 0.0,
        "training/rollout_actor_probs_pearson_corr": _pearson(trainer, rollout),
    }


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    dx, dy = x - x.mean(), y - y.mean()
    scale = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    if scale == 0:
        return float(np.array_equal(x, y))
    return float(np.sum(dx * dy) / scale)


def route_mismatch_metrics(
    recorded: np.ndarray, used: np.ndarray, attention_mask: np.ndarray
) -> dict[str, float]:
    """How often training's experts differ from the recorded ones (the rollout's, verl's
    ``routed_experts``), over the real tokens that have a recorded route: routes [B, T, sparse
    layers, k], compared as sets of k experts per layer.

    `training/routes_differ_fraction`: tokens with a different set in at least one layer;
    `training/route_layers_differ_fraction`: (token, layer) pairs with a different set;
    `training/routed_tokens`: the tokens compared.
    """
    recorded, used = np.sort(np.asarray(recorded), -1), np.sort(np.asarray(used), -1)
    routed = (np.asarray(attention_mask) > 0) & (recorded >= 0).all(axis=(-2, -1))
    differs = (recorded != used).any(-1)[routed]  # [tokens, layers]
    count = int(routed.sum())
    return {
        "training/routed_tokens": float(count),
        "training/routes_differ_fraction": float(differs.any(-1).mean()) if count else 0.0,
        "training/route_layers_differ_fraction": float(differs.mean()) if count else 0.0,
    }
