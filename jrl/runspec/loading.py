"""From a command line to a checked config: `jrl.config.read_config`, then every check."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from ml_collections import ConfigDict

from jrl.config.loading import read_config
from jrl.runspec.placement import settle_streamed_batches
from jrl.runspec.validate import validate


def load_config(
    argv: Sequence[str], num_devices: int | None = None
) -> tuple[ConfigDict, ModuleType | None]:
    """The checked, resolved config of a command line (without the program name).

    Without `--config` the defaults are used (and the module is None). `num_devices`, when given,
    is the number of visible devices the run must fit in. verl's fully-async batch keys become
    jrl's first (`settle_streamed_batches`), each change said.
    """
    config, module = read_config(argv)
    for change in settle_streamed_batches(config):
        print(f"jrl: {change}", flush=True)
    validate(config, num_devices)
    return config, module
