"""Where the rollout runs and how it overlaps training: the RunSpec's `AsyncSpec`.

``actor_rollout_ref.hybrid_engine`` (True, verl's default) colocates every role on the trainer's
devices and runs the phases in turn. False splits each host's devices: the trainer keeps
``trainer.n_gpus_per_node`` of them and the rollout takes the next ``rollout.n_gpus_per_node``,
a divisor of the trainer's (verl's one-step-off and fully-async recipes' keys;
``rollout.nnodes`` must equal ``trainer.nnodes``: every process holds a part of both meshes and
runs one program). The rollout
then generates batch t + 1 while the trainer trains on batch t, with weights one version old
(``async_training.mode=one_step_off``, jrl's own key, as verl picks its recipe by program), or
streams finished groups to the trainer as they end (``fully_async``: verl's fully-async trainer,
its ``async_training.*`` keys: the trainer takes ``require_batches`` mini-batches per update and
syncs every ``trigger_parameter_sync_step`` updates; ``staleness_threshold`` bounds how far
ahead the rollout runs; ``partial_rollout`` lets running rows go on with new weights).
``actor_rollout_ref.rollout.update_weights_bucket_megabytes`` bounds what each weight-sync
program moves at once.

verl's fully-async trainer requires ``data.train_batch_size=0`` and ``data.gen_batch_size=1`` and
counts its run in prompts (``rollout.total_rollout_steps``); `settle_streamed_batches` turns
those into jrl's step sizes before the config is checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ml_collections import ConfigDict

from jrl.algos.estimator import ADV_ESTIMATORS
from jrl.config.tree import assign
from jrl.runspec.reads import KeyReads

ASYNC_MODES = ("one_step_off", "fully_async")
COLOCATED = "actor_rollout_ref.hybrid_engine is True: the roles share the trainer's devices"


@dataclasses.dataclass(frozen=True)
class AsyncSpec:
    """A split run: the rollout on `rollout_devices_per_node` devices of each host next to the
    trainer's; weights synced in buckets of `bucket_bytes`; one-step-off, or `fully_async` with
    verl's ``async_training`` options."""

    rollout_devices_per_node: int
    bucket_bytes: int
    fully_async: bool = False
    staleness_threshold: float = 0.0
    trigger_parameter_sync_step: int = 1
    require_batches: int = 1
    partial_rollout: bool = False

    @property
    def version_steps(self) -> int:
        """Steps per weight version, the unit in which verl's fully-async trainer counts
        ``trainer.test_freq`` (1 for one-step-off: a version a step)."""
        return self.trigger_parameter_sync_step if self.fully_async else 1


def streams(config: ConfigDict) -> bool:
    """Whether `config` runs verl's fully-async trainer (a split run in fully-async mode)."""
    split = not config.actor_rollout_ref.hybrid_engine
    return split and config.async_training.mode == "fully_async"


def settle_streamed_batches(config: ConfigDict) -> list[str]:
    """verl's fully-async batch keys as jrl's, in place; one line per key it changed.

    - ``data.train_batch_size=0`` (verl's required value): a step trains on the groups of one
      update, ``async_training.require_batches x actor.ppo_mini_batch_size`` prompts.
    - ``data.gen_batch_size=1`` (required too: verl's rollouter takes one prompt at a time):
      null, the loader's batch following the step's, as jrl's rollouter starts prompts one at
      a time from whatever batch the loader reads (with ``algorithm.filter_groups``, a step
      takes the groups it still needs from the rollouter, whatever this key).
    - ``rollout.total_rollout_steps`` (prompts): caps ``trainer.total_training_steps`` at
      ``total_rollout_steps // step`` (verl's trainer takes what its rollouter makes).
    """
    if not streams(config):
        return []
    data, changed = config.data, []
    mini = config.actor_rollout_ref.actor.ppo_mini_batch_size
    step = config.async_training.require_batches * mini
    if data.train_batch_size == 0:
        assign(config, "data.train_batch_size", step)
        changed.append(
            f"data.train_batch_size=0 (verl's fully-async value): {step} prompts a step, "
            "async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size"
        )
    if data.gen_batch_size == 1:
        assign(config, "data.gen_batch_size", None)
        changed.append(
            "data.gen_batch_size=1 (verl's fully-async value): the rollouter starts prompts one "
            f"at a time from the loader's batches of {data.train_batch_size}"
        )
    prompts = config.rollout.total_rollout_steps
    if prompts is not None and prompts > 0 and data.train_batch_size > 0:
        steps = prompts // data.train_batch_size
        given = config.trainer.total_training_steps
        if given is None or steps < given:
            assign(config, "trainer.total_training_steps", steps)
            changed.append(
                f"rollout.total_rollout_steps={prompts} prompts: trainer.total_training_steps="
                f"{steps} (steps of {data.train_batch_size} prompts)"
            )
    return changed


