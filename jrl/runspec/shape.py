"""Which parts a run has, read from its keys: the devices it asks for, whether it trains a critic
and whether it needs a reference policy (read through a `KeyReads` view when given one)."""

from __future__ import annotations

from ml_collections import ConfigDict

from jrl.algos.estimator import ADV_ESTIMATORS
from jrl.runspec.reads import KeyReads


def n_gpus(config: ConfigDict) -> int:
    """Devices the run asks for: trainer.nnodes * trainer.n_gpus_per_node."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def uses_reference(config: ConfigDict | KeyReads) -> bool:
    """Whether a reference policy is needed (KL loss in the actor, or KL in the reward)."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def estimator_needs_critic(config: ConfigDict | KeyReads) -> bool:
    """Whether ``algorithm.adv_estimator`` (its descriptor) reads the critic's values, as gae
    does (False for an unknown name, which validation reports)."""
    estimator = ADV_ESTIMATORS.find(config.algorithm.adv_estimator)
    return estimator is not None and estimator.needs_critic


def uses_critic(config: ConfigDict | KeyReads) -> bool:
    """Whether a critic is trained: always when the estimator needs the critic's values (then
    ``critic.enable`` is not read: False is a config error), else ``critic.enable``."""
    view = KeyReads.of(config)
    if estimator_needs_critic(view):
        view.critic.skip(
            "enable",
            f"algorithm.adv_estimator={view.algorithm.adv_estimator} reads the critic's values, so "
            "the critic trains whatever critic.enable says (False is an error)",
        )
        return True
    return bool(view.critic.enable)
