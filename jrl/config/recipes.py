"""The configs of verl's recipes that jrl's trainer runs, as the values each sets over the key
tree of its program (its YAML's own layer; the YAML's ``defaults`` list names that tree).

`DAPO_TRAINER`: verl v0.6.0's ``recipe/dapo/config/dapo_trainer.yaml`` (and
``dapo_megatron_trainer.yaml``, the same layer over ``ppo_megatron_trainer``), the config that
``python -m recipe.dapo.main_dapo`` composes: DAPO's reward manager, its overlong buffer off, the
generation batch following the training batch and the group filter off, until the command line
turns them on. (``algorithm.filter_groups._target_`` names verl's dataclass and has no key here.)

`ONE_STEP_OFF_TRAINER` and `FULLY_ASYNC_TRAINER`: current verl's
``verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml`` and
``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml`` (and their
``*_megatron_trainer.yaml``, the same layers over ``ppo_megatron_trainer``): the rollout on
devices of its own (their ``rollout`` section; ``hybrid_engine`` off, as their launch scripts set
it), the rollout's log-probs as the old ones, and for the fully-async trainer its
``async_training`` section (``async_training.mode`` is jrl's name for the choice of program)
and its run of 100 prompts (``rollout.total_rollout_steps``, which caps the training steps).
Their Ray, NCCL and vLLM-server keys (``checkpoint_engine``, ``free_cache_engine``,
``standalone_gpu_memory_utilization``, ``concurrent_samples_per_replica``, the dynamic-schedule
options) have no key here.
"""

from __future__ import annotations

from typing import Any

Layer = tuple[tuple[str, Any], ...]

DAPO_TRAINER: Layer = (
    ("data.gen_batch_size", "${data.train_batch_size}"),
    ("reward_model.reward_manager", "dapo"),
    ("reward_model.overlong_buffer.enable", False),
    ("reward_model.overlong_buffer.len", 0),
    ("reward_model.overlong_buffer.penalty_factor", 0.0),
    ("reward_model.overlong_buffer.log", False),
    ("algorithm.filter_groups.enable", False),
    ("algorithm.filter_groups.metric", None),
    ("algorithm.filter_groups.max_num_gen_batches", 0),
    ("trainer.project_name", "verl-dapo"),
)

ONE_STEP_OFF_TRAINER: Layer = (
    ("actor_rollout_ref.hybrid_engine", False),
    ("rollout.nnodes", 1),
    ("rollout.n_gpus_per_node", 8),
    ("actor_rollout_ref.rollout.calculate_log_probs", True),
    ("algorithm.rollout_correction.bypass_mode", True),
)

FULLY_ASYNC_TRAINER: Layer = (
    *ONE_STEP_OFF_TRAINER,
    ("async_training.mode", "fully_async"),
    ("rollout.total_rollout_steps", 100),
    ("async_training.staleness_threshold", 0.1),
    ("async_training.trigger_parameter_sync_step", 4),
    ("async_training.require_batches", 1),
    ("async_training.partial_rollout", True),
    ("async_training.use_trainer_do_validate", False),
    ("actor_rollout_ref.actor.use_rollout_log_probs", True),
    ("actor_rollout_ref.model.use_remove_padding", True),
)
