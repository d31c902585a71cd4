"""Keys of features jrl does not implement: set away from their defaults, they are a config error
(naming the key, the reason and the default to go back to) before anything is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import MISSING

from ml_collections import ConfigDict

from jrl.config.moved import key_matches, moved_settings, resolved_defaults, value_at
from jrl.runspec.shape import uses_critic


def _always(config: ConfigDict) -> bool:
    return True


def _filters_groups(config: ConfigDict) -> bool:
    return bool(config.algorithm.filter_groups.enable)


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """Keys matching `pattern` (dotted, ``*`` matches any part) cannot leave their defaults, for
    `reason`, in runs where `applies(config)`."""

    pattern: str
    reason: str
    applies: Callable[[ConfigDict], bool] = _always

    def matches(self, key: str) -> bool:
        """Whether `key` (or the section it is a part of) is one of this entry's."""
        return key_matches(self.pattern, key)


_ROLLOUT = "actor_rollout_ref.rollout"
_MULTI_TURN = (
    "a dataset that renders its prompts with tools is not implemented: the agent loop shows the "
    "tools (actor_rollout_ref.rollout.multi_turn.tool_config_path)"
)
_PROFILERS = "verl's profilers (nsys, torch, npu) are not implemented"
_PIPELINE = (
    "pipeline parallelism is not implemented: jrl splits a model over devices by FSDP and tensor "
    "parallelism (megatron.tensor_model_parallel_size or fsdp_config.tensor_parallel_size)"
)
UNSUPPORTED = (
    Unsupported(
        "actor_rollout_ref.model.lora_adapter_path",
        "loading a saved LoRA adapter is not implemented",
    ),
    Unsupported("critic.model.lora_rank", "LoRA on the critic is not implemented", uses_critic),
    Unsupported("actor_rollout_ref.model.hf_config_path", "jrl reads config.json from model.path"),
    Unsupported("actor_rollout_ref.model.mtp.*", "multi-token prediction is not implemented"),
    Unsupported("data.sampler.*", "a custom (curriculum) data sampler is not implemented"),
    Unsupported("data.datagen.*", "generating data during training is not implemented"),
    Unsupported("data.tool_config_path", _MULTI_TURN),
    Unsupported(f"{_ROLLOUT}.skip_rollout", "replaying dumped rollouts is not implemented"),
    Unsupported(f"{_ROLLOUT}.skip_dump_dir", "replaying dumped rollouts is not implemented"),
    Unsupported(
        f"{_ROLLOUT}.prometheus.*", "the rollout server's Prometheus metrics are not implemented"
    ),
    Unsupported(f"{_ROLLOUT}.quantization*", "quantized rollouts are not implemented"),
    Unsupported("actor_rollout_ref.actor.use_prefix_grouper", "prefix grouping is not implemented"),
    Unsupported(
        "actor_rollout_ref.actor.*sum_pi_squared*", "the sum of pi squared is not implemented"
    ),
    Unsupported(
        "*.optim.override_optimizer_config",
        "extra torch or Megatron optimizer arguments: jrl's optimizers are optax's",
    ),
    Unsupported("reward_model.sandbox_fusion.*", "sandbox-fusion code scoring is not implemented"),
    Unsupported(
        "reward_model.rollout.*",
        "a reward model served by an inference engine (a generative one, or current verl's "
        "reward.reward_model.rollout) is not implemented: jrl scores with a discriminative "
        "reward model (reward_model.model.path) in JAX",
    ),
    Unsupported(
        "algorithm.filter_groups.max_inflight_gen_batches",
        "generation batches pending at once are not implemented: a DAPO step draws its batches "
        "one at a time (the fully-async trainer, async_training.mode=fully_async, streams "
        "groups as they end)",
        _filters_groups,
    ),
    Unsupported("algorithm.use_pf_ppo", "PF-PPO's reward-weighted resampling is not implemented"),
    Unsupported("algorithm.pf_ppo.*", "PF-PPO's reward-weighted resampling is not implemented"),
    Unsupported(
        "trainer.esi_redundant_time", "saving before an ESI instance expires is not implemented"
    ),
    Unsupported("global_profiler.*", _PROFILERS),
    Unsupported("*.profiler.*", _PROFILERS),
    Unsupported(
        "actor_rollout_ref.ref.model",
        "a reference model of its own is not implemented: the reference is the actor at step 0",
    ),
    Unsupported("*.megatron.pipeline_model_parallel_size", _PIPELINE),
    Unsupported("*.megatron.virtual_pipeline_model_parallel_size", _PIPELINE),
    Unsupported(
        "*.megatron.context_parallel_size",
        "context parallelism is not implemented; ulysses_sequence_parallel_size splits sequences",
    ),
)


def unsupported_reason(key: str, config: ConfigDict) -> str | None:
    """Why `key` cannot leave its default in the run of `config`, or None when it can."""
    return next((u.reason for u in UNSUPPORTED if u.matches(key) and u.applies(config)), None)


def unsupported_settings(config: ConfigDict) -> Iterator[str]:
    """One error per unsupported key that `config` sets away from its default."""
    defaults = resolved_defaults()
    for key, value in moved_settings(
        config, lambda key: unsupported_reason(key, config) is not None
    ):
        reason, default = unsupported_reason(key, config), value_at(defaults, key)
        fix = "remove it" if default is MISSING else f"reset it to its default ({default!r})"
        yield f"{key}={value!r}: {reason}; {fix}"
