"""verl's tool lifecycle: `BaseTool` (``create`` -> ``execute`` ... -> ``calc_reward`` ->
``release``, all coroutines), the `ToolResponse` it returns, and the OpenAI function schema that
describes it to the model."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ToolResponse:
    """What a tool answers: text (jrl's models read text only)."""

    text: str | None = None


def check_tool_schema(schema: Any, where: str) -> dict[str, Any]:
    """`schema` as a plain dict once it is an OpenAI function schema (``type: function``, a
    ``function`` with a string ``name``); else a ValueError naming `where`."""
    if not isinstance(schema, Mapping) or schema.get("type") != "function":
        raise ValueError(f"{where}: a tool schema needs type: function, got {schema!r}")
    function = schema.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"{where}: a tool schema needs function.name, got {schema!r}")
    return {"type": "function", "function": dict(function)}


class BaseTool:
    """A tool as verl defines one. Subclasses override the coroutines they need; one instance
    serves every trajectory, each with its own `instance_id`.

    `config` is the tool's ``config`` section of the tool YAML; `tool_schema` its OpenAI function
    schema (None: the subclass's `get_openai_tool_schema`)."""

    def __init__(self, config: Mapping[str, Any], tool_schema: Mapping[str, Any] | None):
        self.config = dict(config)
        schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        self.tool_schema = check_tool_schema(schema, type(self).__name__)
        self.name: str = self.tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> Mapping[str, Any] | None:
        return None

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        """Start a trajectory's instance; returns (its id, a creation response)."""
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[Any, float, dict[str, Any]]:
        """Run one call; returns (the response, a step reward, metrics)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
