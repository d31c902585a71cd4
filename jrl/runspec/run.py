"""The run-level parts of the RunSpec: what a run's ``trainer`` section (and the roles'
``checkpoint`` sections) become, for the PPO family and SFT alike.

- `MeshSpec`: the training mesh's sizes (``trainer.nnodes * n_gpus_per_node`` devices; the
  actor's ``fsdp_size``, ``ulysses_sequence_parallel_size`` and ``tensor_parallel_size``).
- `CadenceSpec`: steps, epochs, validation and save frequencies.
- `CheckpointSpec`: where checkpoints go, what each role saves and loads, how many are kept,
  and which one a run resumes from.
- `LoggingSpec`: the loggers, project and experiment names, and the run's folder.
- `TrainerSpec`: the PPO family's step options (seed, batch balance, critic warm-up,
  validation samples, generation dumps).

Each resolver reads verl's keys through a `KeyReads` view, so the keys it used are recorded.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from jrl.runspec.reads import KeyReads

# What a role's ``checkpoint.save_contents`` / ``load_contents`` may name.
CHECKPOINT_ITEMS = ("model", "optimizer", "extra", "hf_model")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The training mesh on `device` (``trainer.device``: cuda, cpu, tpu, ...): `devices` = data x
    fsdp x sequence x tensor (None or -1 `fsdp_size`: every device that is not sequence- or
    tensor-parallel), over `nnodes` hosts whose processes wait `join_timeout_s` for each other
    to join a multi-process run."""

    device: str
    devices: int
    nnodes: int
    join_timeout_s: int

    @property
    def devices_per_node(self) -> int:
        return self.devices // self.nnodes

    fsdp_size: int | None
    sequence_parallel: int
    tensor_parallel: int
    expert_parallel: int = 1


@dataclasses.dataclass(frozen=True)
class CadenceSpec:
    """Steps and cadence: `total_training_steps` (None: `total_epochs` passes over the data),
    validation every `test_freq` weight versions of `version_steps` steps each and a checkpoint
    every `save_freq` steps (verl's rules; a version is a step except in the fully-async
    trainer, which syncs every ``trigger_parameter_sync_step`` steps and validates after a
    sync)."""

    total_training_steps: int | None
    total_epochs: int
    test_freq: int
    save_freq: int
    val_before_train: bool
    val_only: bool
    version_steps: int = 1

    def total_steps(self, batches_per_epoch: int) -> int:
        """`total_training_steps`, else `total_epochs` * `batches_per_epoch`."""
        return int(self.total_training_steps or batches_per_epoch * self.total_epochs)


