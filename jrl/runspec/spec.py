"""`RunSpec`: the one frozen tree a run is built from, resolved once from verl's keys.

`resolve_run(config)` reads the checked ConfigDict through a `KeyReads` view and returns the
parts (mesh, data, the roles' settings, algorithm, rollout, step options, cadence, checkpoints,
logging, reward, the run's shape) with `keys`: every key it read and the fields it became, and
every key its choices left unread and why. `resolve_sft_run` does the same for SFT's tree (mesh,
model, data and the rest). Hot paths read the spec, never the config tree.
"""

from __future__ import annotations

import dataclasses

from ml_collections import ConfigDict

from jrl.agent.settings import AgentSettings
from jrl.reward.settings import RewardSettings
from jrl.rollout.spec import RolloutSpec
from jrl.runspec.agent import agent_settings
from jrl.runspec.algorithm import AlgorithmSpec, resolve_algorithm
from jrl.runspec.data import DataSpec, data_spec
from jrl.runspec.placement import AsyncSpec, async_spec
from jrl.runspec.reads import KeyReads, KeyRecord
from jrl.runspec.reward import reward_settings
from jrl.runspec.roles import (
    ActorSettings,
    CriticSettings,
    ReferenceSettings,
    RewardModelSettings,
    actor_settings,
    critic_settings,
    packing,
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
    correction), step options (`trainer`), cadence, checkpoints, loggers, rewards, rollout and
    its agent loops (`agent`; None: one turn per row), where the rollout runs (`placement`; None:
    on the trainer's devices);
    `keys`: each key read -> the fields it became, each key left unread -> why."""

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
    agent: AgentSettings | None
    placement: AsyncSpec | None
    keys: KeyRecord

    @property
    def trains_critic(self) -> bool:
        """``critic.enable``, or the estimator's need of values (`uses_critic`)."""
        return self.critic is not None

    @property
    def has_reference(self) -> bool:
        """A KL loss or KL in the reward (`uses_reference`)."""
        return self.ref is not None

    @property
    def reads(self) -> frozenset[str]:
        """Every key the resolver read."""
        return frozenset(self.keys.fields)


NO_CRITIC = "no critic in this run (critic.enable, or an estimator that reads values such as gae)"
NO_REFERENCE = "no reference policy in this run (actor.use_kl_loss or algorithm.use_kl_in_reward)"
# The reward model's own keys; the rest of its section configures the reward managers.
REWARD_MODEL_KEYS = (
    "model",
    "megatron",
    "micro_batch_size",
    "micro_batch_size_per_gpu",
    "max_length",
    "use_dynamic_bsz",
    "forward_max_token_len_per_gpu",
    "ulysses_sequence_parallel_size",
)


def resolve_run(config: ConfigDict) -> RunSpec:
    """The RunSpec of a checked PPO-family config (`jrl.runspec.load_config`). The sections of
    roles the run does not have are left unread (a card's values for them say nothing)."""
    view = KeyReads(config)
    trains_critic = view.resolve("critic", uses_critic, view)
    has_reference = view.resolve("ref", uses_reference, view)
    scores = view.resolve("reward_model", lambda: bool(view.reward_model.enable))
    if not trains_critic:
        view.skip(("critic", "trainer.max_critic_ckpt_to_keep"), NO_CRITIC, given_only=True)
    if not has_reference:
        view.skip("actor_rollout_ref.ref", NO_REFERENCE, given_only=True)
    if not scores:
        view.reward_model.skip(REWARD_MODEL_KEYS, "reward_model.enable is False")
    # Facts several roles share, resolved once: the answers per prompt and the policy's rows.
    arr = view.actor_rollout_ref
    policy_roles = ("actor", "ref") if has_reference else ("actor",)
    grouped = (*policy_roles, "critic") if trains_critic else policy_roles
    group_size = view.resolve(grouped, lambda: int(arr.rollout.n))
    policy = view.resolve(policy_roles, packing, arr.model, group_size)
    placement = view.resolve("placement", async_spec, view)
    version_steps = placement.version_steps if placement else 1
    return RunSpec(
        mesh=view.resolve("mesh", mesh_spec, view),
        data=view.resolve("data", data_spec, view),
        actor=view.resolve("actor", actor_settings, view, policy),
        ref=view.resolve("ref", reference_settings, view, policy) if has_reference else None,
        critic=view.resolve("critic", critic_settings, view, group_size) if trains_critic else None,
        reward_model=view.resolve("reward_model", reward_model_settings, view) if scores else None,
        algorithm=resolve_algorithm(view),
        trainer=view.resolve("trainer", trainer_spec, view),
        cadence=view.resolve("cadence", cadence_spec, view.trainer, version_steps),
        checkpoint=view.resolve("checkpoint", ppo_checkpoint_spec, view, trains_critic),
        logging=view.resolve("logging", logging_spec, view),
        reward=view.resolve("reward", reward_settings, view),
        rollout=view.resolve("rollout", rollout_spec, view),
        agent=view.resolve("agent", agent_settings, view),
        placement=placement,
        keys=view.ledger.record(),
    )


@dataclasses.dataclass(frozen=True)
class SFTRunSpec:
    """An SFT run's mesh, its trained model and data, its cadence (validation and a checkpoint
    also after the last step), its one role's checkpoints, its loggers, and `keys` (what became of
    each key)."""

    mesh: MeshSpec
    model: SFTModelSpec
    data: SFTDataSpec
    cadence: CadenceSpec
    checkpoint: CheckpointSpec
    logging: LoggingSpec
    keys: KeyRecord

    @property
    def reads(self) -> frozenset[str]:
        """Every key the resolver read."""
        return frozenset(self.keys.fields)


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
        keys=view.ledger.record(),
    )
