"""Package exports imported on first use (PEP 562): importing one name of a package does not
import its siblings, so a constant of `jrl.rollout` comes without JAX or the engines."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[list[str], Callable[[str], Any]]:
    """(`__all__`, `__getattr__`) of `package`, whose names `exports` maps to the modules that
    define them; a name's module is imported when the name is first read."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return sorted(exports), __getattr__