def async_spec(config: KeyReads) -> AsyncSpec | None:
    """The split placement of a run with ``hybrid_engine=False``; None when colocated."""
    if config.actor_rollout_ref.hybrid_engine:
        config.skip(("rollout", "async_training"), COLOCATED, given_only=True)
        config.actor_rollout_ref.rollout.skip("update_weights_bucket_megabytes", COLOCATED)
        return None
    config.rollout.skip("nnodes", "it equals trainer.nnodes (checked): each host holds both meshes")
    placed = AsyncSpec(
        rollout_devices_per_node=int(config.rollout.n_gpus_per_node),
        bucket_bytes=int(config.actor_rollout_ref.rollout.update_weights_bucket_megabytes) << 20,
    )
    sync = config.async_training
    if sync.mode != "fully_async":
        why = "async_training.mode is one_step_off: the rollout runs one batch ahead"
        sync.skip(("staleness_threshold", "trigger_parameter_sync_step", "require_batches"), why)
        sync.skip("partial_rollout", why)
        config.rollout.skip("total_rollout_steps", "jrl counts steps: trainer.total_training_steps")
        return placed
    with config.ledger.into("cadence"):  # its cap on the steps was settled at load
        config.rollout.get("total_rollout_steps")
    return dataclasses.replace(
        placed,
        fully_async=True,
        staleness_threshold=float(sync.staleness_threshold),
        trigger_parameter_sync_step=int(sync.trigger_parameter_sync_step),
        require_batches=int(sync.require_batches),
        partial_rollout=bool(sync.partial_rollout),
    )


def placement_problems(config: ConfigDict, num_devices: int | None) -> Iterator[str]:
    """What a split run (``hybrid_engine=False``) needs: the same hosts for both meshes, as many
    rollout devices as trainer devices, and room for both."""
    if config.actor_rollout_ref.hybrid_engine:
        return
    trainer, rollout = config.trainer, config.rollout
    sync = config.async_training
    if sync.mode not in ASYNC_MODES:
        yield f"async_training.mode={sync.mode!r} is not one of {', '.join(ASYNC_MODES)}"
    if sync.mode == "fully_async":
        yield from _fully_async_problems(config)
    if config.algorithm.filter_groups.enable and sync.mode != "fully_async":
        yield (
            "algorithm.filter_groups.enable with async_training.mode=one_step_off is not "
            "implemented (a step's further generation batches would wait on the pipeline); use "
            "async_training.mode=fully_async (the rollouter replaces each filtered group) or "
            "hybrid_engine=True"
        )
    if rollout.nnodes != trainer.nnodes:
        yield (
            f"rollout.nnodes={rollout.nnodes} must equal trainer.nnodes={trainer.nnodes}: jrl "
            "splits each host's devices between the trainer and the rollout (one program on "
            "every host); set rollout.nnodes to trainer.nnodes"
        )
    if rollout.n_gpus_per_node <= 0 or trainer.n_gpus_per_node % rollout.n_gpus_per_node:
        yield (
            f"rollout.n_gpus_per_node={rollout.n_gpus_per_node} must divide "
            f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}: each rollout device receives "
            "its shard of the weights from one trainer device; give the rollout a divisor of "
            "the trainer's devices per host"
        )
    needed = trainer.nnodes * (trainer.n_gpus_per_node + rollout.n_gpus_per_node)
    if num_devices is not None and needed > num_devices:
        yield (
            f"hybrid_engine=False needs trainer.nnodes * (trainer.n_gpus_per_node + "
            f"rollout.n_gpus_per_node) = {needed} devices, but {num_devices} are visible; lower "
            "trainer.n_gpus_per_node and rollout.n_gpus_per_node"
        )


def _fully_async_problems(config: ConfigDict) -> Iterator[str]:
    sync, arr = config.async_training, config.actor_rollout_ref
    if sync.staleness_threshold < 0:
        yield f"async_training.staleness_threshold={sync.staleness_threshold} must be >= 0"
    for key in ("trigger_parameter_sync_step", "require_batches"):
        if sync[key] < 1:
            yield f"async_training.{key}={sync[key]} must be >= 1"
    if not arr.rollout.calculate_log_probs:
        yield (
            "async_training.mode=fully_async needs the rollout's log-probs (each token keeps "
            "those of the weights that sampled it); set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    step = sync.require_batches * arr.actor.ppo_mini_batch_size
    if config.data.train_batch_size != step:
        yield (
            f"data.train_batch_size={config.data.train_batch_size} must equal "
            f"async_training.require_batches * actor_rollout_ref.actor.ppo_mini_batch_size = "
            f"{step}: a fully-async step trains on the groups of one update; set "
            f"data.train_batch_size={step}"
        )
    estimator = ADV_ESTIMATORS.find(config.algorithm.adv_estimator)
    if estimator is not None and estimator.needs_greedy_baseline:
        yield (
            f"algorithm.adv_estimator={config.algorithm.adv_estimator} (a greedy answer per "
            "prompt) with async_training.mode=fully_async is not implemented"
        )