@dataclasses.dataclass(frozen=True)
class RoleCheckpoint:
    """What one role writes (`save_contents`) and reads back (`load_contents`): model,
    optimizer, extra, hf_model; `keep`: checkpoints kept (None: all)."""

    save_contents: tuple[str, ...]
    load_contents: tuple[str, ...]
    keep: int | None


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoints under `local_dir` (copied to `remote_dir` when set), per role; resumed from
    by `resume_mode` (auto / disable / resume_path with `resume_from_path`), the local copy
    deleted after loading when `delete_after_load`."""

    local_dir: str
    remote_dir: str | None
    roles: Mapping[str, RoleCheckpoint]
    resume_mode: str
    resume_from_path: str | None
    delete_after_load: bool

    @property
    def retention(self) -> dict[str, int | None]:
        """Checkpoints to keep per role (None: all)."""
        return {name: role.keep for name, role in self.roles.items()}


@dataclasses.dataclass(frozen=True)
class LoggingSpec:
    """The trackers of ``trainer.logger`` with the project and experiment names; metrics also
    go to ``<run_dir>/metrics.jsonl``. `tree` is the whole config, which trackers record."""

    loggers: tuple[str, ...]
    project: str
    experiment: str
    run_dir: str
    tree: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    """A PPO-family step: `seed` derives every sampling key and seeds the data loaders
    (``data.seed``, 0 when null); rows are balanced over the data-parallel shards when
    `balance_batch`; the actor updates from step `critic_warmup` on; `log_val_generations`
    validation samples go to the loggers; the scored generations of each step and validation
    are dumped to `rollout_data_dir` / `validation_data_dir` when set."""

    seed: int
    balance_batch: bool
    critic_warmup: int
    log_val_generations: int
    rollout_data_dir: str | None
    validation_data_dir: str | None

    def updates_actor(self, step: int) -> bool:
        """Whether step `step` (from 1) updates the actor: ``critic_warmup <= step``."""
        return self.critic_warmup <= step

    def actor_schedule_step(self, step: int) -> int:
        """The actor's learning-rate schedule index at step `step`: its updates before this one,
        ``step - max(1, critic_warmup)`` (verl steps the actor's scheduler only when it
        updates)."""
        return step - max(1, self.critic_warmup)


def trainer_spec(config: KeyReads) -> TrainerSpec:
    """The TrainerSpec of a PPO-family config."""
    trainer, seed = config.trainer, config.data.seed
    return TrainerSpec(
        seed=int(seed if seed is not None else 0),
        balance_batch=bool(trainer.balance_batch),
        critic_warmup=int(trainer.critic_warmup),
        log_val_generations=int(trainer.log_val_generations),
        rollout_data_dir=trainer.rollout_data_dir,
        validation_data_dir=trainer.validation_data_dir,
    )


def mesh_spec(config: KeyReads) -> MeshSpec:
    """The PPO family's mesh: the devices of ``trainer`` and the actor's parallel sizes."""
    actor = config.actor_rollout_ref.actor
    fsdp = actor.fsdp_config
    trainer = config.trainer
    return MeshSpec(
        device=str(trainer.device),
        devices=int(trainer.nnodes * trainer.n_gpus_per_node),
        nnodes=int(trainer.nnodes),
        join_timeout_s=int(trainer.ray_wait_register_center_timeout),
        fsdp_size=fsdp.fsdp_size,
        sequence_parallel=int(actor.ulysses_sequence_parallel_size),
        tensor_parallel=int(fsdp.get("tensor_parallel_size") or 1),
        expert_parallel=int(fsdp.get("expert_parallel_size") or 1),
    )


def cadence_spec(trainer: KeyReads, version_steps: int = 1) -> CadenceSpec:
    """The cadence of a ``trainer`` section (PPO family or SFT), ``test_freq`` counted in
    versions of `version_steps` steps."""
    before = bool(trainer.get("val_before_train", False))
    if not before:
        trainer.skip("val_only", "trainer.val_before_train is False (val_only stops after it)")
    return CadenceSpec(
        total_training_steps=trainer.total_training_steps,
        total_epochs=int(trainer.total_epochs),
        test_freq=int(trainer.test_freq),
        save_freq=int(trainer.save_freq),
        val_before_train=before,
        val_only=bool(trainer.get("val_only", False)) if before else False,
        version_steps=version_steps,
    )


def _role_checkpoint(section: KeyReads, keep: int | None) -> RoleCheckpoint:
    return RoleCheckpoint(
        save_contents=tuple(section.save_contents),
        load_contents=tuple(section.load_contents),
        keep=keep,
    )


def _resumption(trainer: KeyReads, path_in_auto: bool = False) -> dict[str, Any]:
    """The resumption keys; `path_in_auto`: ``resume_from_path`` also counts under
    ``resume_mode=auto`` (verl's SFT trainer; its PPO trainer reads it under resume_path only)."""
    mode = str(trainer.resume_mode)
    reads_path = mode == "resume_path" or (path_in_auto and mode == "auto")
    if not reads_path:
        trainer.skip("resume_from_path", f"trainer.resume_mode={mode} does not read it")
    return dict(
        local_dir=str(trainer.default_local_dir),
        remote_dir=trainer.get("default_hdfs_dir"),
        resume_mode=mode,
        resume_from_path=trainer.get("resume_from_path") if reads_path else None,
        delete_after_load=bool(trainer.get("del_local_ckpt_after_load", False)),
    )


def ppo_checkpoint_spec(config: KeyReads, trains_critic: bool) -> CheckpointSpec:
    """The actor's (and, with a critic, the critic's) checkpoints. Retention: the
    ``max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep`` keys, or 1 each with the
    deprecated ``remove_previous_ckpt_in_save`` (with a DeprecationWarning)."""
    trainer = config.trainer
    if trainer.remove_previous_ckpt_in_save:
        warnings.warn(
            "trainer.remove_previous_ckpt_in_save is deprecated; set "
            "trainer.max_actor_ckpt_to_keep=1 and trainer.max_critic_ckpt_to_keep=1 instead",
            DeprecationWarning,
            stacklevel=2,
        )
        keep = {"actor": 1, "critic": 1}
        why = "trainer.remove_previous_ckpt_in_save keeps one checkpoint of each role"
        trainer.skip(("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"), why)
    else:
        keep = {"actor": trainer.max_actor_ckpt_to_keep}
        if trains_critic:
            keep["critic"] = trainer.max_critic_ckpt_to_keep
    roles = {"actor": _role_checkpoint(config.actor_rollout_ref.actor.checkpoint, keep["actor"])}
    if trains_critic:
        roles["critic"] = _role_checkpoint(config.critic.checkpoint, keep["critic"])
    return CheckpointSpec(roles=MappingProxyType(roles), **_resumption(trainer))


def sft_checkpoint_spec(config: KeyReads, role: str) -> CheckpointSpec:
    """SFT's one `role`: ``trainer.checkpoint`` contents, ``trainer.max_ckpt_to_keep``; as in
    verl's SFT trainer, ``resume_from_path`` is read under ``resume_mode=auto`` too."""
    trainer = config.trainer
    roles = {role: _role_checkpoint(trainer.checkpoint, trainer.max_ckpt_to_keep)}
    return CheckpointSpec(roles=MappingProxyType(roles), **_resumption(trainer, path_in_auto=True))


# The trackers that name the run by trainer.project_name and experiment_name.
NAMED_LOGGERS = ("wandb", "mlflow", "swanlab")
RENAMED_LOGGERS = {"tracking": "wandb"}  # verl's older name, deprecated there


def logger_names(value: str | Sequence[str]) -> tuple[str, ...]:
    """``trainer.logger`` (one name or a list) as names, each once; verl's deprecated
    ``tracking`` is ``wandb``, with a DeprecationWarning."""
    names = (value,) if isinstance(value, str) else tuple(value)
    for old in set(names) & set(RENAMED_LOGGERS):
        message = f"trainer.logger: {old!r} is deprecated; use {RENAMED_LOGGERS[old]!r}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    return tuple(dict.fromkeys(RENAMED_LOGGERS.get(name, name) for name in names))


def logging_spec(config: KeyReads) -> LoggingSpec:
    """The loggers of a ``trainer`` section; the run's folder is ``default_local_dir``. The run's
    names are read where a logger shows them or the folder was made from them."""
    trainer = config.trainer
    loggers = logger_names(trainer.logger)
    names = ("project_name", "experiment_name")
    if set(loggers) & set(NAMED_LOGGERS) or config.follows("trainer.default_local_dir"):
        project, experiment = (str(trainer[key]) for key in names)
    else:
        why = f"names the run for {', '.join(NAMED_LOGGERS)} (none is in trainer.logger) and "
        trainer.skip(names, why + "for trainer.default_local_dir (set apart from it)")
        project = experiment = ""
    return LoggingSpec(
        loggers=loggers,
        project=project,
        experiment=experiment,
        run_dir=str(trainer.default_local_dir),
        tree=MappingProxyType(config.record()),
    )
