r"""The final answer of a MATH-style solution: the last ``\boxed{...}`` (used to build the ground
truth of MATH rows and by the MATH reward to read a response's answer)."""

from __future__ import annotations

_SPACED_BOXED = "\\boxed "


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` in `text` (nested braces balanced), or None.

    As verl's grader: the spaced form ``\boxed 5`` wins whenever it occurs (its answer runs to
    the next ``$``); an answer only in ``\fbox{...}`` gives None (verl's grader finds it, then
    fails on its prefix and scores 0). An unclosed brace gives None.
    """
    if _SPACED_BOXED in text:
        return text.split(_SPACED_BOXED)[-1].split("$")[0]
    command = "\\boxed"
    start = text.rfind(command)
    if start < 0:
        return None
    opening = start + len(command)
    if text[opening : opening + 1] != "{":
        return None
    depth = 0
    for i in range(opening, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1 : i]
    return None
