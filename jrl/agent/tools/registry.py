"""Tools from verl's tool config YAML (``tools: [{class_name, config: {type: native, ...},
tool_schema}]``) and from function-tool files; verl's built-in class paths name jrl's tools."""

from __future__ import annotations

from collections.abc import Iterable

import yaml

from jrl.agent.imports import user_class
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
        config = dict(entry.get("config") or {})  # verl hands the tool all of it, type too
        kind = config.get("type")
        if kind is None:
            raise ValueError(f"{where}: config.type is required, as in verl (native)")
        if kind != "native":
            raise ValueError(f"{where}: config.type={kind!r}: jrl runs native tools only (no MCP)")
        cls = user_class(str(entry.get("class_name")), BaseTool, where, VERL_TOOLS)
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
