"""Tools from verl's tool config YAML (``tools: [{class_name, config: {type: native, ...},
tool_schema}]``) and from function-tool files; verl's built-in class paths name jrl's tools."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import yaml

from jrl.agent.tools.base import BaseTool
from jrl.agent.tools.function import load_function_tools

# verl's tool classes -> jrl's ("module:name"); a config naming one gets jrl's, with a notice.
VERL_TOOLS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "jrl.agent.tools.gsm8k:Gsm8kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": (
        "jrl.agent.tools.sandbox:PythonSandboxTool"
    ),
}
_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


def import_object(path: str, where: str) -> Any:
    """The object ``package.module.Name`` (or ``package.module:Name``) names."""
    module_name, _, name = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ImportError(f"{where}: cannot import {path!r}: {err}") from None


def tool_class(class_name: str, where: str) -> type[BaseTool]:
    """The class `class_name` names: jrl's own for verl's built-ins (announced)."""
    if class_name in VERL_TOOLS:
        print(f"jrl: {where}: {class_name} is verl's; jrl's {VERL_TOOLS[class_name]} runs it")
        class_name = VERL_TOOLS[class_name]
    cls = import_object(class_name, where)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise TypeError(f"{where}: {class_name} is not a subclass of jrl.agent.BaseTool")
    return cls


def tools_from_yaml(path: str) -> list[BaseTool]:
    """The tools of the tool config file `path`."""
    with open(path) as file:
        document = yaml.safe_load(file) or {}
    entries = document.get("tools")
    if not isinstance(entries, list):
        raise ValueError(f"{_KEY}={path!r}: the file needs a list under 'tools'")
    tools = []
    for i, entry in enumerate(entries):
        where = f"{path} tools[{i}]"
        config = dict(entry.get("config") or {})
        kind = config.pop("type", "native")
        if kind != "native":
            raise ValueError(f"{where}: config.type={kind!r}: jrl runs native tools only (no MCP)")
        cls = tool_class(str(entry.get("class_name")), where)
        tools.append(cls(config, entry.get("tool_schema")))
    return tools


def load_tools(tool_config_path: str | None, function_tool_path: str | None) -> dict[str, BaseTool]:
    """Every tool of a run by name; two tools of one name are an error."""
    found: Iterable[BaseTool] = [
        *(tools_from_yaml(tool_config_path) if tool_config_path else []),
        *(load_function_tools(function_tool_path) if function_tool_path else []),
    ]
    tools: dict[str, BaseTool] = {}
    for tool in found:
        if tool.name in tools:
            raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
        tools[tool.name] = tool
    return tools
