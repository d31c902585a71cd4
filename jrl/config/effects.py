"""What every key does here: the one registry behind the start-up notice of keys that have no
effect in this run and ``python -m jrl.train --explain``.

A key acts in the module its section names (`HOMES`, longest prefix wins) unless `NO_EFFECT`
lists it: keys of torch, Ray or an engine that this run does not use. The notice names only keys
the user set to a value other than the default; untouched defaults say nothing.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ml_collections import ConfigDict

from jrl.config.defaults import default_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_config, load_config_file
from jrl.config.overrides import parse_command_line
from jrl.config.tree import assign, key_paths

_ROLLOUT = "actor_rollout_ref.rollout"
# Keys only vLLM reads (`jrl.rollout.vllm_args`): no effect when jrl's JAX sampler generates.
VLLM_ONLY = (
    "enforce_eager",
    "load_format",
    "layered_summon",
    "cudagraph_capture_sizes",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "disable_log_stats",
    "logprobs_mode",
    "scheduling_policy",
    "skip_tokenizer_init",
    "engine_kwargs.vllm.*",
)


def _always(engine: str) -> bool:
    return True


def _jax_sampler(engine: str) -> bool:
    return engine == "jax"


@dataclasses.dataclass(frozen=True)
class NoEffect:
    """Keys matching `pattern` (dotted, ``*`` matches any part) have no effect, for `reason`,
    when the rollout `engine` that generates (jax or vllm, `jrl.rollout.serving_engine`) is one
    that `applies`."""

    pattern: str
    reason: str
    applies: Callable[[str], bool] = _always

    def matches(self, key: str, engine: str) -> bool:
        return fnmatch.fnmatchcase(key, self.pattern) and self.applies(engine)


_TORCH_BACKEND = "a torch training backend: jrl trains with JAX on its own mesh"
_TORCH_COMPILE = "torch.compile: XLA compiles every jrl program"
_WRAP = "torch FSDP wrapping: jrl shards every parameter by its logical axes"
NO_EFFECT = (
    NoEffect("data.tokenizer", "verl reads the tokenizer from actor_rollout_ref.model.path"),
    NoEffect("actor_rollout_ref.hybrid_engine", "jrl always colocates the roles (hybrid engine)"),
    NoEffect("*.strategy", _TORCH_BACKEND),
    NoEffect("*.use_torch_compile", _TORCH_COMPILE),
    NoEffect("*.fsdp_config.wrap_policy.*", _WRAP),
    NoEffect("*.moe_config.freeze_moe_router", "jrl has no mixture-of-experts model family"),
    NoEffect(f"{_ROLLOUT}.engine_kwargs.sglang.*", "the sglang engine's options"),
    NoEffect(f"{_ROLLOUT}.agent.custom_async_server.*", "jrl's agent loop runs in process"),
    NoEffect("ray_kwargs.*", "Ray's options: jrl runs without Ray"),
    NoEffect("*.optim.clip_grad", "Megatron's clipping: verl's FSDP roles clip at grad_clip"),
    *(
        NoEffect(f"{_ROLLOUT}.{key}", "vLLM's option: jrl's JAX sampler generates", _jax_sampler)
        for key in VLLM_ONLY
    ),
)

HOMES = {
    "data": "jrl.data (datasets, prompts, batching)",
    "actor_rollout_ref.model": "jrl.trainer.roles.specs.ModelSpec (model loading, LoRA, remat)",
    "actor_rollout_ref.actor": "jrl.trainer.roles.actor (policy update)",
    "actor_rollout_ref.actor.optim": "jrl.trainer.update.optim (optimizer, schedule)",
    "actor_rollout_ref.actor.policy_loss": "jrl.algos.policy_loss",
    "actor_rollout_ref.actor.fsdp_config": "jrl.parallel (mesh, offload)",
    "actor_rollout_ref.ref": "jrl.trainer.roles.reference",
    "actor_rollout_ref.rollout": "jrl.rollout (engine, sampling, limits)",
    "critic": "jrl.trainer.roles.critic",
    "critic.optim": "jrl.trainer.update.optim (optimizer, schedule)",
    "reward_model": "jrl.trainer.roles.reward_model, jrl.reward (reward managers)",
    "custom_reward_function": "jrl.reward (custom reward function)",
    "algorithm": "jrl.algos (advantages, KL, rollout correction)",
    "trainer": "jrl.trainer.loop (steps, validation, checkpoints, logging)",
}


def home(key: str) -> str:
    """The module where `key` acts (its longest listed section prefix)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = HOMES.get(".".join(parts[:n]))
        if found:
            return found
    return "jrl (top level)"


