"""Function tools (current verl's ``multi_turn.function_tool_path``): a plain Python function,
decorated with `function_tool`, whose OpenAI schema comes from its type hints and Google-style
docstring."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.utils import get_json_schema

from jrl.agent.tools.base import BaseTool, ToolResponse

# Functions decorated so far, by tool name.
FUNCTION_TOOLS: dict[str, FunctionTool] = {}


class FunctionTool(BaseTool):
    """A stateless tool around `fn`: ``execute`` calls it with the model's arguments. It may
    return a `ToolResponse`, text, anything JSON can write, or (response, reward[, metrics])."""

    def __init__(self, fn: Callable[..., Any], schema: dict[str, Any]):
        super().__init__({}, schema)
        self.fn = fn

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**parameters)
        else:
            result = await asyncio.to_thread(self.fn, **parameters)
        reward, metrics = 0.0, {}
        if isinstance(result, tuple):
            result, reward, metrics = (*result, 0.0, {})[:3]
        if isinstance(result, ToolResponse):
            return result, float(reward), dict(metrics)
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return ToolResponse(text=text), float(reward), dict(metrics)


def function_tool(
    name: str | Callable[..., Any] | None = None, *, schema: dict[str, Any] | None = None
) -> Any:
    """Register a function as a tool (``@function_tool``, ``@function_tool("name")`` or with
    `schema` in place of the one read from its signature and docstring)."""

    def register(fn: Callable[..., Any], tool_name: str | None) -> Callable[..., Any]:
        tool_name = tool_name or fn.__name__
        if schema is not None:
            built = schema
        else:
            built = get_json_schema(fn)
            built["function"]["name"] = tool_name
        known = FUNCTION_TOOLS.get(tool_name)
        if known is not None and known.fn is not fn:
            raise ValueError(
                f"function tool {tool_name!r} is already {known.fn.__module__}."
                f"{known.fn.__qualname__}; give {fn.__qualname__} another name"
            )
        FUNCTION_TOOLS[tool_name] = FunctionTool(fn, built)
        return fn

    if callable(name):
        return register(name, None)
    return lambda fn: register(fn, name)


def load_function_tools(path: str) -> list[FunctionTool]:
    """The tools the Python file `path` registers with `function_tool` when it runs."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={path!r} is not a file"
        )
    before = set(FUNCTION_TOOLS)
    module_name = "jrl_function_tools_" + str(abs(hash(str(file.resolve()))))
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = sorted(set(FUNCTION_TOOLS) - before)
    if not names:
        raise ValueError(
            f"multi_turn.function_tool_path={path!r} registers no tool: decorate its functions "
            "with jrl.agent.function_tool"
        )
    return [FUNCTION_TOOLS[name] for name in names]
