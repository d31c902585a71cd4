"""Which keys a config sets away from their defaults: the settings that the start-up notice and
the unsupported-key check look at (keys that only follow another one by interpolation are left
out)."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterator
from dataclasses import MISSING
from typing import Any

from ml_collections import ConfigDict

from jrl.config.defaults import default_config, default_templates
from jrl.config.interpolation import evaluate, is_template, names_in, resolve
from jrl.config.tree import key_paths


def key_matches(pattern: str, key: str) -> bool:
    """Whether dotted `key` (or the section it is part of) matches `pattern` (``*`` matches any
    part): the rule of the no-effect and unsupported registries."""
    return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(key, f"{pattern}.*")


@functools.cache
def resolved_defaults() -> ConfigDict:
    """The defaults, resolved, built once (read it, never change it)."""
    return resolve(default_config())


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
    except (KeyError, AttributeError, TypeError):  # TypeError: a part of the path is null
        return MISSING


@functools.cache
def _default_templates() -> dict[str, str]:
    """{key: its default's template} of the keys that follow another one by default."""
    templates = default_templates()
    return {key: value for key, value in leaves(templates) if is_template(value)}


def follows(config: ConfigDict, key: str) -> bool:
    """Whether `key` of the resolved `config` holds what its default interpolation gives there
    (``ref.use_torch_compile`` after ``actor.use_torch_compile`` was set)."""
    template = _default_templates().get(key)
    if template is None:
        return False
    return evaluate(config, template, key.rpartition(".")[0]) == config[key]


@functools.cache
def _followers() -> dict[str, tuple[str, ...]]:
    """{key: the keys whose default template interpolates it}."""
    found: dict[str, list[str]] = {}
    for key, template in _default_templates().items():
        for name in names_in(template, key.rpartition(".")[0]):
            found.setdefault(name, []).append(key)
    return {key: tuple(keys) for key, keys in found.items()}


def followers(config: ConfigDict, key: str) -> Iterator[str]:
    """The keys of the resolved `config` that hold what their default interpolation makes of
    `key` (`follows`), and their followers in turn: where `key`'s value went."""
    for follower in _followers().get(key, ()):
        if follows(config, follower):
            yield follower
            yield from followers(config, follower)


def moved_settings(config: ConfigDict, wanted: Callable[[str], bool]) -> list[tuple[str, Any]]:
    """(key, value) of the `wanted` keys that `config` (resolved) sets away from their defaults
    itself, in config order: a key that only follows another setting by interpolation is left
    out."""
    defaults = resolved_defaults()
    return [
        (key, value)
        for key, value in leaves(config)
        if wanted(key) and value != value_at(defaults, key) and not follows(config, key)
    ]
