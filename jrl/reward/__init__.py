"""Rewards: rule scorers per data source and the reward managers that apply them to a batch.

Names are imported on first use, so that a reward worker process starts without JAX or
transformers.
"""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "default_compute_score": "jrl.reward.default",
        "RewardManager": "jrl.reward.base",
        "NaiveRewardManager": "jrl.reward.naive",
        "PrimeRewardManager": "jrl.reward.prime",
        "BatchRewardManager": "jrl.reward.batch",
        "DAPORewardManager": "jrl.reward.dapo",
        "REWARD_MANAGERS": "jrl.reward.settings",
        "RewardSettings": "jrl.reward.settings",
        "load_reward_manager": "jrl.reward.manager",
        "load_custom_reward_fn": "jrl.reward.custom",
    },
)
