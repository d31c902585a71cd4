"""Command-line overrides: Hydra's grammar as verl's scripts write it, and absl's.

- ``--config=FILE.py[:preset]``: the card; ``--config.a.b=v`` (absl) and ``a.b=v`` set a key.
- ``+a.b=v`` adds a key that does not exist yet (e.g. under ``model.override_config``); as in
  Hydra it may also name a key that is null, or give an existing key a list or a dict (merged),
  or name an entry jrl gives a section that verl's FSDP config leaves empty (`OPEN_SECTIONS`).
  ``++a.b=v`` sets the key or adds it.
- ``~a.b`` (``~a.b=v``: only while it is v) deletes the key in Hydra. jrl's keys cannot leave
  the tree, so the key takes its default again (null for optional keys; a section, each of its
  keys), and a key that the defaults lack (one added with ``+``) goes.
- ``--config-name=NAME`` (``--config-name NAME``, ``-cn``; ``.yaml`` dropped) names the verl
  config the command line was written for (`jrl.config.trees`); ``--config-path`` (``-cp``),
  where verl keeps its YAML, is not read (said in one line). Hydra's own keys (``hydra.run.dir``,
  ``hydra/job_logging=...``) are dropped, each said in one line. Current verl's
  ``model_engine=NAME`` is checked (`jrl.config.respelled`), and a key in current verl's
  spelling sets the verl v0.6.0 key it stands for, said in one line.
- A dict value set on a section sets each of its keys. A key that takes a list takes a single
  name as a one-item list where verl does (`ONE_ITEM_LISTS`: ``trainer.logger=console``).
- A batch of overrides is one layer: a key of a deprecated/replacement pair that it sets wins
  over its partner (`jrl.config.replaced`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING
from typing import Any, NamedTuple

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.errors import ConfigError
from jrl.config.interpolation import is_template, reference
from jrl.config.moved import value_at
from jrl.config.replaced import settle_pairs
from jrl.config.respelled import check_model_engine, current_feature, respelled
from jrl.config.tree import assign, lookup, section_at, unknown_key
from jrl.config.values import parse_value

Override = tuple[str, Any]
_USAGE = "expected --config=FILE.py[:preset], --config.KEY=VALUE or KEY=VALUE"
_PREFIXES = ("", "+", "++", "~")
# Hydra's options naming the YAML config: what each sets.
_HYDRA_OPTIONS = {"--config-name": "name", "-cn": "name", "--config-path": "path", "-cp": "path"}
# Keys of type list that verl also takes as one name (its tracker wraps a string in a list).
ONE_ITEM_LISTS = ("trainer.logger",)
# Sections verl's FSDP config leaves empty and jrl fills with their documented entries: verl's
# command lines add those entries with `+`, so `+` may name one of them.
OPEN_SECTIONS = ("override_config",)


class CommandLine(NamedTuple):
    """A command line, read: the card (``--config``), the overrides in order, and the verl
    config named by ``--config-name`` (None when absent)."""

    spec: str | None
    overrides: list[Override]
    config_name: str | None


def split_key(key: str) -> tuple[str, str]:
    """(prefix, dotted path) of an override's key; the prefix is '', '+', '++' or '~'."""
    path = key.lstrip("+~")
    return key[: len(key) - len(path)], path


def _option_value(option: str, args: Iterator[str]) -> str:
    """The value of `option` given as the next argument (``--config-name NAME``)."""
    text = next(args, None)
    if text is None:
        raise ConfigError(f"{option} needs a value: {_USAGE}")
    return text


def parse_command_line(argv: Sequence[str]) -> CommandLine:
    """Split `argv` (without the program name) into the card, the overrides and the verl
    config's name."""
    spec, name, overrides = None, None, []
    args = iter(argv)
    for arg in args:
        if not arg.strip():
            raise ConfigError(
                f"cannot read argument {arg!r}: it is blank (a shell script passes one where a "
                "backslash is followed by a space, e.g. before a comment); remove it"
            )
        option, equals, text = arg.partition("=")
        if option in _HYDRA_OPTIONS or option == "--config" or option.startswith("--config."):
            text, equals = (text, equals) if equals else (_option_value(option, args), "=")
        if option in _HYDRA_OPTIONS:
            if _HYDRA_OPTIONS[option] == "name":
                name = text.removesuffix(".yaml")
            else:
                print(
                    f"jrl: {option}={text} is not read: jrl builds the verl config that "
                    "--config-name names from its own defaults; give your YAML's own values as "
                    "overrides",
                    flush=True,
                )
            continue
        if option == "--config":
            spec = text
            continue
        key = option.removeprefix("--config.")
        if key == option and ((not equals and not arg.startswith("~")) or arg.startswith("-")):
            raise ConfigError(f"cannot read argument {arg!r}: {_USAGE}")
        prefix, path = split_key(key)
        if path.split(".")[0].split("/")[0] == "hydra":
            print(
                f"jrl: {arg} is ignored: it sets Hydra's own behaviour (its output folder, "
                "logging), and jrl does not run under Hydra",
                flush=True,
            )
            continue
        if prefix not in _PREFIXES or not all(path.split(".")):
            raise ConfigError(f"malformed key in {arg!r}: {_USAGE}")
        if key == "model_engine" and equals:
            check_model_engine(text)
            continue
        if (legacy := respelled(path)) != path:
            print(f"jrl: {path} is current verl's spelling of {legacy}; set as that", flush=True)
            key = prefix + legacy
        try:
            overrides.append((key, parse_value(text) if equals else None))
        except ConfigError as error:
            raise ConfigError(f"{key}: {error}") from None
    return CommandLine(spec, overrides, name)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def _as_tuple(field_type: type | tuple[type, ...]) -> tuple[type, ...]:
    return field_type if isinstance(field_type, tuple) else (field_type,)


