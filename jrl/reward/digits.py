"""Rule reward of the digits task (`jrl.data.digits`): is the answer's first token right?"""

from __future__ import annotations


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the first non-space character of `solution_str` (the task's first answer token)
    equals `ground_truth`, else 0.0 (also for an empty answer); the rest is ignored."""
    answer = solution_str.lstrip()
    return 1.0 if answer[:1] == str(ground_truth) else 0.0
