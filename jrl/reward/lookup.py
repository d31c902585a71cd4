"""Rule reward of the lookup task (`jrl.data.lookup`): the digit the model writes after the
tool's answer.

A rollout in the task's format reads (special tokens skipped) as the call, ``@`` and the tool's
digit, then the model's answer: ``<tool_call>...</tool_call>@77``. Score 1.0 when the answer's
first character is the secret; 0.1 for a rollout in that format with a wrong answer (a format
reward, so that calling is rewarded before answering is learnt); 0.0 for anything else. "acc"
is 1.0 for a right answer only; "called" marks the format.
"""

from __future__ import annotations

from jrl.data.lookup_tokens import CALL, TOOL_MARK

CALL_REWARD = 0.1


def compute_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """``{"score", "acc", "called"}`` of one response."""
    opening = CALL + TOOL_MARK
    called = solution_str.startswith(opening)
    answer = solution_str[len(opening) + 1 :] if called else ""
    right = called and answer[:1] == str(ground_truth)
    score = 1.0 if right else CALL_REWARD if called else 0.0
    return {"score": score, "acc": float(right), "called": float(called)}