def coerce(path: str, value: Any, field_type: type | tuple[type, ...]) -> Any:
    """`value` made fit for a key of `field_type` (int -> float, scalar -> str, one name -> a
    one-item list for `ONE_ITEM_LISTS`) or ConfigError."""
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
    if value == "":
        raise ConfigError(
            f"{path} expects {_type_names(types)}, got an empty value ('{path}=' with nothing "
            "after '=': a shell variable that is not set?)"
        )
    if list in types and isinstance(value, str) and path in ONE_ITEM_LISTS:
        return [value]
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


def _set(config: ConfigDict, path: str, value: Any, plus: int, given: list[str]) -> None:
    """Set (`plus` 0), add (1) or set-or-add (2) `path`; the keys set are appended to `given`."""
    parent_path, _, name = path.rpartition(".")
    if plus and current_feature(path) and value_at(config, path) is MISSING:
        raise unknown_key(config, path)  # names the feature; `+` adds no key for it
    parent = section_at(config, parent_path, create=plus > 0)
    given.append(path)
    if name not in parent:
        if not plus:
            raise unknown_key(config, path, f"; to add a new key, write +{path}=...")
        if is_template(value):
            value = reference(config, value, parent_path)
        with parent.unlocked():
            parent[name] = value
        return
    current = parent[name]
    opened = any(part in OPEN_SECTIONS for part in parent_path.split("."))
    if plus == 1 and current is not None and not isinstance(value, (list, dict)) and not opened:
        raise ConfigError(
            f"cannot add '{path}': it exists already (it is {current!r}); write {path}=... or "
            f"++{path}=... to change it"
        )
    if isinstance(current, ConfigDict):
        if not isinstance(value, dict):
            raise ConfigError(
                f"'{path}' is a section, not a value: set its keys ({path}.KEY=...) "
                f"or give a dict ({path}={{KEY: VALUE}})"
            )
        for key, item in value.items():
            _set(config, f"{path}.{key}", item, plus and 2, given)
        return
    field_type = parent.get_type(name)
    if is_template(value):
        value = _follow(config, path, value, field_type)
    else:
        value = coerce(path, value, field_type)
    assign(config, path, value)


def _restore(config: ConfigDict, path: str, defaults: ConfigDict) -> None:
    """`path` back to its value in `defaults` (a ``${...}`` template: it follows again when the
    config is resolved); a section, each of its keys; a key that `defaults` lack goes."""
    parent, name = lookup(config, path)
    default, current = value_at(defaults, path), parent[name]
    if default is MISSING:
        with parent.unlocked():
            del parent[name]
    elif isinstance(default, ConfigDict) and isinstance(current, ConfigDict):
        for key in list(current.keys()):
            _restore(config, f"{path}.{key}", defaults)
    elif default is None and isinstance(current, ConfigDict):  # a null dict that `+` filled
        default_type = section_at(defaults, path.rpartition(".")[0]).get_type(name)
        with parent.ignore_type():
            parent[name] = placeholder(default_type)
    else:
        assign(config, path, default)


def _reset(
    config: ConfigDict, path: str, only: Any, templates: Callable[[], ConfigDict] | None
) -> None:
    """Hydra's ``~path`` (``~path=only``: only while `path` holds `only`), as `_restore`."""
    parent, name = lookup(config, path)
    if only is not None and parent[name] != only:
        raise ConfigError(f"cannot reset '{path}' (~{path}={only!r}): it is {parent[name]!r}")
    if templates is None:
        raise ConfigError(f"~{path}: a key goes back to its default on the command line only")
    _restore(config, path, templates())


def apply_overrides(
    config: ConfigDict,
    overrides: Sequence[Override],
    templates: Callable[[], ConfigDict] | None = None,
) -> ConfigDict:
    """Set each (key, value) of `overrides` in order, type-checked (``~key`` takes its value in
    `templates()`, the tree's defaults); then a key of a replaced pair that they set wins over
    its partner (`settle_pairs`). Returns `config` (changed)."""
    given: list[str] = []
    for key, value in overrides:
        prefix, path = split_key(key)
        if prefix == "~":
            _reset(config, path, value, templates)
        else:
            _set(config, path, value, len(prefix), given)
    settle_pairs(config, given)
    return config


def command_line_keys(argv: Sequence[str]) -> frozenset[str]:
    """The keys a command line sets or resets (``+``, ``++`` and ``~`` dropped)."""
    return frozenset(split_key(key)[1] for key, _ in parse_command_line(argv).overrides)
