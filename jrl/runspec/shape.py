"""Which parts a run has, read from its keys: the devices it asks for, whether it trains a critic
and whether it needs a reference policy."""

from __future__ import annotations

from ml_collections import ConfigDict


def n_gpus(config: ConfigDict) -> int:
    """Devices the run asks for: trainer.nnodes * trainer.n_gpus_per_node."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def uses_reference(config: ConfigDict) -> bool:
    """Whether a reference policy is needed (KL loss in the actor, or KL in the reward)."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def uses_critic(config: ConfigDict) -> bool:
    """Whether a critic is trained: critic.enable, or (when null) adv_estimator == 'gae'."""
    if config.critic.enable is None:
        return config.algorithm.adv_estimator == "gae"
    return bool(config.critic.enable)
