"""verl's ``rollout.multi_turn.*`` and ``rollout.agent.*`` keys, read once into `AgentSettings`
(None: the run generates one turn per row, without agent loops)."""

from __future__ import annotations

from typing import Any

from jrl.agent.settings import AgentSettings, TraceSettings
from jrl.config.errors import ConfigError, SettingsError

_ROLLOUT = "actor_rollout_ref.rollout"
# AgentSettings' fields read from ``multi_turn`` and from ``agent``, by their keys' names.
_MULTI_TURN = (
    "max_assistant_turns",
    "max_user_turns",
    "max_parallel_calls",
    "max_tool_response_length",
    "tool_response_truncate_side",
    "tool_config_path",
    "function_tool_path",
    "interaction_config_path",
    "tokenization_sanity_check_mode",
    "format",
    "tool_timeout",
)
_TRACE = ("backend", "token2text", "max_samples_per_step_per_worker")
_AGENT = (
    "default_agent_loop",
    "agent_loop_config_path",
    "num_workers",
    "scheduling",
    "row_groups",
)
OFF = (
    f"{_ROLLOUT}.multi_turn.enable is False and the rows' default loop is single_turn_agent: "
    "one turn per row, no agent loops"
)


def uses_agent_loops(rollout: Any, read: bool = True) -> bool:
    """Whether the run's rows go through agent loops: ``multi_turn.enable``, a default loop
    other than single_turn_agent, or loops of the user's (``agent.agent_loop_config_path``).
    `rollout` is the rollout section's view; without `read` the keys are only peeked."""
    get = rollout.get if read else rollout.peek
    return bool(
        get("multi_turn.enable")
        or get("agent.default_agent_loop") != "single_turn_agent"
        or get("agent.agent_loop_config_path")
    )


def agent_settings(view: Any) -> AgentSettings | None:
    """The `AgentSettings` of the config `view` (a `KeyReads`), or None (the keys skipped)."""
    rollout = view.actor_rollout_ref.rollout
    if not rollout.resolve("agent", uses_agent_loops, rollout):
        rollout.skip(("multi_turn", "agent", "trace"), OFF, given_only=True)
        return None
    rollout.skip(
        ("multi_turn.use_inference_chat_template", "multi_turn.num_repeat_rollouts"),
        "jrl's agent loops keep the model's sampled tokens across turns and repeat rows by "
        "rollout.n (these are sglang's)",
    )
    rollout.skip("agent.custom_async_server", "jrl's agent loops drive jrl's engines in-process")
    values = {key: rollout.multi_turn[key] for key in _MULTI_TURN}
    values.update({key: rollout.agent[key] for key in _AGENT})
    for key in ("max_assistant_turns", "max_user_turns"):  # verl: 0 (falsy) sets no limit
        values[key] = values[key] or None
    given = {key: value for key, value in values.items() if value is not None}
    try:
        trace = TraceSettings(**{key: rollout.trace[key] for key in _TRACE})
        return AgentSettings(**given, trace=trace)
    except SettingsError as err:
        sections = {key: "multi_turn" for key in _MULTI_TURN} | {key: "agent" for key in _AGENT}
        sections |= {key: "trace" for key in _TRACE}
        raise ConfigError(
            "\n".join(
                f"{_ROLLOUT}.{sections[field]}.{field}={value!r} {rule}"
                for field, value, rule in err.problems
            )
        ) from None