def no_effect_reason(key: str, engine: str) -> str | None:
    """Why `key` has no effect in a run whose rollout `engine` generates, or None when it
    acts."""
    return next((e.reason for e in NO_EFFECT if e.matches(key, engine)), None)


def leaves(config: ConfigDict) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every key that is not a section."""
    for key in key_paths(config):
        value = config[key]
        if not isinstance(value, ConfigDict):
            yield key, value


def _value_at(config: ConfigDict, key: str) -> Any:
    try:
        return config[key]
    except (KeyError, AttributeError):
        return dataclasses.MISSING


def _set_directly(moved: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The (key, value) pairs of `moved` (in config order) that do not merely follow an earlier
    one by interpolation (``ref.use_torch_compile`` follows ``actor.use_torch_compile``)."""
    kept: list[tuple[str, Any]] = []
    for key, value in moved:
        base = default_config()
        for earlier, earlier_value in kept:
            assign(base, earlier, earlier_value)
        if resolve(base)[key] != value:
            kept.append((key, value))
    return kept


def ignored_settings(config: ConfigDict, engine: str) -> dict[str, list]:
    """{reason: [(key, value), ...]} of the keys set away from their defaults that have no
    effect in the run of `config` whose rollout `engine` generates (keys that only follow
    another listed key are left out)."""
    defaults = resolve(default_config())
    moved = [
        (key, value)
        for key, value in leaves(config)
        if value != _value_at(defaults, key) and no_effect_reason(key, engine)
    ]
    found: dict[str, list] = {}
    for key, value in _set_directly(moved):
        found.setdefault(no_effect_reason(key, engine), []).append((key, value))
    return found


def no_effect_notice(config: ConfigDict, engine: str) -> str | None:
    """The start-up notice (one line per reason) of `ignored_settings`, or None."""
    found = ignored_settings(config, engine)
    if not found:
        return None
    lines = ["jrl: these settings have no effect in this run:"]
    for reason, pairs in found.items():
        keys = ", ".join(f"{k}={v!r}" for k, v in pairs)
        lines.append(f"  {keys} ({reason})")
    return "\n".join(lines)


def explain(argv: Sequence[str], engine: Callable[[ConfigDict], str]) -> str:
    """The resolved config of a command line, one key a line: value, source (default / card /
    override) and where it acts (or why it has no effect) with the rollout engine that
    `engine(config)` says generates."""
    spec, overrides = parse_command_line(argv)
    config = load_config(argv)[0]
    generating = engine(config)
    defaults = resolve(default_config())
    card = resolve(load_config_file(spec)[0]) if spec else defaults
    overridden = [key.lstrip("+") for key, _ in overrides]
    lines = []
    for key, value in leaves(config):
        if any(key == o or key.startswith(f"{o}.") for o in overridden):
            source = "override"
        elif _value_at(card, key) != _value_at(defaults, key):
            source = "card"
        else:
            source = "default"
        reason = no_effect_reason(key, generating)
        where = f"no effect: {reason}" if reason else home(key)
        lines.append(f"{key} = {value!r}  [{source}]  {where}")
    return "\n".join(lines)
