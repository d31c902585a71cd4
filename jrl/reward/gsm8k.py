"""GSM8K rule reward (verl's): compare the final number of a response with the ground truth."""

from __future__ import annotations

import re

# Only the tail of a response is searched: the final answer sits at the end, and regexes over very
# long strings are slow.
CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer in the last 300 characters of `solution_str`, or None.

    strict: the last ``#### <number>``, with ',' and '$' removed. flexible: the last number-like
    match other than "" and "." (as verl, when every match is "." the first match is returned).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _FLEXIBLE.findall(tail)
    if not found:
        return None
    valid = [m for m in found if m not in ("", ".")]
    return valid[-1] if valid else found[0]


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` if the extracted answer equals `ground_truth` (as strings), else `format_score`;
    the int 0 when no answer is found (verl's value)."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
