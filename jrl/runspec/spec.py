"""`RunSpec`: the one frozen tree a run is built from, resolved once from verl's keys.

`resolve_run(config)` reads the checked ConfigDict through a `KeyReads` view and returns the
parts resolved so far (mesh, algorithm, cadence, checkpoints, logging, reward, rollout, the run's
shape) with `reads`, every key it read; `resolve_sft_run` does the same for SFT's tree. Hot paths
read the spec, never the config tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ml_collections import ConfigDict

from jrl.reward.settings import RewardSettings
from jrl.rollout.spec import RolloutSpec
from jrl.runspec.algorithm import AlgorithmSpec, resolve_algorithm
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import reward_settings
from jrl.runspec.rollout import rollout_spec
from jrl.runspec.run import (
    CadenceSpec,
    CheckpointSpec,
    LoggingSpec,
    MeshSpec,
    cadence_spec,
    logging_spec,
    mesh_spec,
    ppo_checkpoint_spec,
    sft_checkpoint_spec,
)
from jrl.runspec.shape import uses_critic, uses_reference


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A PPO-family run: its mesh, algorithm (estimator, KL, the actor's objective, rollout
    correction), cadence, checkpoints, loggers, rewards and rollout; whether it trains a critic
    (`trains_critic`: ``critic.enable``, or the estimator's need of values) and needs a
    reference policy (`has_reference`: a KL loss or KL in the reward); `key_fields`: each key
    resolved -> the fields it became."""

    mesh: MeshSpec
    algorithm: AlgorithmSpec
    cadence: CadenceSpec
    checkpoint: CheckpointSpec
    logging: LoggingSpec
    reward: RewardSettings
    rollout: RolloutSpec
    trains_critic: bool
    has_reference: bool
    key_fields: Mapping[str, tuple[str, ...]]

    @property
    def reads(self) -> frozenset[str]:
        """Every key the resolver read."""
        return frozenset(self.key_fields)


def resolve_run(config: ConfigDict) -> RunSpec:
    """The RunSpec of a checked PPO-family config (`jrl.runspec.load_config`)."""
    view = KeyReads(config)
    trains_critic = view.resolve("trains_critic", uses_critic, view)
    return RunSpec(
        mesh=view.resolve("mesh", mesh_spec, view),
        algorithm=resolve_algorithm(view),
        cadence=view.resolve("cadence", cadence_spec, view.trainer),
        checkpoint=view.resolve("checkpoint", ppo_checkpoint_spec, view, trains_critic),
        logging=view.resolve("logging", logging_spec, view),
        reward=view.resolve("reward", reward_settings, view),
        rollout=view.resolve("rollout", rollout_spec, view),
        trains_critic=trains_critic,
        has_reference=view.resolve("has_reference", uses_reference, view),
        key_fields=view.ledger.fields(),
    )


@dataclasses.dataclass(frozen=True)
class SFTRunSpec:
    """An SFT run's cadence (validation and a checkpoint also after the last step), its one
    role's checkpoints, its loggers, and `key_fields` (key -> the fields it became)."""

    cadence: CadenceSpec
    checkpoint: CheckpointSpec
    logging: LoggingSpec
    key_fields: Mapping[str, tuple[str, ...]]


def resolve_sft_run(config: ConfigDict, role: str) -> SFTRunSpec:
    """The SFTRunSpec of a checked SFT config whose trained model is saved as `role`."""
    view = KeyReads(config)
    return SFTRunSpec(
        cadence=view.resolve("cadence", cadence_spec, view.trainer),
        checkpoint=view.resolve("checkpoint", sft_checkpoint_spec, view, role),
        logging=view.resolve("logging", logging_spec, view),
        key_fields=view.ledger.fields(),
    )
