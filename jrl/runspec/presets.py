"""Presets that shrink an experiment to run on one CPU: `--config=configs/gsm8k_ppo.py:tiny`.

A preset keeps the experiment's algorithm and changes only its scale: data and model paths,
batch and sequence sizes, step counts, one float32 CPU device and the built-in `jax` sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ml_collections import ConfigDict

from jrl import assets
from jrl.config.errors import ConfigError
from jrl.config.overrides import apply_overrides

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"

_CPU = {
    "trainer.device": "cpu",
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
    "trainer.logger": ["console"],
    "trainer.total_epochs": 1,
    "trainer.val_before_train": True,
    "trainer.project_name": "jrl",
    "data.truncation": "left",
    f"{ROLLOUT}.name": "jax",
    f"{ROLLOUT}.dtype": "float32",
    f"{ROLLOUT}.tensor_model_parallel_size": 1,
    f"{ACTOR}.fsdp_config.dtype": "float32",
    "actor_rollout_ref.ref.fsdp_config.dtype": "float32",
    "critic.model.fsdp_config.dtype": "float32",
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": 4,
    f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
    "critic.ppo_micro_batch_size_per_gpu": 4,
}


@dataclass(frozen=True)
class Preset:
    """A laptop-sized variant: where its files are, its values, its samples per prompt."""

    paths: Callable[[], dict[str, str]]
    values: dict[str, Any]
    group_size: int


PRESETS = {
    "tiny": Preset(
        paths=assets.tiny_paths,
        values={
            "data.train_batch_size": 4,
            "data.max_prompt_length": 128,
            "data.max_response_length": 16,
            "data.val_max_samples": 8,
            f"{ACTOR}.ppo_mini_batch_size": 4,
            f"{ACTOR}.optim.lr": 1e-4,
            "critic.optim.lr": 1e-3,
            "trainer.total_training_steps": 3,
            "trainer.test_freq": 2,
        },
        group_size=2,
    ),
    "quickstart": Preset(
        paths=assets.quickstart_paths,
        values={
            # Prompts are about 70 tokens with the chat template; packed rows skip the padding.
            "data.train_batch_size": 4,
            "data.max_prompt_length": 128,
            "data.max_response_length": 48,
            "actor_rollout_ref.model.use_remove_padding": True,
            "critic.model.use_remove_padding": True,
            "data.val_max_samples": 8,
            f"{ACTOR}.ppo_mini_batch_size": 4,
            f"{ACTOR}.optim.lr": 1e-6,
            "trainer.total_training_steps": 3,
            "trainer.test_freq": 3,
        },
        group_size=4,
    ),
}


def algorithm_name(config: ConfigDict) -> str:
    """Short name of the experiment's algorithm: 'ppo' for GAE, else the estimator's name."""
    estimator = config.algorithm.adv_estimator
    return "ppo" if estimator == "gae" else estimator


def apply_preset(config: ConfigDict, preset: str | None) -> ConfigDict:
    """`config` changed by the named preset (None: unchanged); group sampling keeps groups."""
    if preset is None:
        return config
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    chosen = PRESETS[preset]
    paths = chosen.paths()
    values = {
        **_CPU,
        **chosen.values,
        "data.train_files": paths["train_files"],
        "data.val_files": paths["val_files"],
        "actor_rollout_ref.model.path": paths["model_path"],
        "trainer.experiment_name": f"{algorithm_name(config)}_{preset}",
    }
    if config.actor_rollout_ref.rollout.n > 1:
        values[f"{ROLLOUT}.n"] = chosen.group_size
    return apply_overrides(config, list(values.items()))


SFT_PRESETS: dict[str, tuple[Callable[[], dict[str, str]], dict[str, Any]]] = {
    "tiny": (
        assets.prepare_tiny,
        {
            "data.train_batch_size": 8,
            "data.micro_batch_size_per_gpu": 4,
            "data.max_length": 64,
            "optim.lr": 1e-3,
            "trainer.total_training_steps": 4,
            "trainer.test_freq": 2,
        },
    ),
}


def apply_sft_preset(config: ConfigDict, preset: str | None) -> ConfigDict:
    """An SFT `config` changed by the named preset (None: unchanged): the preset's files (built
    on first use), sizes and one float32 CPU device."""
    if preset is None:
        return config
    if preset not in SFT_PRESETS:
        raise ConfigError(f"unknown SFT preset {preset!r}; valid presets: {', '.join(SFT_PRESETS)}")
    prepare, values = SFT_PRESETS[preset]
    paths = prepare()
    values = {
        "trainer.device": "cpu",
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 1,
        "trainer.logger": ["console"],
        "trainer.project_name": "jrl",
        "trainer.experiment_name": f"sft_{preset}",
        "model.fsdp_config.dtype": "float32",
        **values,
        "data.train_files": paths["train_files"],
        "data.val_files": paths["val_files"],
        "model.partial_pretrain": paths["model_path"],
    }
    return apply_overrides(config, list(values.items()))
