"""`Gsm8kTool`: the model submits its answer and hears whether it is right (verl's
``calc_gsm8k_reward``), scored by jrl's GSM8K scorer (flexible extraction)."""

from __future__ import annotations

from typing import Any

from jrl.agent.tools.base import BaseTool, ToolResponse
from jrl.reward import gsm8k

# A resubmission that does not raise the score costs this much (verl's step reward).
NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """State per trajectory: the ground truth (``create_kwargs.ground_truth``), the last answer
    and its score."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    async def create(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instances[instance_id] = {"answer": "", "ground_truth": ground_truth, "score": 0.0}
        return instance_id, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        answer = str(parameters.get("answer", ""))
        state = self._instances[instance_id]
        state["answer"] = answer if answer.startswith("#### ") else "#### " + answer
        score = await self.calc_reward(instance_id)
        step_reward = 0.0 if score > state["score"] else NO_IMPROVEMENT_PENALTY
        state["score"] = score
        response = ToolResponse(text=f"Current parsed answer={answer!r} reward={score!r}")
        return response, step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The GSM8K score of the last answer, as verl's scorer returns it (int 0 when no number
        is found, so the tool's text reads ``reward=0`` as verl's does)."""
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(
            state["answer"], state["ground_truth"], method="flexible", format_score=0.0
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
