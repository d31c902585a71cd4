"""verl's agent loop API: a class per way of running one trajectory, registered by name, whose
``async run(sampling_params, **row)`` talks to the engine through ``server_manager.generate``
and returns an `AgentLoopOutput`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from jrl.agent.imports import user_class

_CONFIG_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


@dataclasses.dataclass
class TokenOutput:
    """What one ``server_manager.generate`` call sampled: token ids (ending with EOS when the
    turn ended) and their log-probs (None when the rollout computes none)."""

    token_ids: list[int]
    log_probs: list[float] | None = None


@dataclasses.dataclass
class AgentLoopOutput:
    """One trajectory: the prompt's ids; the response's ids, model turns and the tool and user
    turns between them; `response_mask` 1 on model tokens, 0 on the others; the rollout's
    log-probs of the response (0 off the model's tokens); chat turns counted verl's way (user,
    assistant and tool, the prompt's one included); metrics; `extra_fields` (verl's
    ``turn_scores``, ``tool_rewards``)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 0
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_fields: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """verl's ``trainer_config`` argument: the run's whole key tree in `config` (a plain
    mapping), for loops written against verl that read keys themselves."""

    config: Mapping[str, Any]


class AgentLoopBase:
    """An agent loop; one instance per trajectory, `init_class` once per class.

    `server_manager.generate(request_id, prompt_ids=..., sampling_params=...)` samples one turn
    (a `TokenOutput`); `tokenizer` is the run's; `settings` (jrl's loops) the typed
    `AgentContext` (`context`: settings, tools, interactions)."""

    _class_initialized = False

    def __init__(
        self,
        trainer_config: TrainerConfig,
        server_manager: Any,
        tokenizer: Any,
        processor: Any = None,
        **kwargs: Any,
    ):
        self.init_class(trainer_config.config, tokenizer, processor, **kwargs)
        self.config = trainer_config.config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.context = kwargs.get("context")

    @classmethod
    def init_class(cls, config: Mapping[str, Any], tokenizer: Any, processor: Any, **kwargs: Any):
        """Work shared by every trajectory of the class, done once."""
        cls._class_initialized = True

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trajectory of the row whose dataset fields are `kwargs`."""
        raise NotImplementedError


# agent_name -> the loop's class, or "module:Class" until first use.
AGENT_LOOPS: dict[str, type[AgentLoopBase] | str] = {
    "single_turn_agent": "jrl.agent.single_turn:SingleTurnAgentLoop",
    "tool_agent": "jrl.agent.tool_agent:ToolAgentLoop",
}


def register(agent_name: str) -> Any:
    """Class decorator: rows whose ``agent_name`` is `agent_name` run this loop."""

    def add(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise TypeError(
                f"agent loop {agent_name!r} is not a subclass of jrl.agent.AgentLoopBase"
            )
        AGENT_LOOPS[agent_name] = cls
        return cls

    return add


def agent_loop_class(agent_name: str) -> type[AgentLoopBase]:
    """The class registered as `agent_name`."""
    found = AGENT_LOOPS.get(agent_name)
    if found is None:
        raise KeyError(
            f"no agent loop is registered as {agent_name!r} (known: {', '.join(AGENT_LOOPS)}); "
            f"register it with @jrl.agent.register or list it in {_CONFIG_KEY}"
        )
    if isinstance(found, str):
        found = AGENT_LOOPS[agent_name] = user_class(
            found, AgentLoopBase, f"agent loop {agent_name!r}"
        )
    return found


def register_from_file(path: str) -> list[str]:
    """The loops of verl's agent loop config file (``- name: n`` with ``_target_: a.b.Class``),
    registered; returns their names."""
    with open(path) as file:
        entries = yaml.safe_load(file) or []
    if not isinstance(entries, list):
        raise ValueError(f"{_CONFIG_KEY}={path!r}: the file needs a list of {{name, _target_}}")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not {"name", "_target_"} <= set(entry):
            raise ValueError(f"{_CONFIG_KEY}={path!r}: entry {i} needs name and _target_")
        AGENT_LOOPS[str(entry["name"])] = str(entry["_target_"])
        names.append(str(entry["name"]))
    return names
