"""jrl's configuration keys: verl's key trees and defaults in ml_collections ConfigDicts, experiment
cards, command-line overrides and interpolation. It knows keys only (no jax, no other jrl
package); the checks and what each key becomes live above the mechanisms, in `jrl.runspec`.

`read_config(argv)` reads ``--config=FILE.py[:preset]`` (or Hydra's ``--config-name``), then
``a.b=v`` / ``+a.b=v`` / ``++a.b=v`` / ``~a.b`` / ``--config.a.b=v`` overrides, and resolves
interpolations; `jrl.runspec.load_config` adds every check.
"""

from jrl.config.defaults import default_config
from jrl.config.errors import ConfigError
from jrl.config.eval_defaults import evaluation_config, generation_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_config_file, read_config, to_yaml
from jrl.config.overrides import apply_overrides, parse_command_line
from jrl.config.sft_defaults import sft_config

__all__ = [
    "ConfigError",
    "apply_overrides",
    "default_config",
    "evaluation_config",
    "generation_config",
    "load_config_file",
    "parse_command_line",
    "read_config",
    "resolve",
    "sft_config",
    "to_yaml",
]
