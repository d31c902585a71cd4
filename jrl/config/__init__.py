"""jrl's configuration: verl's keys and defaults in an ml_collections ConfigDict.

An entry point calls `load_config(sys.argv[1:])` (which reads `--config=FILE.py[:preset]`, then
`a.b=v` / `--config.a.b=v` overrides, resolves interpolations and checks the result) and prints
`to_yaml(config)`.
"""

from jrl.config.defaults import default_config
from jrl.config.errors import ConfigError
from jrl.config.eval_defaults import evaluation_config, generation_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_config, load_config_file, to_yaml
from jrl.config.overrides import apply_overrides, parse_command_line
from jrl.config.presets import apply_preset, apply_sft_preset
from jrl.config.sft_defaults import sft_config
from jrl.config.tree import frozen
from jrl.config.validate import n_gpus, uses_critic, uses_reference, validate

__all__ = [
    "ConfigError",
    "apply_overrides",
    "apply_preset",
    "apply_sft_preset",
    "default_config",
    "evaluation_config",
    "frozen",
    "generation_config",
    "load_config",
    "load_config_file",
    "n_gpus",
    "parse_command_line",
    "resolve",
    "sft_config",
    "to_yaml",
    "uses_critic",
    "uses_reference",
    "validate",
]
