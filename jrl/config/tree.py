"""Walking a ConfigDict by dotted paths, with helpful errors for paths that do not exist."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from ml_collections import ConfigDict, FieldReference
from ml_collections.config_dict import MutabilityError, placeholder

from jrl.config.errors import ConfigError
from jrl.config.respelled import current_feature

# The PPO tree's role sections, as interpolations and checks name them.
ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
MODEL = "actor_rollout_ref.model"


def section(**fields: Any) -> ConfigDict:
    """A section whose keys keep the order written here."""
    return ConfigDict(fields, sort_keys=False)


def raw_field(section: ConfigDict, key: str) -> Any:
    """The stored entry of `key` (a FieldReference stays a reference, unlike `section[key]`)."""
    return dict(section.items(preserve_field_references=True))[key]


def key_paths(config: ConfigDict, prefix: str = "") -> Iterator[str]:
    """Every dotted key path in `config`, sections included, depth first."""
    for key in config.keys():
        path = f"{prefix}{key}"
        yield path
        value = config[key]
        if isinstance(value, ConfigDict):
            yield from key_paths(value, f"{path}.")


def _suggestions(config: ConfigDict, path: str) -> list[str]:
    """Close siblings of `path`, else keys of the same name elsewhere."""
    parent, _, name = path.rpartition(".")
    paths = list(key_paths(config))
    siblings = {p.rpartition(".")[2]: p for p in paths if p.rpartition(".")[0] == parent}
    close = [siblings[s] for s in difflib.get_close_matches(name, siblings, n=3, cutoff=0.75)]
    same_name = [p for p in paths if p.rpartition(".")[2] == name]
    return close or same_name[:3]


def unknown_key(config: ConfigDict, path: str, hint: str = "") -> ConfigError:
    """A ConfigError for a missing `path` naming the current-verl feature it configures, else the
    closest existing keys, else adding `hint`."""
    feature = current_feature(path)
    if feature is not None:
        return ConfigError(
            f"unknown key '{path}': it configures current verl's {feature}, which jrl does "
            "not implement; remove it"
        )
    close = _suggestions(config, path)
    if close:
        return ConfigError(f"unknown key '{path}'; did you mean {', '.join(close)}?")
    return ConfigError(f"unknown key '{path}'{hint}")


def section_at(config: ConfigDict, path: str, create: bool = False) -> ConfigDict:
    """The section at dotted `path` ('' is the root); `create` adds missing sections and makes
    null dict keys sections."""
    node = config
    walked = []
    for name in path.split(".") if path else []:
        walked.append(name)
        if name not in node:
            if not create:
                raise unknown_key(config, ".".join(walked))
            with node.unlocked():
                node[name] = ConfigDict(sort_keys=False)
        elif create and node[name] is None and node.get_type(name) in (dict, ConfigDict):
            with node.ignore_type():  # a null dict (Hydra's `+a.b=v` under a null `a`)
                node[name] = ConfigDict(sort_keys=False)
        node = node[name]
        if not isinstance(node, ConfigDict):
            raise ConfigError(f"'{'.'.join(walked)}' is a value, not a section; it has no keys")
    return node


def lookup(config: ConfigDict, path: str) -> tuple[ConfigDict, str]:
    """The section holding the key at dotted `path` and the key's name in it."""
    parent_path, _, name = path.rpartition(".")
    parent = section_at(config, parent_path)
    if name not in parent:
        raise unknown_key(config, path)
    return parent, name


def assign(config: ConfigDict, path: str, value: Any) -> None:
    """Store an already type-checked `value` (or reference) under the existing key `path`.

    A key holding a reference gets the new value in place, so keys that follow it follow the new
    value; a key that followed another key stops following it. A null keeps the key's type.
    """
    parent, key = lookup(config, path)
    field = raw_field(parent, key)
    if value is None and field is not None and not isinstance(field, (FieldReference, ConfigDict)):
        value = placeholder(type(field))
    try:
        with parent.ignore_type():
            parent[key] = value
    except MutabilityError:
        raise ConfigError(f"'{path}' would end up following itself (interpolation cycle)") from None
