"""``tool_agent``: the model answers, calls tools (Hermes ``<tool_call>`` blocks) and reads
their answers, or hears an interaction's user reply, until it answers without a call, the
conversation ends, or a turn or length limit is reached.

Token in, token out: each model turn's sampled ids are kept as they are, and each tool or user
turn is appended as the chat template's token delta (mask 0), so nothing the model said is ever
re-tokenised. Every tool and interaction call goes through the context's `CallGate`: a call
that raises, hangs or answers nonsense becomes an error the model reads (and a counted metric),
never a failed rollout."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from jrl.agent.calls import Outcome
from jrl.agent.loop import AgentLoopBase, AgentLoopOutput
from jrl.agent.parser import TOOL_CALL_FORMATS, FunctionCall
from jrl.agent.tools.base import ToolResponse

_FIRST_FAILURE: set[str] = set()  # kinds of failure already logged in this process


def _log_once(kind: str, message: str) -> None:
    if kind not in _FIRST_FAILURE:
        _FIRST_FAILURE.add(kind)
        print(f"jrl: agent: {message} (later ones are counted in the agent/ metrics)", flush=True)


def truncate_text(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters as verl cuts a tool answer: keep the start (left), the
    end (right) or both halves (middle), marking the cut."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


class ToolAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        context, settings = self.context, self.context.settings
        chat, length = context.chat, self.server_manager.engine.response_length
        if "raw_prompt" not in kwargs:
            raise KeyError("tool_agent needs the rows' messages: set data.return_raw_chat=True")
        messages = chat.show_tools(kwargs["raw_prompt"])
        prompt_ids = chat.prompt_ids(messages)
        request_id, tools_kwargs = kwargs.get("request_id", ""), kwargs.get("tools_kwargs") or {}
        interaction, interaction_id, interaction_kwargs = await self._start_interaction(kwargs)
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        counts: Counter[str] = Counter()  # the trajectory's metrics (`metrics.COUNTERS`, ...)
        extra: dict[str, list[float]] = {"turn_scores": [], "tool_rewards": []}
        assistant_turns = user_turns = 0
        eos = set(self.server_manager.engine.eos_token_ids)
        while True:
            out = await self.server_manager.generate(
                request_id,
                prompt_ids=prompt_ids + ids,
                sampling_params=sampling_params,
                max_tokens=length - len(ids),
            )
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += out.log_probs or [0.0] * len(out.token_ids)
            assistant_turns += 1
            ended = bool(out.token_ids) and out.token_ids[-1] in eos
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            if len(ids) >= length or not ended:
                break
            # parsed with special tokens kept, as verl does: a tokenizer may mark the call tags
            parsed = TOOL_CALL_FORMATS[settings.format](self.tokenizer.decode(out.token_ids))
            if self._turn_limit(assistant_turns, user_turns):  # a turn that would have followed
                counts["turn_limit"] = int(bool(parsed.calls) or interaction is not None)
                break
            counts["tool_parse_errors"] += parsed.malformed
            if parsed.calls:
                added = await self._call_tools(parsed.calls, tools_kwargs, counts, extra)
                done = False
            elif interaction is not None:
                done, reply = await self._interact(
                    interaction, interaction_id, messages, interaction_kwargs, counts, extra
                )
                added = [{"role": "user", "content": reply}]
            else:
                break
            delta = chat.turn_delta(added)
            if len(ids) + len(delta) >= length:
                break
            messages += added
            ids += delta
            mask += [0] * len(delta)
            log_probs += [0.0] * len(delta)
            user_turns += 1
            if done:
                break
        if interaction is not None:
            await context.gate.call(interaction.finalize_interaction, interaction_id)
        if ended:  # the whole conversation, rendered at once, ends with the model's EOS too
            mode = settings.tokenization_sanity_check_mode
            same = chat.matches_full_render(messages, prompt_ids + ids, mode)
            counts["tokenization_mismatch"] = int(not same)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids[:length],
            response_mask=mask[:length],
            response_logprobs=log_probs[:length] if out.log_probs is not None else None,
            num_turns=user_turns + assistant_turns + 1,
            metrics=dict(counts),
            extra_fields=extra,
        )

    def _turn_limit(self, assistant_turns: int, user_turns: int) -> bool:
        settings = self.context.settings
        most_assistant, most_user = settings.max_assistant_turns, settings.max_user_turns
        return bool(
            (most_assistant and assistant_turns >= most_assistant)
            or (most_user and user_turns >= most_user)
        )

    async def _start_interaction(self, row: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
        """(the row's interaction or None, its instance id, its kwargs)."""
        interactions = self.context.interactions
        if not interactions:
            return None, "", {}
        kwargs = dict(row.get("interaction_kwargs") or {})
        name = kwargs.get("name", next(iter(interactions)))
        if name not in interactions:
            raise KeyError(
                f"row interaction_kwargs.name={name!r} is not one of {', '.join(interactions)} "
                "(multi_turn.interaction_config_path)"
            )
        started = await self.context.gate.call(interactions[name].start_interaction, None, **kwargs)
        if not started.ok:
            raise RuntimeError(f"interaction {name!r} failed to start: {started.message}")
        return interactions[name], started.value, kwargs

    async def _interact(
        self,
        interaction: Any,
        instance_id: str,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        counts: Counter[str],
        extra: dict[str, list[float]],
    ) -> tuple[bool, str]:
        """(end the conversation?, the user's reply); a failed call ends it."""
        name = f"{type(interaction).__name__}.generate_response"
        with self.context.tracer.span(name, {"messages": messages, **kwargs}) as finish:
            outcome = await self.context.gate.call(
                interaction.generate_response, instance_id, list(messages), **kwargs
            )
            finish({"status": outcome.status, "response": outcome.value, "error": outcome.message})
        if not outcome.ok:
            counts["interaction_errors"] += 1
            _log_once("interaction", f"interaction {interaction.name!r}: {outcome.message}")
            return True, f"Error: {outcome.message}"
        done, reply, score, _ = outcome.value
        if isinstance(score, int | float) and score == score:
            extra["turn_scores"].append(float(score))
        return bool(done), str(reply)

    async def _call_tools(
        self,
        calls: tuple[FunctionCall, ...],
        tools_kwargs: dict[str, Any],
        counts: Counter[str],
        extra: dict[str, list[float]],
    ) -> list[dict[str, Any]]:
        """One tool message per call (the first `max_parallel_calls`, run together as verl
        runs them, each in a worker of the call gate), in the calls' order."""
        settings = self.context.settings
        answers = await asyncio.gather(
            *(
                self._call_tool(c, tools_kwargs, counts)
                for c in calls[: settings.max_parallel_calls]
            )
        )
        messages = []
        for text, reward, failed in answers:
            if reward is not None:
                extra["tool_rewards"].append(reward)
            cut = text
            if not failed:  # as verl: an error's text is not cut
                cut = truncate_text(
                    text, settings.max_tool_response_length, settings.tool_response_truncate_side
                )
            counts["tool_truncated"] += cut != text
            messages.append({"role": "tool", "content": cut})
        return messages

    async def _call_tool(
        self, call: FunctionCall, tools_kwargs: dict[str, Any], counts: Counter[str]
    ) -> tuple[str, float | None, bool]:
        """The text the model reads back (the tool's answer or the error that replaced it), the
        tool's reward (None: not a finite number; 0.0 for an error, as verl's) and whether the
        call failed. An error reads as verl writes it: ``Error when executing tool: <error>``."""
        counts["tool_calls"] += 1
        tool = self.context.tools.get(call.name)
        if tool is None:
            counts["tool_errors"] += 1
            return f"Error when executing tool: {KeyError(call.name)}", 0.0, True
        own = tools_kwargs.get(call.name) or {}
        parameters = json.loads(call.arguments)
        inputs = {"name": call.name, "parameters": parameters}
        with self.context.tracer.span(f"{type(tool).__name__}.execute", inputs) as finish:
            outcome = await self.context.gate.call(_create_execute_release, tool, parameters, own)
            text = _answer_text(outcome)
            finish({"status": outcome.status, "response": text, "error": outcome.message})
        counts["tool_seconds"] += outcome.seconds
        if outcome.status == "timeout":
            counts["tool_timeouts"] += 1
        if text is None or not outcome.ok:
            counts["tool_errors"] += 1
            message = outcome.message or f"it answered {outcome.value[0]!r:.200}, not text"
            _log_once(f"tool-{outcome.status}", f"tool {call.name!r}: {message}")
            return f"Error when executing tool: {outcome.error or message}", 0.0, True
        reward = outcome.value[1]
        if isinstance(reward, int | float) and reward == reward and abs(reward) != float("inf"):
            return text, float(reward), False
        return text, None, False


async def _create_execute_release(
    tool: Any, parameters: dict[str, Any], own_kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    """verl's lifecycle of one call: create an instance (with the row's ``create_kwargs``),
    execute (with the call's arguments only, as verl), release it whatever happened; returns (the
    response, the step reward)."""
    instance_id, _ = await tool.create(create_kwargs=own_kwargs.get("create_kwargs") or {})
    try:
        response, reward, _ = await tool.execute(instance_id, parameters)
    finally:
        await tool.release(instance_id)
    return response, reward


def _answer_text(outcome: Outcome) -> str | None:
    """The text of a successful call's response; None when the tool answered something that is
    not a `ToolResponse` or text."""
    if not outcome.ok:
        return None
    response = outcome.value[0]
    if isinstance(response, ToolResponse):
        return response.text or ""
    if isinstance(response, str):
        return response
    return None
