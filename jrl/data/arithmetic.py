"""Two-digit arithmetic with a calculator tool: SmolLM2-135M-Instruct gets few of these right on
its own (3% of additions and multiplications greedily), and none of its answers call the tool.

`make_rows` writes RL rows for the tool agent; `sft_traces` writes conversations for a warm-up
with ``jrl.sft`` (``data.multiturn.enable``): the question, the calculator call (Hermes format),
the tool's answer and ``#### <answer>``.

Each RL row: data_source "jrl/arithmetic" (`jrl.reward.arithmetic`), agent_name "tool_agent",
prompt [{"role": "user", "content": "What is 41 * 90? " + INSTRUCTION}], reward_model
{"style": "rule", "ground_truth": "3690"}, extra_info {"split", "index", "question"}.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

DATA_SOURCE = "jrl/arithmetic"
INSTRUCTION = "Answer with the number only, after '#### '."
OPERATIONS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}


def _problems(n: int, seed: int, split: str) -> list[tuple[str, int]]:
    """`n` (expression, value) pairs: two-digit operands, additions and multiplications in
    turn; the same arguments give the same problems."""
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    problems = []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        op = "+*"[i % 2]
        problems.append((f"{a} {op} {b}", OPERATIONS[op](a, b)))
    return problems


def make_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`n` RL rows of `split` for the tool agent."""
    return [
        {
            "data_source": DATA_SOURCE,
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": f"What is {expr}? {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"split": split, "index": i, "question": f"What is {expr}?"},
        }
        for i, (expr, value) in enumerate(_problems(n, seed, split))
    ]


def sft_traces(n: int, seed: int, system: str | None) -> list[dict[str, Any]]:
    """`n` conversations in which the assistant calls the calculator and answers with its
    result, under the `system` message (the tools' listing the agent loop shows; None: no
    system message)."""
    rows = []
    for expr, value in _problems(n, seed, "sft"):
        call = json.dumps({"name": "calculator", "arguments": {"expression": expr}})
        head = [] if system is None else [{"role": "system", "content": system}]
        rows.append(
            {
                "messages": [
                    *head,
                    {"role": "user", "content": f"What is {expr}? {INSTRUCTION}"},
                    {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                    {"role": "tool", "content": str(value)},
                    {"role": "assistant", "content": f"#### {value}"},
                ]
            }
        )
    return rows
