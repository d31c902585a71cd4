"""`${a.b}` interpolations with OmegaConf's meaning, built on ml_collections references.

A key whose value is `${src}` follows `src`: setting `src` changes it, setting the key itself
changes only the key (it stops following). `${.x}` names a key of the same section, `${..x}` one
of the parent section, and so on. Text around names makes a string: `ckpt/${trainer.project_name}`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from ml_collections import ConfigDict, FieldReference

from jrl.config.errors import ConfigError
from jrl.config.tree import assign, key_paths, lookup, raw_field

_NAME = re.compile(r"\$\{([^${}]*)\}")


def is_template(value: Any) -> bool:
    """Whether `value` is a string holding at least one `${...}` interpolation."""
    return isinstance(value, str) and "${" in value


def _absolute(name: str, section: str, template: str) -> str:
    """`name` as an absolute dotted path; relative names start at `section`."""
    if not name or ":" in name:
        raise ConfigError(
            f"cannot interpolate {template!r}: write ${{a.b}} or ${{.b}} (no resolvers)"
        )
    if not name.startswith("."):
        return name
    depth = len(name) - len(name.lstrip("."))
    base = section.split(".") if section else []
    if depth - 1 > len(base):
        raise ConfigError(f"{template!r} goes above the top of the config")
    return ".".join([*base[: len(base) - depth + 1], name[depth:]])


def _pieces(template: str, section: str) -> list[tuple[bool, str]]:
    """`template` as (is_name, text) pieces, names made absolute."""
    pieces = []
    for index, part in enumerate(_NAME.split(template)):
        if index % 2:
            pieces.append((True, _absolute(part.strip(), section, template)))
        elif "${" in part:
            raise ConfigError(f"malformed interpolation {template!r}: every '${{' needs a '}}'")
        elif part:
            pieces.append((False, part))
    return pieces


def names_in(template: str, section: str) -> list[str]:
    """The absolute keys that `template` (at `section`) interpolates."""
    return [text for is_name, text in _pieces(template, section) if is_name]


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _check_cycle(path: str, visiting: tuple[str, ...]) -> None:
    if path in visiting:
        raise ConfigError(f"interpolation cycle: {' -> '.join([*visiting, path])}")


def _source(config: ConfigDict, path: str, visiting: tuple[str, ...]) -> FieldReference:
    """The reference stored at `path`, linking it first if it still holds a template."""
    parent, key = lookup(config, path)
    field = raw_field(parent, key)
    if isinstance(field, ConfigDict):
        raise ConfigError(f"${{{path}}} names a section; an interpolation must name a value")
    if is_template(field):
        _check_cycle(path, visiting)
        assign(config, path, reference(config, field, _parent(path), (*visiting, path)))
    elif field is None:
        raise ConfigError(f"cannot follow '{path}': it is null without a type")
    return parent.get_ref(key)


def reference(
    config: ConfigDict, template: str, section: str, visiting: tuple[str, ...] = ()
) -> FieldReference:
    """A live reference computing `template` from `config`; relative names start at `section`."""
    pieces = _pieces(template, section)
    if len(pieces) == 1 and pieces[0][0]:
        return _alias(_source(config, pieces[0][1], visiting))
    result = None
    for is_name, text in pieces:
        piece = _source(config, text, visiting).to_str() if is_name else text
        result = piece if result is None else result + piece
    return result


def _alias(source: FieldReference) -> FieldReference:
    """A reference that follows `source` (`FieldReference.identity`, which ml_collections cannot
    build for a key of several types: its type check wants one class)."""
    if not isinstance(source.get_type(), tuple):
        return source.identity()
    alias = FieldReference(None, field_type=source.get_type())
    alias.set(source, type_safe=False)
    return alias


def link(config: ConfigDict) -> ConfigDict:
    """Turn every template string stored in `config` into a live reference (in place)."""
    for path in list(key_paths(config)):
        parent, key = lookup(config, path)
        if is_template(raw_field(parent, key)):
            _source(config, path, ())
    return config


def _value(config: ConfigDict, path: str, visiting: tuple[str, ...]) -> Any:
    parent, key = lookup(config, path)
    value = parent[key]
    if isinstance(value, ConfigDict):
        raise ConfigError(f"${{{path}}} names a section; an interpolation must name a value")
    if is_template(value):
        _check_cycle(path, visiting)
        return evaluate(config, value, _parent(path), (*visiting, path))
    return value


def evaluate(
    config: ConfigDict, template: str, section: str, visiting: tuple[str, ...] = ()
) -> Any:
    """The current value of `template` in `config` (a name alone keeps its value's type)."""
    pieces = _pieces(template, section)
    values = [_value(config, text, visiting) if is_name else text for is_name, text in pieces]
    if len(pieces) == 1 and pieces[0][0]:
        return values[0]
    return "".join(str(value) for value in values)


def resolve(config: ConfigDict) -> ConfigDict:
    """A plain copy of `config` with every interpolation replaced by its value.

    The copy holds no references (later changes do not propagate), keeps the key order and the
    lock, and every key keeps its type (null keys and keys accepting several types too).
    """
    return _plain_copy(config, config, "")


def _plain_copy(root: ConfigDict, section: ConfigDict, prefix: str) -> ConfigDict:
    out = ConfigDict(sort_keys=False)
    for key in section.keys():
        path = f"{prefix}{key}"
        value = section[key]
        if isinstance(value, ConfigDict):
            value = _plain_copy(root, value, f"{path}.")
        else:
            if is_template(value):
                value = evaluate(root, value, _parent(path), (path,))
            value = copy.deepcopy(value)
            field_type = section.get_type(key)
            if isinstance(field_type, tuple) or (value is None and field_type is not type(None)):
                value = FieldReference(value, field_type=field_type)
        out[key] = value
    return out.lock() if section.is_locked else out
