"""Rule reward of the arithmetic task (`jrl.data.arithmetic`): the last number of the response
(verl's GSM8K rule, flexible mode) against the value; "called" marks a response that called a
tool."""

from __future__ import annotations

from jrl.reward import gsm8k


def compute_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    """``{"score", "acc", "called"}``: score = acc = 1.0 for the right value."""
    right = float(gsm8k.compute_score(solution_str, ground_truth, method="flexible") > 0)
    return {"score": right, "acc": right, "called": float("<tool_call>" in solution_str)}
