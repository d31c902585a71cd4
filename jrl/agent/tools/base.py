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
    """`schema` as verl renders it into the prompt: its ``OpenAIFunctionToolSchema`` dumped
    without unset or null fields, so that only ``type`` and ``function`` (``name``,
    ``description``, ``parameters`` with ``type``, ``properties`` and ``required``, ``strict``)
    stay, and of each property ``type``, ``description`` and ``enum``, in that order. A field
    verl requires that is missing is a ValueError naming `where`."""

    def need(mapping: Any, key: str, kind: type | tuple[type, ...], path: str) -> Any:
        value = mapping.get(key) if isinstance(mapping, Mapping) else None
        if not isinstance(value, kind):
            raise ValueError(f"{where}: a tool schema needs {path}{key}, got {schema!r:.300}")
        return value

    if not isinstance(schema, Mapping) or schema.get("type") != "function":
        raise ValueError(f"{where}: a tool schema needs type: function, got {schema!r:.300}")
    function = need(schema, "function", Mapping, "")
    out = {
        "name": need(function, "name", str, "function."),
        "description": need(function, "description", str, "function."),
    }
    if function.get("parameters") is not None:
        parameters = need(function, "parameters", Mapping, "function.")
        properties = {}
        for name, spec in need(parameters, "properties", Mapping, "parameters.").items():
            kept = {"type": need(spec, "type", str, f"parameters.properties.{name}.")}
            kept.update({k: spec[k] for k in ("description", "enum") if spec.get(k) is not None})
            properties[name] = kept
        out["parameters"] = {
            "type": need(parameters, "type", str, "function.parameters."),
            "properties": properties,
            "required": list(need(parameters, "required", list | tuple, "parameters.")),
        }
    if function.get("strict") is not None:
        out["strict"] = bool(function["strict"])
    return {"type": "function", "function": out}


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
