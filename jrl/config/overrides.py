"""Command-line overrides: `--config=FILE.py[:preset]`, `--config.a.b=v` (absl) and `a.b=v` (verl).

As in Hydra, `+a.b=v` adds a key that does not exist yet (e.g. under `model.override_config`),
`++a.b=v` sets it or adds it, and a dict value set on a section sets each of its keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ml_collections import ConfigDict

from jrl.config.errors import ConfigError
from jrl.config.interpolation import is_template, reference
from jrl.config.tree import assign, section_at, unknown_key
from jrl.config.values import parse_value

Override = tuple[str, Any]
_USAGE = "expected --config=FILE.py[:preset], --config.KEY=VALUE or KEY=VALUE"


def parse_command_line(argv: Sequence[str]) -> tuple[str | None, list[Override]]:
    """Split `argv` (without the program name) into the config file spec and the overrides."""
    spec, overrides = None, []
    args = iter(argv)
    for arg in args:
        if arg == "--config" or arg.startswith(("--config=", "--config.")):
            name, equals, text = arg.partition("=")
            if not equals:
                text = next(args, None)
                if text is None:
                    raise ConfigError(f"{arg} needs a value: {_USAGE}")
            if name == "--config":
                spec = text
                continue
            key = name.removeprefix("--config.")
        else:
            key, equals, text = arg.partition("=")
            if not equals or arg.startswith("-"):
                raise ConfigError(f"cannot read argument {arg!r}: {_USAGE}")
        if not all(key.lstrip("+").split(".")) or key.startswith("+++"):
            raise ConfigError(f"malformed key in {arg!r}: {_USAGE}")
        try:
            overrides.append((key, parse_value(text)))
        except ConfigError as error:
            raise ConfigError(f"{key}: {error}") from None
    return spec, overrides


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def _as_tuple(field_type: type | tuple[type, ...]) -> tuple[type, ...]:
    return field_type if isinstance(field_type, tuple) else (field_type,)


def coerce(path: str, value: Any, field_type: type | tuple[type, ...]) -> Any:
    """`value` made fit for a key of `field_type` (int -> float, scalar -> str) or ConfigError."""
    types = _as_tuple(field_type)
    if value is None or types == (type(None),):
        return value
    fits = (bool in types) if isinstance(value, bool) else isinstance(value, types)
    if fits:
        return value
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if str in types and isinstance(value, (int, float, bool)):
        return str(value)
    if list in types and isinstance(value, tuple):
        return list(value)
    raise ConfigError(f"{path} expects {_type_names(types)}, got {value!r}")


def _follow(config: ConfigDict, path: str, template: str, field_type: type | tuple) -> Any:
    """A reference computing `template`, converted to the key's type where that is lossless."""
    ref = reference(config, template, path.rpartition(".")[0])
    wanted, given = _as_tuple(field_type), _as_tuple(ref.get_type())
    if wanted == (type(None),) or set(given) <= set(wanted):
        return ref
    if str in wanted:
        return ref.to_str()
    if float in wanted and given == (int,):
        return ref.to_float()
    raise ConfigError(f"{path} expects {_type_names(wanted)}; {template} is {_type_names(given)}")


def _set(config: ConfigDict, path: str, value: Any, plus: int) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = section_at(config, parent_path, create=plus > 0)
    if name not in parent:
        if not plus:
            raise unknown_key(config, path, f"; to add a new key, write +{path}=...")
        if is_template(value):
            value = reference(config, value, parent_path)
        with parent.unlocked():
            parent[name] = value
        return
    if plus == 1:
        raise ConfigError(f"cannot add '{path}': it exists already; write {path}=... to change it")
    if isinstance(parent[name], ConfigDict):
        if not isinstance(value, dict):
            raise ConfigError(
                f"'{path}' is a section, not a value: set its keys ({path}.KEY=...) "
                f"or give a dict ({path}={{KEY: VALUE}})"
            )
        for key, item in value.items():
            _set(config, f"{path}.{key}", item, plus)
        return
    field_type = parent.get_type(name)
    if is_template(value):
        value = _follow(config, path, value, field_type)
    else:
        value = coerce(path, value, field_type)
    assign(config, path, value)


def apply_overrides(config: ConfigDict, overrides: Sequence[Override]) -> ConfigDict:
    """Set each (key, value) of `overrides` in order, type-checked; returns `config` (changed)."""
    for key, value in overrides:
        path = key.lstrip("+")
        _set(config, path, value, plus=len(key) - len(path))
    return config
