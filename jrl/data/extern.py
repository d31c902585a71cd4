"""User code named in the config: an object loaded from a Python file or an importable module.

A location is a file path (``~`` expanded, optionally ``file://``) or ``pkg://package.module``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PKG_PREFIX = "pkg://"


def load_module(location: str, config_key: str) -> ModuleType:
    """The module at `location`; `config_key` (e.g. ``data.custom_cls``) is named in errors."""
    if location.startswith(PKG_PREFIX):
        name = location[len(PKG_PREFIX) :]
        try:
            return importlib.import_module(name)
        except ImportError as err:
            raise ModuleNotFoundError(
                f"{config_key}.path={location!r}: module {name!r} cannot be imported ({err}); "
                "install it or put its folder on PYTHONPATH"
            ) from err
    file = Path(location.removeprefix("file://")).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(
            f"{config_key}.path={location!r} does not exist; give the path of a Python file "
            f"(or {PKG_PREFIX}<module> for an importable module)"
        )
    module_name = "jrl_extern_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise RuntimeError(f"{config_key}.path={str(file)!r} failed to import: {err}") from err
    return module


def load_object(location: str | None, name: str | None, config_key: str) -> Any:
    """Attribute `name` of the module at `location` (``<config_key>.path`` / ``.name``)."""
    if not location:
        raise ValueError(f"{config_key}.path is not set; give the file that defines {name!r}")
    if not name:
        raise ValueError(
            f"{config_key}.name is not set; name the class or function to load from {location!r}"
        )
    module = load_module(location, config_key)
    if not hasattr(module, name):
        defined = [
            k
            for k, v in vars(module).items()
            if (inspect.isfunction(v) or inspect.isclass(v))
            and not k.startswith("_")
            and getattr(v, "__module__", None) == module.__name__
        ]
        raise AttributeError(
            f"{config_key}.name={name!r} is not defined in {location!r}; it defines "
            f"{', '.join(defined) or 'no functions or classes'}"
        )
    return getattr(module, name)


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether calling `fn` (a function or class) with the keyword `name` is allowed: a parameter
    of that name, or ``**kwargs``."""
    parameters = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
