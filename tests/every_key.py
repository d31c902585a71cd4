"""The check behind `test_every_key_*.py`: no key vanishes silently. Every key of the
configuration document and of verl v0.6.0's generated PPO config, set to a non-default valid value
one at a time on the tiny GRPO and PPO cards (with the context it needs, `CONTEXTS`), is refused
at load (a feature jrl does not implement), named in the no-effect notice with a reason of its
own, or read by the resolver (`RunSpec.keys`, itself or through a key that follows it).

The product records its reads, so no run is needed: loading and resolving each variant takes
seconds. That a key the resolver reads changes what the run does is the behaviour sweep's part
(`key_behaviour`, ``JRL_KEY_SWEEP=1``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ml_collections import ConfigDict, FieldReference

from jrl.config import ConfigError, apply_overrides, default_config, load_config_file, resolve
from jrl.config.moved import leaves, value_at
from jrl.config.replaced import replaced_pairs
from jrl.config.tree import key_paths
from jrl.runspec.effects import NOT_READ, ignored_settings, no_effect_reason
from jrl.runspec.spec import resolve_run
from jrl.runspec.unsupported import unsupported_reason
from jrl.runspec.validate import validate

CARDS = {"grpo": "configs/gsm8k_grpo.py:tiny", "ppo": "configs/gsm8k_ppo.py:tiny"}
VERL_KEYS = Path(__file__).with_name("data") / "verl_v0.6.0_ppo_keys.txt"
# Deprecated global sizes act only with their per-device spelling unset (verl's rule too).
COMPANIONS = {
    deprecated: per_gpu.rpartition(".")[2]
    for deprecated, per_gpu in replaced_pairs(default_config())
}
ACTOR, ROLLOUT = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
_SMALL_MICRO = {
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": 1,
    "critic.ppo_micro_batch_size_per_gpu": 1,
}
_TWO_DEVICES = {"trainer.n_gpus_per_node": 2, **_SMALL_MICRO}
_FSDP_SECTIONS = (
    f"{ACTOR}.fsdp_config",
    "actor_rollout_ref.ref.fsdp_config",
    "critic.model.fsdp_config",
)
# Two mini-batches per step, so that their order (shuffle) matters.
_TWO_MINI = {f"{ACTOR}.ppo_mini_batch_size": 2, "critic.ppo_mini_batch_size": 2, **_SMALL_MICRO}
_FRESH = {"trainer.resume_mode": "disable"}  # keys that change what a checkpoint holds
_LEGACY_IS = {f"{ROLLOUT}.calculate_log_probs": True, "algorithm.rollout_is_threshold": 2.0}
_ACTOR_IS = {f"{ROLLOUT}.calculate_log_probs": True, f"{ACTOR}.rollout_is_threshold": 2.0}
_CORRECTION = {
    f"{ROLLOUT}.calculate_log_probs": True,
    "algorithm.rollout_correction.rollout_is": "token",
    "algorithm.rollout_correction.rollout_rs": "token_k2",
    "algorithm.rollout_correction.rollout_rs_threshold": 2.0,
}
# DAPO's dynamic sampling: the group filter names its metric (seq_reward: the tiny cards' naive
# manager gives no extra-info column), and a generation batch of its own needs the filter.
_FILTER = {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "seq_reward"}
# A split run: one trainer device and one rollout device.
_SPLIT = {"actor_rollout_ref.hybrid_engine": False, "rollout.n_gpus_per_node": 1}
# Fully-async training on it: its log-probs, and one update's prompts per step.
_FULLY_ASYNC = {
    **_SPLIT,
    "async_training.mode": "fully_async",
    f"{ROLLOUT}.calculate_log_probs": True,
    "data.train_batch_size": 4,
    f"{ACTOR}.ppo_mini_batch_size": 4,
}
# What a key needs to take a non-default value; the context's own keys do not count as the
# key's effect.
CONTEXTS = {
    "actor_rollout_ref.hybrid_engine": {"rollout.n_gpus_per_node": 1},
    "rollout.n_gpus_per_node": {"actor_rollout_ref.hybrid_engine": False, **_TWO_DEVICES},
    "rollout.nnodes": {**_SPLIT, "trainer.nnodes": 2, **_SMALL_MICRO},
    f"{ROLLOUT}.update_weights_bucket_megabytes": _SPLIT,
    "async_training.mode": {k: v for k, v in _FULLY_ASYNC.items() if k != "async_training.mode"},
    **{
        f"async_training.{key}": _FULLY_ASYNC
        for key in ("staleness_threshold", "trigger_parameter_sync_step", "partial_rollout")
    },
    "async_training.require_batches": {**_FULLY_ASYNC, "data.train_batch_size": 8},
    "algorithm.filter_groups.enable": {"algorithm.filter_groups.metric": "seq_reward"},
    "algorithm.filter_groups.metric": {"algorithm.filter_groups.enable": True},
    "algorithm.filter_groups.max_num_gen_batches": _FILTER,
    "algorithm.filter_groups.max_inflight_gen_batches": _FILTER,
    "data.gen_batch_size": _FILTER,
    f"{ACTOR}.ppo_mini_batch_size": _SMALL_MICRO,
    "critic.ppo_mini_batch_size": _SMALL_MICRO,
    "critic.enable": _SMALL_MICRO,
    "trainer.n_gpus_per_node": _SMALL_MICRO,
    "trainer.nnodes": _SMALL_MICRO,
    f"{ACTOR}.ulysses_sequence_parallel_size": _TWO_DEVICES,
    "critic.ulysses_sequence_parallel_size": _TWO_DEVICES,
    f"{ACTOR}.fsdp_config.tensor_parallel_size": _TWO_DEVICES,
    "critic.model.fsdp_config.tensor_parallel_size": _TWO_DEVICES,
    "actor_rollout_ref.model.enable_activation_offload": {
        "actor_rollout_ref.model.enable_gradient_checkpointing": True
    },
    f"{ROLLOUT}.calculate_log_probs": {},
    f"{ACTOR}.shuffle": _TWO_MINI,
    "critic.shuffle": _TWO_MINI,
    f"{ACTOR}.data_loader_seed": {f"{ACTOR}.shuffle": True, **_TWO_MINI},
    "critic.data_loader_seed": {"critic.shuffle": True, **_TWO_MINI},
    **{f"{section}.fsdp_size": _TWO_DEVICES for section in _FSDP_SECTIONS},
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": _TWO_DEVICES,
    "actor_rollout_ref.ref.fsdp_config.tensor_parallel_size": _TWO_DEVICES,
    f"{ROLLOUT}.tensor_model_parallel_size": _TWO_DEVICES,
    f"{ROLLOUT}.expert_parallel_size": {
        **_TWO_DEVICES,
        f"{ROLLOUT}.name": "jax",
        f"{ROLLOUT}.tensor_model_parallel_size": 2,
    },
    **{
        f"{role}.megatron.tensor_model_parallel_size": _TWO_DEVICES
        for role in (ACTOR, "actor_rollout_ref.ref", "critic")
    },
    "actor_rollout_ref.model.lora_rank": _FRESH,
    "critic.model.path": _FRESH,  # a resumed critic takes the checkpoint's weights
    "critic.model.lora_rank": _FRESH,
    # Prompts of the tiny data are 46-51 tokens long: at 48, filtering drops some; at 40 every
    # prompt is cut (the tiny preset cuts on the left).
    "data.filter_overlong_prompts": {"data.max_prompt_length": 48},
    "data.truncation": {"data.max_prompt_length": 40},
    # A token budget of one tiny row (128 + 16 tokens): dynamic batches of one row each.
    **{
        f"{role}.log_prob_use_dynamic_bsz": {f"{role}.log_prob_max_token_len_per_gpu": 144}
        for role in (ROLLOUT, "actor_rollout_ref.ref")
    },
    # One step per epoch: the run ends after total_epochs of them.
    "trainer.total_epochs": {**_FRESH, "data.train_max_samples": 4},
    "trainer.test_freq": _FRESH,  # validation at the first step too
    **{f"algorithm.{k}": _LEGACY_IS for k in ("rollout_is", "rollout_is_level", "rollout_is_mode")},
    **{f"algorithm.rollout_is_{k}": _LEGACY_IS for k in ("threshold_lower", "veto_threshold")},
    "algorithm.rollout_is_threshold": {f"{ROLLOUT}.calculate_log_probs": True},
    **{f"{ACTOR}.{k}": _ACTOR_IS for k in ("rollout_is", "rollout_is_level", "rollout_is_mode")},
    **{f"{ACTOR}.rollout_is_{k}": _ACTOR_IS for k in ("threshold_lower", "veto_threshold")},
    f"{ACTOR}.rollout_is_threshold": {f"{ROLLOUT}.calculate_log_probs": True},
    **{
        f"algorithm.rollout_correction.{k}": _CORRECTION
        for k in ("rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs_threshold")
    },
    # Settings that name a file need their partner (checked at load; the file is not opened).
    "data.custom_cls.name": {"data.custom_cls.path": "dataset.py"},
    "data.custom_cls.path": {"data.custom_cls.name": "MyDataset"},
    "reward_manager.source": {"reward_manager.module.path": "manager.py"},
    "algorithm.rollout_correction.rollout_is": {f"{ROLLOUT}.calculate_log_probs": True},
    "algorithm.rollout_correction.bypass_mode": {f"{ROLLOUT}.calculate_log_probs": True},
    "algorithm.rollout_correction.rollout_rs": {
        f"{ROLLOUT}.calculate_log_probs": True,
        "algorithm.rollout_correction.rollout_rs_threshold": 2.0,
    },
}
# Valid values where the key's type does not suggest one.
VALUES = {
    "rollout.n_gpus_per_node": 2,
    "rollout.nnodes": 2,
    "async_training.mode": "fully_async",
    "async_training.require_batches": 2,
    "algorithm.filter_groups.metric": "seq_reward",
    "data.gen_batch_size": 8,  # twice the tiny cards' train_batch_size
    "algorithm.rollout_correction.rollout_rs": "token_k2",
    f"{ACTOR}.optim.betas": [0.8, 0.99],
    "critic.optim.betas": [0.8, 0.99],
    # Values that differ from the default in meaning, not only in spelling ("fp32", a repeated
    # item) or in a range that the tiny run never reaches.
    **{
        f"{section}.{key}": "bf16" for section in _FSDP_SECTIONS for key in ("dtype", "model_dtype")
    },
    f"{ROLLOUT}.dtype": "bf16",
    **{
        f"{role}.checkpoint.{key}": ["model", "extra"]
        for role in (ACTOR, "critic")
        for key in ("save_contents", "load_contents")
    },
    **{f"{role}.optim.lr_warmup_steps": 5 for role in (ACTOR, "critic")},
    # Values whose effect the tiny run reaches: a warm-up longer than one step, a cosine
    # schedule, weights below the lower bound, a veto of any token the trainer finds less likely.
    **{f"{role}.optim.lr_warmup_steps_ratio": 1.0 for role in (ACTOR, "critic")},
    **{f"{role}.optim.warmup_style": "cosine" for role in (ACTOR, "critic")},
    **{f"{side}.rollout_is_threshold_lower": 1.5 for side in ("algorithm", ACTOR)},
    **{f"{side}.rollout_is_veto_threshold": 1.0 for side in ("algorithm", ACTOR)},
    **{f"{section}.fsdp_size": 1 for section in _FSDP_SECTIONS},
    f"{ACTOR}.data_loader_seed": 7,
    "critic.data_loader_seed": 7,
    f"{ROLLOUT}.top_k": 5,  # 0 disables top-k, as -1 does
    f"{ROLLOUT}.expert_parallel_size": 2,  # the context's tensor-parallel size
    f"{ACTOR}.megatron.router_replay.mode": "R2",  # current verl's spelling of the actor's mode
    f"{ROLLOUT}.logprobs_mode": "raw_logprobs",
    f"{ROLLOUT}.max_num_seqs": 2,
    f"{ROLLOUT}.max_num_batched_tokens": 64,
    "data.truncation": "right",
    "data.train_max_samples": 8,
    "trainer.total_epochs": 2,
    "trainer.test_freq": 1,
    "trainer.critic_warmup": 3,  # no actor update at the probe's step 2
    "trainer.logger": ["console", "tensorboard"],
    "trainer.max_actor_ckpt_to_keep": 1,  # 0, like null, keeps every checkpoint (verl's rule)
    "trainer.max_critic_ckpt_to_keep": 1,
}
_ONE_OF = re.compile(r"one of ([\w.+\-]+(?:, [\w.+\-]+)*)")


def _declared_type(key: str) -> type | tuple[type, ...] | None:
    """The type a key was declared with (for keys whose default is null)."""
    parent, _, leaf = key.rpartition(".")
    config = default_config()
    field = dict((config[parent] if parent else config).items(preserve_field_references=True))
    entry = field[leaf]
    return entry.get_type() if isinstance(entry, FieldReference) else type(entry)


def _candidates(key: str, value: Any) -> Iterator[Any]:
    """Non-default values to try for `key`, most natural first."""
    kind = type(value) if value is not None else _declared_type(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if bool in kinds:
        yield not value
    elif int in kinds:
        yield from (v for v in ((value or 0) * 2, (value or 0) + 1, 1, 2, 8) if v != value)
    elif float in kinds:
        yield from (v for v in ((value or 0.0) * 0.5, (value or 0.0) + 0.1, 0.5) if v != value)
    elif str in kinds:
        yield f"{value}x" if value else "x"
    elif list in kinds:
        yield [*(value or []), *(value or ["x"])[:1]]
    elif dict in kinds or ConfigDict in kinds:
        yield {"x": 1}


def _companion(key: str) -> list[str]:
    """The per-device spelling that a deprecated global size needs unset."""
    return [f"{key.rpartition('.')[0]}.{COMPANIONS[key]}"] if key in COMPANIONS else []


def _load(raw: ConfigDict, changes: list[tuple[str, Any]]) -> ConfigDict:
    """The config of the card `raw` with `changes`, as `load_config` makes it."""
    config = resolve(apply_overrides(copy.deepcopy(raw), changes))
    validate(config)
    return config


def _try(raw: ConfigDict, key: str, value: Any) -> tuple[ConfigDict | None, str]:
    """(config, '') with `key` = `value` (and its context and companion), or (None, the load
    error)."""
    changes = [*CONTEXTS.get(key, {}).items(), (key, value), *((k, None) for k in _companion(key))]
    try:
        return _load(raw, changes), ""
    except (ConfigError, ValueError, TypeError, KeyError) as err:
        return None, str(err)


def _moved(raw: ConfigDict, key: str, base: ConfigDict) -> tuple[ConfigDict | None, str]:
    """A config with `key` at a valid non-default value (an enumerated key takes the first
    value its error lists), or (None, the last error)."""
    default, error = value_at(base, key), "no candidate value"
    for value in [VALUES[key]] if key in VALUES else _candidates(key, default):
        config, error = _try(raw, key, value)
        if config is not None:
            return config, ""
        listed = _ONE_OF.search(error) if key in error else None
        for option in listed.group(1).split(", ") if listed else ():
            if option != default:
                config, error = _try(raw, key, option)
                if config is not None:
                    return config, ""
    return None, error


def _refused(key: str, base: ConfigDict, error: str) -> bool:
    """Whether the load error refuses `key` itself: an unsupported feature (the registry's), or a
    message naming the key that says so."""
    named = [line for line in error.splitlines() if key in line]
    says = any("not supported" in line or "reset it" in line for line in named)
    return bool(named) and (unsupported_reason(key, base) is not None or says)


def _verdict(raw: ConfigDict, base: ConfigDict, key: str) -> str:
    """'refused', 'announced', 'read', or why the key is none of them."""
    config, error = _moved(raw, key, base)
    if config is None:
        refused = _refused(key, base, error)
        return "refused" if refused else f"no valid non-default value loads: {error[-400:]}"
    given = {key, *CONTEXTS.get(key, {}), *_companion(key)}  # as on the command line
    keys = resolve_run(config).keys
    reason = no_effect_reason(key, config, keys, "jax", given)
    if reason is None:
        return "read"
    if reason == NOT_READ:
        return "no resolver reads it and no reason says why"
    named = {k for pairs in ignored_settings(config, keys, "jax", given).values() for k, _ in pairs}
    return "announced" if key in named else f"has a reason ({reason}) but the notice omits it"


def verl_keys_missing_here() -> list[str]:
    """verl v0.6.0's generated PPO config keys that the defaults lack (none should)."""
    verl = [line for line in VERL_KEYS.read_text().splitlines() if not line.startswith("#")]
    ours = set(key_paths(resolve(default_config())))
    assert len(verl) == 408
    return [k for k in verl if k not in ours]


def wrong_verdicts(card: str) -> dict[str, str]:
    """{key: why} of the keys of the card that are neither read, announced nor refused; also
    checks that each outcome happens often."""
    raw = load_config_file(CARDS[card])[0]
    base = _load(raw, [])
    verdicts = {key: _verdict(raw, base, key) for key, _ in leaves(base)}
    counts = {v: list(verdicts.values()).count(v) for v in ("refused", "announced", "read")}
    assert min(counts.values()) > 10, counts  # each outcome happens, often
    return {k: v for k, v in verdicts.items() if v not in ("refused", "announced", "read")}
