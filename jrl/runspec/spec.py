"""`RunSpec`: the one frozen tree a run is built from, resolved once from verl's keys.

`resolve_run(config)` reads the checked ConfigDict through a `KeyReads` view and returns the
parts resolved so far (mesh, data, the roles' settings, algorithm, rollout, step options,
cadence, checkpoints, logging, reward, the run's shape) with `key_fields`, every key it read and
the fields it became; `resolve_sft_run` does the same for SFT's tree (mesh, model, data and the
rest). Hot paths read the spec, never the config tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ml_collections import ConfigDict

from jrl.reward.settings import RewardSettings
from jrl.rollout.spec import RolloutSpec
from jrl.runspec.algorithm import AlgorithmSpec, resolve_algorithm
from jrl.runspec.data import DataSpec, data_spec
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import reward_settings
from jrl.runspec.roles import (
    ActorSettings,
    CriticSettings,
    ReferenceSettings,
    RewardModelSettings,
    actor_settings,
    critic_settings,
    reference_settings,
    reward_model_settings,
)
from jrl.runspec.rollout import rollout_spec
from jrl.runspec.run import (
    CadenceSpec,
    CheckpointSpec,
    LoggingSpec,
    MeshSpec,
    TrainerSpec,
    cadence_spec,
    logging_spec,
    mesh_spec,
    ppo_checkpoint_spec,
    sft_checkpoint_spec,
    trainer_spec,
)
from jrl.runspec.sft import (
    SFTDataSpec,
    SFTModelSpec,
    sft_data_spec,
    sft_mesh_spec,
    sft_model_spec,
)
from jrl.runspec.shape import uses_critic, uses_reference


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A PPO-family run: its mesh, data, roles (`actor`; `ref`, `critic`, `reward_model`: None
    where the run has none), algorithm (estimator, KL, the actor's objective, rollout
    correction), step options (`trainer`), cadence, checkpoints, loggers, rewards and rollout;
    whether it trains a critic (`trains_critic`: ``critic.enable``, or the estimator's need of
    values) and needs a reference policy (`has_reference`: a KL loss or KL in the reward);
    `key_fields`: each key resolved -> the fields it became."""

    mesh: MeshSpec
    data: DataSpec
    actor: ActorSettings
    ref: ReferenceSettings | None
    critic: CriticSettings | None
    reward_model: RewardModelSettings | None
    algorithm: AlgorithmSpec
    trainer: TrainerSpec
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
    has_reference = view.resolve("has_reference", uses_reference, view)
    scores = view.resolve("reward_model", lambda: bool(view.reward_model.enable))
    return RunSpec(
        mesh=view.resolve("mesh", mesh_spec, view),
        data=view.resolve("data", data_spec, view),
        actor=view.resolve("actor", actor_settings, view),
        ref=view.resolve("ref", reference_settings, view) if has_reference else None,
        critic=view.resolve("critic", critic_settings, view) if trains_critic else None,
        reward_model=view.resolve("reward_model", reward_model_settings, view) if scores else None,
        algorithm=resolve_algorithm(view),
        trainer=view.resolve("trainer", trainer_spec, view),
        cadence=view.resolve("cadence", cadence_spec, view.trainer),
        checkpoint=view.resolve("checkpoint", ppo_checkpoint_spec, view, trains_critic),
        logging=view.resolve("logging", logging_spec, view),
        reward=view.resolve("reward", reward_settings, view),
        rollout=view.resolve("rollout", rollout_spec, view),
        trains_critic=trains_critic,
        has_reference=has_reference,
        key_fields=view.ledger.fields(),
    )


@dataclasses.dataclass(frozen=True)
class SFTRunSpec:
    """An SFT run's mesh, its trained model and data, its cadence (validation and a checkpoint
    also after the last step), its one role's checkpoints, its loggers, and `key_fields` (key ->
    the fields it became)."""

    mesh: MeshSpec
    model: SFTModelSpec
    data: SFTDataSpec
    cadence: CadenceSpec
    checkpoint: CheckpointSpec
    logging: LoggingSpec
    key_fields: Mapping[str, tuple[str, ...]]


def resolve_sft_run(config: ConfigDict, role: str) -> SFTRunSpec:
    """The SFTRunSpec of a checked SFT config whose trained model is saved as `role`."""
    view = KeyReads(config)
    return SFTRunSpec(
        mesh=view.resolve("mesh", sft_mesh_spec, view),
        model=view.resolve("model", sft_model_spec, view),
        data=view.resolve("data", sft_data_spec, view),
        cadence=view.resolve("cadence", cadence_spec, view.trainer),
        checkpoint=view.resolve("checkpoint", sft_checkpoint_spec, view, role),
        logging=view.resolve("logging", logging_spec, view),
        key_fields=view.ledger.fields(),
    )
