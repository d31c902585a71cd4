"""Rewards: rule scorers per data source and the reward managers that apply them to a batch."""

from jrl.reward.default import default_compute_score
from jrl.reward.manager import NaiveRewardManager, load_custom_reward_fn, load_reward_manager

__all__ = [
    "NaiveRewardManager",
    "default_compute_score",
    "load_custom_reward_fn",
    "load_reward_manager",
]
