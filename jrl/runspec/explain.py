"""``python -m jrl.train --explain``: what becomes of each key of a command line's config."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ml_collections import ConfigDict

from jrl.config.defaults import default_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_card
from jrl.config.moved import leaves, value_at
from jrl.config.overrides import command_line_keys, parse_command_line
from jrl.runspec.effects import no_effect_reason
from jrl.runspec.loading import load_config
from jrl.runspec.spec import resolve_run
from jrl.runspec.unsupported import unsupported_reason


def explain(argv: Sequence[str], engine: Callable[[ConfigDict], str]) -> str:
    """The resolved config of a command line, one key a line: value, source (default / card /
    override), and what it does with the rollout engine that `engine(config)` says generates:
    the RunSpec field(s) it became (``acts -> rollout``), or why it has no effect."""
    spec = parse_command_line(argv).spec
    config = load_config(argv)[0]
    generating = engine(config)
    keys = resolve_run(config).keys
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
        reason = no_effect_reason(key, config, keys, generating)
        if unsupported:
            where = f"not supported away from its default: {unsupported}"
        else:
            where = f"no effect: {reason}" if reason else f"acts{fields_of(key, keys.fields)}"
        lines.append(f"{key} = {value!r}  [{source}]  {where}")
    return "\n".join(lines)


def fields_of(key: str, fields: Mapping[str, tuple[str, ...]]) -> str:
    """`` -> f1, f2``: the RunSpec fields `key` (or a section holding it, read whole) became."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = fields.get(".".join(parts[:n]))
        if found is not None:
            return f" -> {', '.join(found)}" if found else ""
    return ""
