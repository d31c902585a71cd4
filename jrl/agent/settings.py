"""`AgentSettings`: what the agent loops read of a run (verl's ``rollout.multi_turn.*`` and
``rollout.agent.*``), resolved once by `jrl.runspec.rollout` (no JAX here)."""

from __future__ import annotations

import dataclasses

from jrl.agent.parser import TOOL_CALL_FORMATS
from jrl.config.errors import check_settings

TRUNCATE_SIDES = ("left", "right", "middle")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")


TRACE_BACKENDS = ("mlflow",)
SCHEDULINGS = ("rounds", "slots")


@dataclasses.dataclass(frozen=True)
class TraceSettings:
    """verl's ``rollout.trace.*``: each traced trajectory becomes a trace of `backend` (None:
    none), with its model turns, tool calls and whole run as spans; `token2text` adds their
    decoded text; `max_samples_per_step_per_worker` traces the rollouts of that many randomly
    chosen prompts per call (None: all)."""

    backend: str | None = None
    token2text: bool = False
    max_samples_per_step_per_worker: int | None = None

    def __post_init__(self) -> None:
        limit = self.max_samples_per_step_per_worker
        rules = {
            "backend": (
                self.backend is None or self.backend in TRACE_BACKENDS,
                f"must be one of {', '.join(TRACE_BACKENDS)} or null (jrl writes rollout traces "
                "to mlflow: a local store, or $MLFLOW_TRACKING_URI)",
            ),
            "max_samples_per_step_per_worker": (
                limit is None or limit >= 1,
                "must be at least 1, or null for every sample",
            ),
        }
        check_settings(self, rules)


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """Rows run the loop their ``agent_name`` names, else `default_agent_loop`; loops listed in
    `agent_loop_config_path` are registered first. The tool loop stops after
    `max_assistant_turns` model turns or `max_user_turns` tool and user turns (None: no limit
    but the response length), runs at most `max_parallel_calls` calls of a turn, cuts a tool's
    answer to `max_tool_response_length` characters on `tool_response_truncate_side`, and
    waits `tool_timeout` seconds for a tool or interaction call; `num_workers` calls run at
    once. Tool calls are read in `format`; `tokenization_sanity_check_mode` compares the
    turn-by-turn ids with the whole conversation tokenised at once. `scheduling` (jrl's own)
    says how the turns after the first meet the engine: ``rounds``, one engine call per round,
    once every row waits, or with `row_groups` > 1 per group of rows, the groups taking turns
    (while one group's turns decode, the other groups' tools run); ``slots``, each as soon as
    it is asked, into the running batch of an engine whose slots live across turns (the JAX
    sampler; other engines take rounds). Which is faster depends on the tools' times against a
    turn's decode (bench/README.md, multi_turn.py)."""

    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None
    num_workers: int = 8
    scheduling: str = "rounds"
    row_groups: int = 1
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_config_path: str | None = None
    function_tool_path: str | None = None
    interaction_config_path: str | None = None
    tokenization_sanity_check_mode: str = "strict"
    format: str = "hermes"
    tool_timeout: float = 60.0
    trace: TraceSettings = TraceSettings()

    def __post_init__(self) -> None:
        def positive_or_none(value: int | None) -> bool:
            return value is None or value >= 1

        rules = {
            "num_workers": (self.num_workers >= 1, "must be at least 1"),
            "scheduling": (
                self.scheduling in SCHEDULINGS,
                f"must be one of {', '.join(SCHEDULINGS)}",
            ),
            "row_groups": (
                self.row_groups == 1 or (self.row_groups > 1 and self.scheduling == "rounds"),
                "must be at least 1, and more only with rollout.agent.scheduling=rounds (groups "
                "take rounds in turn; slots admit every turn as soon as it is asked)",
            ),
            "max_assistant_turns": (positive_or_none(self.max_assistant_turns), "must be >= 1"),
            "max_user_turns": (positive_or_none(self.max_user_turns), "must be >= 1"),
            "max_parallel_calls": (self.max_parallel_calls >= 1, "must be at least 1"),
            "max_tool_response_length": (self.max_tool_response_length >= 1, "must be >= 1"),
            "tool_response_truncate_side": (
                self.tool_response_truncate_side in TRUNCATE_SIDES,
                f"must be one of {', '.join(TRUNCATE_SIDES)}",
            ),
            "tokenization_sanity_check_mode": (
                self.tokenization_sanity_check_mode in SANITY_CHECK_MODES,
                f"must be one of {', '.join(SANITY_CHECK_MODES)}",
            ),
            "format": (
                self.format in TOOL_CALL_FORMATS,
                f"must be one of {', '.join(TOOL_CALL_FORMATS)} (the formats jrl reads)",
            ),
            "tool_timeout": (self.tool_timeout > 0, "must be positive (seconds)"),
        }
        check_settings(self, rules)
