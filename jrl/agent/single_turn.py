"""``single_turn_agent``: one model turn after the row's prompt, as a rollout without agent
loops generates it (the same ids, so the same call and the same tokens)."""

from __future__ import annotations

from typing import Any

from jrl.agent.loop import AgentLoopBase, AgentLoopOutput


class SingleTurnAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = [int(i) for i in kwargs["raw_prompt_ids"]]
        out = await self.server_manager.generate(
            kwargs.get("request_id", ""), prompt_ids=prompt_ids, sampling_params=sampling_params
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=out.token_ids,
            response_mask=[1] * len(out.token_ids),
            response_logprobs=out.log_probs,
            num_turns=2,
        )
