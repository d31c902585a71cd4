"""The agent loops' own metrics of a batch of trajectories: tool calls per row, tool errors and
timeouts, tool latency, and the fraction of rows that stopped at a turn or length limit. (Turns
per row are verl's ``num_turns/*``, among the step's data metrics: `jrl.trainer.io.metrics`.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jrl.agent.loop import AgentLoopOutput

# Per-trajectory counters the tool loop keeps in `AgentLoopOutput.metrics`, summed per batch.
COUNTERS = (
    "tool_calls",
    "tool_errors",
    "tool_timeouts",
    "tool_parse_errors",
    "tool_truncated",
    "interaction_errors",
    "tokenization_mismatch",
)


def agent_metrics(outputs: Sequence[AgentLoopOutput], response_length: int) -> dict[str, float]:
    metrics = {
        "agent/length_limit_ratio": float(
            np.mean([len(o.response_ids) >= response_length for o in outputs])
        ),
        "agent/turn_limit_ratio": float(np.mean([o.metrics.get("turn_limit", 0) for o in outputs])),
    }
    for name in COUNTERS:
        counts = np.asarray([o.metrics.get(name, 0) for o in outputs], np.float64)
        metrics[f"agent/{name}"] = float(counts.sum())
    calls = metrics["agent/tool_calls"]
    metrics["agent/tool_calls_per_row"] = calls / len(outputs)
    if calls:
        seconds = sum(o.metrics.get("tool_seconds", 0.0) for o in outputs)
        metrics["agent/tool_latency_s/mean"] = seconds / calls
    return metrics
