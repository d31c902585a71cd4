"""`AgentContext`: what every trajectory of a run shares, built once per rollout: the settings,
the tokenizer and its chat-template options, the tools and their schemas, the interactions, the
gate user calls go through, and the tracer of ``rollout.trace``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from jrl.agent.calls import CallGate
from jrl.agent.chat import ChatTemplate
from jrl.agent.interactions import BaseInteraction, load_interactions
from jrl.agent.loop import register_from_file
from jrl.agent.settings import AgentSettings
from jrl.agent.tools.base import BaseTool
from jrl.agent.tools.registry import load_tools
from jrl.agent.trace import NO_TRACES, RolloutTracer


@dataclasses.dataclass
class AgentContext:
    settings: AgentSettings
    tokenizer: Any
    chat_template_kwargs: Mapping[str, Any]
    tools: dict[str, BaseTool]
    interactions: dict[str, BaseInteraction]
    gate: CallGate
    tracer: RolloutTracer = NO_TRACES

    @property
    def default_loop(self) -> str:
        return self.settings.default_agent_loop

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool.tool_schema for tool in self.tools.values()]

    @functools.cached_property
    def chat(self) -> ChatTemplate:
        """The chat template with the run's options and tools, probed on first use."""
        return ChatTemplate.of(self.tokenizer, self.chat_template_kwargs, self.tool_schemas)

    @classmethod
    def build(
        cls,
        settings: AgentSettings,
        tokenizer: Any,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tracer: RolloutTracer = NO_TRACES,
    ) -> AgentContext:
        """Loads the settings' loop, tool and interaction files (each error names its key);
        `tracer` writes the traced trajectories (``rollout.trace``)."""
        if settings.agent_loop_config_path:
            register_from_file(settings.agent_loop_config_path)
        interactions = (
            load_interactions(settings.interaction_config_path)
            if settings.interaction_config_path
            else {}
        )
        return cls(
            settings,
            tokenizer,
            dict(chat_template_kwargs or {}),
            load_tools(settings.tool_config_path, settings.function_tool_path),
            interactions,
            CallGate(settings.num_workers, settings.tool_timeout),
            tracer,
        )
