"""`LookupTool`: answers the secret of its trajectory (the lookup task, `jrl.data.lookup`)."""

from __future__ import annotations

from typing import Any

from jrl.agent.tools.base import BaseTool, ToolResponse


class LookupTool(BaseTool):
    """State per trajectory: the secret (``create_kwargs.secret``), the only answer it gives."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None):
        super().__init__(config, tool_schema)
        self._secrets: dict[str, str] = {}

    async def create(
        self, instance_id: str | None = None, secret: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """A trajectory's instance; the secret comes as a keyword or, as verl's tool agent
        passes it, in ``create_kwargs``."""
        instance_id, response = await super().create(instance_id)
        if secret is None:
            secret = kwargs.get("create_kwargs", {}).get("secret", "")
        self._secrets[instance_id] = str(secret)
        return instance_id, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        return ToolResponse(text=self._secrets[instance_id]), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._secrets.pop(instance_id, None)
