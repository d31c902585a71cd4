"""From a command line to a resolved config: card file (or the program's defaults) -> overrides ->
interpolation (the checks run above, in `jrl.runspec`)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from ml_collections import ConfigDict

from jrl.config.errors import ConfigError
from jrl.config.interpolation import resolve
from jrl.config.overrides import apply_overrides, parse_command_line
from jrl.config.replaced import settle_card
from jrl.config.trees import PPO, KeyTree, check_config_name


def load_config_file(spec: str) -> tuple[ConfigDict, ModuleType]:
    """Import `FILE.py[:preset]` and return its `get_config(preset)` and the module itself."""
    file, colon, preset = spec.rpartition(":")
    if not colon:
        file, preset = spec, ""
    path = Path(file).expanduser()
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(
            f"config file '{file}' not found (relative to {Path.cwd()}); "
            "pass --config=path/to/experiment.py[:preset]"
        )
    module_spec = importlib.util.spec_from_file_location(f"jrl_config_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"config file '{file}' defines no get_config(preset=None) function")
    config = get_config(preset) if preset else get_config()
    if not isinstance(config, ConfigDict):
        raise ConfigError(
            f"get_config() of '{file}' returned {type(config).__name__}; it must return a "
            "ConfigDict (start from jrl.config.default_config())"
        )
    return config, module


def read_config(argv: Sequence[str], tree: KeyTree = PPO) -> tuple[ConfigDict, ModuleType | None]:
    """The resolved, not yet checked config of a command line (without the program name) of
    `tree`'s program: the card of ``--config=FILE.py[:preset]`` (else the tree's defaults with
    the layer of the ``--config-name`` config over them, and the module is None), then the
    overrides. A ``--config-name`` must name a config of `tree`."""
    command = parse_command_line(argv)
    check_config_name(command.config_name, tree)
    if command.spec:
        (config, module), layer = load_card(command.spec, tree), ()
    else:
        config, module, layer = tree.defaults(), None, tree.layer(command.config_name)
    overrides = [*layer, *command.overrides]
    return resolve(apply_overrides(config, overrides, tree.templates)), module


def load_card(spec: str, tree: KeyTree = PPO) -> tuple[ConfigDict, ModuleType]:
    """`load_config_file(spec)` as the card's layer of a run of `tree`'s program: of each replaced
    pair, the key it moved from its default wins (`jrl.config.replaced`)."""
    config, module = load_config_file(spec)
    settle_card(config, tree.defaults())
    return config, module


def to_yaml(config: ConfigDict) -> str:
    """The resolved config as YAML, keys in config order (printed at start-up)."""
    return yaml_of(resolve(config).to_dict())


def yaml_of(tree: Mapping[str, Any]) -> str:
    """A plain config tree as YAML, keys in the tree's order."""
    return yaml.safe_dump(dict(tree), sort_keys=False, default_flow_style=False)
