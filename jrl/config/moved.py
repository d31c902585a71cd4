"""Which keys a config sets away from their defaults: the settings that the start-up notice and
the unsupported-key check look at (keys that only follow another one by interpolation are left
out)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING
from typing import Any

from ml_collections import ConfigDict

from jrl.config.defaults import default_config
from jrl.config.interpolation import resolve
from jrl.config.tree import assign, key_paths


def leaves(config: ConfigDict) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every key that is not a section."""
    for key in key_paths(config):
        value = config[key]
        if not isinstance(value, ConfigDict):
            yield key, value


def value_at(config: ConfigDict, key: str) -> Any:
    """config[key], or `MISSING` where the key does not exist."""
    try:
        return config[key]
    except (KeyError, AttributeError):
        return MISSING


def moved_settings(config: ConfigDict, wanted: Callable[[str], bool]) -> list[tuple[str, Any]]:
    """(key, value) of the `wanted` keys that `config` (resolved) sets away from their defaults
    itself, in config order: a key that only follows another setting by interpolation
    (``ref.use_torch_compile`` after ``actor.use_torch_compile``) is left out."""
    defaults = resolve(default_config())
    moved = [(key, value) for key, value in leaves(config) if value != value_at(defaults, key)]
    chosen = [(key, value) for key, value in moved if wanted(key)]
    if not chosen:
        return []
    base = default_config()
    known = [(key, value) for key, value in moved if value_at(defaults, key) is not MISSING]
    for key, value in known:
        if not wanted(key):
            assign(base, key, value)
    kept: list[tuple[str, Any]] = []
    for key, value in chosen:
        if value_at(resolve(base), key) != value:
            kept.append((key, value))
            if value_at(defaults, key) is not MISSING:
                assign(base, key, value)
    return kept


def restore_defaults(config: ConfigDict, section: str) -> ConfigDict:
    """`config` with every key under `section` that it sets itself back at its default (for a
    card derived from another whose role it does not run, e.g. a GRPO card from a PPO card)."""
    defaults = resolve(default_config())
    inside = f"{section}."
    for key, _ in moved_settings(resolve(config), lambda key: key.startswith(inside)):
        assign(config, key, value_at(defaults, key))
    return config
