"""Classes and objects that config files name by import path (tools, interactions, agent loops),
verl's built-in paths standing for jrl's own."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def import_object(path: str, where: str) -> Any:
    """The object ``package.module.Name`` (or ``package.module:Name``) names."""
    module_name, _, name = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ImportError(f"{where}: cannot import {path!r}: {err}") from None


def user_class(
    class_name: str, base: type, where: str, verl_names: Mapping[str, str] | None = None
) -> type:
    """The subclass of `base` that `class_name` names; a path of verl's in `verl_names` names
    jrl's class instead (announced)."""
    if verl_names and class_name in verl_names:
        print(f"jrl: {where}: {class_name} is verl's; jrl's {verl_names[class_name]} runs it")
        class_name = verl_names[class_name]
    cls = import_object(class_name, where)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{where}: {class_name} is not a subclass of jrl.agent.{base.__name__}")
    return cls
