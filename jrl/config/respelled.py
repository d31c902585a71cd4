"""Current verl's spellings of verl v0.6.0's keys, and its config-group choices.

Current verl moved the reward's keys under one ``reward`` section and reads v0.6.0's keys as
legacy spellings of them (its `migrate_legacy_reward_impl`); its critic's FSDP keys moved from
``critic.model.fsdp_config`` to ``critic.fsdp``; its Megatron engine has a compute dtype
(``megatron.dtype``), which jrl reads as ``fsdp_config.dtype`` for every engine. jrl keeps
v0.6.0's keys: an override written in current verl's spelling sets the key it stands for
(`RESPELLED`, longest prefix first), said in one line. The value keeps v0.6.0's meaning.

``model_engine=NAME`` is a Hydra config-group choice in current verl: the engine whose actor,
reference and critic sections the config holds (`MODEL_ENGINES`). jrl's tree holds the FSDP
keys and Megatron's ``megatron`` sections at once, so ``dp`` and ``megatron`` change nothing;
the engines jrl has no keys for are refused.

A key of a current-verl feature that v0.6.0 lacks and jrl does not implement is unknown here;
its error names the feature (`CURRENT_FEATURES`) instead of offering ``+`` to add the key.
"""

from __future__ import annotations

import fnmatch

from jrl.config.errors import ConfigError

# (current verl's key or section, the v0.6.0 key or section it stands for).
RESPELLED = (
    ("reward.num_workers", "reward_model.num_workers"),
    ("reward.reward_kwargs", "reward_model.reward_kwargs"),
    ("reward.custom_reward_function", "custom_reward_function"),
    ("reward.reward_manager.name", "reward_model.reward_manager"),
    ("reward.reward_manager.source", "reward_model.reward_loop_source"),
    ("reward.reward_manager.module.path", "reward_model.reward_loop_module_path"),
    ("reward.reward_manager.module.name", "reward_model.reward_loop_class_name"),
    ("reward.reward_model.model_path", "reward_model.model.path"),
    ("reward.reward_model", "reward_model"),
    ("reward.sandbox_fusion", "reward_model.sandbox_fusion"),
    ("critic.fsdp", "critic.model.fsdp_config"),  # the critic's engine section (dp_critic.yaml)
    # The Megatron engine's compute dtype: the key jrl reads for every engine.
    ("actor_rollout_ref.actor.megatron.dtype", "actor_rollout_ref.actor.fsdp_config.dtype"),
    ("actor_rollout_ref.ref.megatron.dtype", "actor_rollout_ref.ref.fsdp_config.dtype"),
    ("critic.megatron.dtype", "critic.model.fsdp_config.dtype"),
)
# Current verl's `model_engine` choices: None where jrl reads that engine's keys.
MODEL_ENGINES = {
    "dp": None,
    "megatron": None,
    "veomni": "the VeOmni engine (its actor_rollout_ref.actor.veomni.* keys)",
    "torchtitan": "the TorchTitan engine (its actor_rollout_ref.actor.torchtitan.* keys)",
}

_ENGINE_SFT = (
    "engine-based SFT trainer (verl.trainer.sft_trainer; jrl.sft takes fsdp_sft_trainer's keys)"
)
# (current verl's key pattern, ``*`` for any run of parts; the feature it configures).
CURRENT_FEATURES = (
    ("distillation", "on-policy distillation"),
    ("transfer_queue", "TransferQueue data system"),
    ("skip", "rollout skipping from dumps"),
    ("trainer.v1", "V1 trainer"),
    ("trainer.use_v1", "V1 trainer"),
    ("actor_rollout_ref.model.mtp", "multi-token prediction"),
    ("critic.model.mtp", "multi-token prediction"),
    ("actor_rollout_ref.actor.qat", "quantization-aware training"),
    ("*.fsdp_config.qat", "quantization-aware training"),
    ("*.fsdp_config.turbo_config", "FSDP turbo plans"),
    ("actor_rollout_ref.*.veomni", "VeOmni engine"),
    ("critic.veomni", "VeOmni engine"),
    ("actor_rollout_ref.*.torchtitan", "TorchTitan engine"),
    ("critic.torchtitan", "TorchTitan engine"),
    ("*.rollout.disaggregation", "prefill/decode disaggregation"),
    ("*.precision_debugger", "precision debugger"),
    ("*profiler", "profilers (nsys, torch, npu)"),
    # The engine-based SFT trainer's own keys (its engine group, its data section's).
    *((key, _ENGINE_SFT) for key in ("engine", "data.pad_mode", "data.messages_key")),
    ("data.max_token_len_per_gpu", _ENGINE_SFT),
    # Megatron's LoRA keys and lora.merge; v0.6.0's (model.lora_rank, lora_alpha, ...) are read.
    ("actor_rollout_ref.model.lora", "model.lora section (Megatron's LoRA, lora.merge)"),
)


def current_feature(path: str) -> str | None:
    """The current-verl feature that dotted `path` configures (`CURRENT_FEATURES`), or None."""
    for pattern, feature in CURRENT_FEATURES:
        if fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, f"{pattern}.*"):
            return feature
    return None


def _matches(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(f"{prefix}.")


_LONGEST_FIRST = sorted(RESPELLED, key=lambda pair: -len(pair[0]))


def respelled(path: str) -> str:
    """The v0.6.0 key that dotted `path` spells in current verl's form (else `path`); a key
    under ``reward`` that has no v0.6.0 counterpart is a ConfigError."""
    for current, legacy in _LONGEST_FIRST:
        if _matches(path, current):
            return legacy + path[len(current) :]
    if _matches(path, "reward"):
        known = ", ".join(current for current, _ in RESPELLED if _matches(current, "reward"))
        raise ConfigError(
            f"'{path}': current verl's reward section is read here through verl v0.6.0's keys, "
            f"and this key has none; the keys read are {known}"
        )
    return path


def check_model_engine(value: object) -> None:
    """ConfigError unless ``model_engine=value`` names an engine whose keys jrl reads."""
    if value not in MODEL_ENGINES:
        raise ConfigError(
            f"model_engine={value!r} is not one of current verl's engines "
            f"({', '.join(MODEL_ENGINES)})"
        )
    missing = MODEL_ENGINES[value]
    if missing is not None:
        raise ConfigError(
            f"model_engine={value}: {missing} is not implemented; jrl's JAX engine reads the "
            "FSDP keys (model_engine=dp) and Megatron's (model_engine=megatron)"
        )
