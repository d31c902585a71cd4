"""What every key does here: the one registry behind the start-up notice of keys that have no
effect in this run and ``python -m jrl.train --explain``.

A key acts in the module its section names (`HOMES`, longest prefix wins) unless `NO_EFFECT`
(`jrl.runspec.no_effect`, its rules in `no_effect_rules`) lists it for this run: keys of torch,
Ray or an engine that this run does not use, and keys of a part of the run that is switched off
(a critic under GRPO, token budgets without dynamic batch sizes). Keys of features jrl does not
implement are config errors instead (`jrl.runspec.unsupported`). The notice names only keys the
user set to a value other than the default; untouched defaults say nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence

from ml_collections import ConfigDict

from jrl.config.defaults import default_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_card
from jrl.config.megatron import MEGATRON_ROLES
from jrl.config.moved import leaves, moved_settings, value_at
from jrl.config.overrides import parse_command_line, split_key
from jrl.runspec.loading import load_config
from jrl.runspec.no_effect import NO_EFFECT
from jrl.runspec.no_effect_rules import NoEffect
from jrl.runspec.spec import resolve_run
from jrl.runspec.unsupported import unsupported_reason

HOMES = {
    "data": "jrl.data (datasets, prompts, batching)",
    "actor_rollout_ref.model": "jrl.runspec.models.ModelSettings (model loading, LoRA, remat)",
    "actor_rollout_ref.actor": "jrl.trainer.roles.actor (policy update)",
    "actor_rollout_ref.actor.optim": "jrl.optim (optimizer, schedule)",
    "actor_rollout_ref.actor.policy_loss": "jrl.algos.policy_loss",
    "actor_rollout_ref.actor.fsdp_config": "jrl.parallel (mesh, offload)",
    **{
        f"{role}.megatron.tensor_model_parallel_size": "jrl.parallel (the role's tensor axis)"
        for role in MEGATRON_ROLES
    },
    "actor_rollout_ref.ref": "jrl.trainer.roles.reference",
    "actor_rollout_ref.rollout": "jrl.rollout (engine, sampling, limits)",
    "critic": "jrl.trainer.roles.critic",
    "critic.optim": "jrl.optim (optimizer, schedule)",
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


def no_effect_reason(
    key: str, config: ConfigDict, engine: str, given: Collection[str] | None = None
) -> str | None:
    """Why `key` has no effect in the run of `config` whose rollout `engine` generates, or None
    when it acts. Entries about switched-off roles (`NoEffect.given_only`) count only for keys
    in `given` (the command line's; None: every key): a card keeps every role's settings, as
    verl's configs do, and says nothing of them."""

    def counts(entry: NoEffect) -> bool:
        if not entry.given_only or given is None:
            return True
        return any(key == g or key.startswith(f"{g}.") for g in given)

    entries = (e for e in NO_EFFECT if e.matches(key, config, engine) and counts(e))
    return next((e.reason for e in entries), None)


def command_line_keys(argv: Sequence[str]) -> frozenset[str]:
    """The keys a command line sets or resets (``+``, ``++`` and ``~`` dropped)."""
    return frozenset(split_key(key)[1] for key, _ in parse_command_line(argv).overrides)


def ignored_settings(
    config: ConfigDict, engine: str, given: Collection[str] = ()
) -> dict[str, list]:
    """{reason: [(key, value), ...]} of the keys set away from their defaults that have no
    effect in the run of `config` whose rollout `engine` generates (keys that only follow
    another setting are left out; switched-off roles' keys only when in `given`)."""
    found: dict[str, list] = {}
    reason = functools.partial(no_effect_reason, config=config, engine=engine, given=given)
    for key, value in moved_settings(config, lambda key: reason(key) is not None):
        found.setdefault(reason(key), []).append((key, value))
    return found


def no_effect_notice(config: ConfigDict, engine: str, given: Collection[str] = ()) -> str | None:
    """The start-up notice (one line per reason) of `ignored_settings`, or None."""
    found = ignored_settings(config, engine, given)
    if not found:
        return None
    lines = ["jrl: these settings have no effect in this run:"]
    for reason, pairs in found.items():
        keys = ", ".join(f"{k}={v!r}" for k, v in pairs)
        lines.append(f"  {keys} ({reason})")
    return "\n".join(lines)


def explain(argv: Sequence[str], engine: Callable[[ConfigDict], str]) -> str:
    """The resolved config of a command line, one key a line: value, source (default / card /
    override), where it acts (or why it has no effect) with the rollout engine that
    `engine(config)` says generates, and the RunSpec field(s) it became (``-> rollout``)."""
    spec = parse_command_line(argv).spec
    config = load_config(argv)[0]
    generating = engine(config)
    fields = resolve_run(config).key_fields
    defaults = resolve(default_config())
    card = resolve(load_card(spec)[0]) if spec else defaults
    overridden = command_line_keys(argv)
    lines = []
    for key, value in leaves(config):
        if any(key == o or key.startswith(f"{o}.") for o in overridden):
            source = "override"
        elif value_at(card, key) != value_at(defaults, key):
            source = "card"
        else:
            source = "default"
        unsupported = unsupported_reason(key, config)
        reason = no_effect_reason(key, config, generating)
        if unsupported:
            where = f"not supported away from its default: {unsupported}"
        else:
            where = f"no effect: {reason}" if reason else home(key)
        became = fields_of(key, fields)
        lines.append(f"{key} = {value!r}  [{source}]  {where}{became}")
    return "\n".join(lines)


def fields_of(key: str, fields: Mapping[str, tuple[str, ...]]) -> str:
    """`` -> f1, f2``: the RunSpec fields `key` (or a section holding it, read whole) became;
    empty when the resolver did not read it."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = fields.get(".".join(parts[:n]))
        if found is not None:
            return f"  -> {', '.join(found)}" if found else ""
    return ""
