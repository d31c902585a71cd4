"""Reading optional keys from a config section given as a ConfigDict, dataclass or mapping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_option(config: Any, key: str, default: Any = None) -> Any:
    """`config.key`, or `default` when the config or the key is absent, or the value is null."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value
