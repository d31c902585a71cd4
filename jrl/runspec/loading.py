"""From a command line to a checked config: `jrl.config.read_config`, then every check."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from ml_collections import ConfigDict

from jrl.config.loading import read_config
from jrl.runspec.validate import validate


def load_config(
    argv: Sequence[str], num_devices: int | None = None
) -> tuple[ConfigDict, ModuleType | None]:
    """The checked, resolved config of a command line (without the program name).

    Without `--config` the defaults are used (and the module is None). `num_devices`, when given,
    is the number of visible devices the run must fit in.
    """
    config, module = read_config(argv)
    validate(config, num_devices)
    return config, module
