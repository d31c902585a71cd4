"""The configs of verl's recipes that jrl's trainer runs, as the values each sets over the key
tree of its program (its YAML's own layer; the YAML's ``defaults`` list names that tree).

`DAPO_TRAINER`: verl v0.6.0's ``recipe/dapo/config/dapo_trainer.yaml`` (and
``dapo_megatron_trainer.yaml``, the same layer over ``ppo_megatron_trainer``), the config that
``python -m recipe.dapo.main_dapo`` composes: DAPO's reward manager, its overlong buffer off, the
generation batch following the training batch and the group filter off, until the command line
turns them on. (``algorithm.filter_groups._target_`` names verl's dataclass and has no key here.)
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
