r"""MATH rule reward (verl's ``math_reward``): the last ``\boxed{}`` answer against the truth.

An answer is right when it equals the ground truth after the MATH grader's string normalisation
(`strip_string`: spaces, ``\left``/``\right``, degrees, ``\$``, right-hand ``\text{ unit}``,
``\%``, ``\dfrac``/``\tfrac`` -> ``\frac``, ``\frac12`` -> ``\frac{1}{2}``, ``\sqrt2`` ->
``\sqrt{2}``, ``0.5`` -> ``\frac{1}{2}``, ``a/b`` -> ``\frac{a}{b}``, a short ``k =`` prefix
dropped, ...). When the `math-verify` package is installed (``pip install jrl[math]``), answers
whose strings differ are also compared symbolically by it.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Callable

from jrl.data.boxed import last_boxed

_DELETE_FIRST = ("\n", "\\!")
_DELETE_MARKUP = ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$")
_DELETE_PERCENT = ("\\\\%", "\\%")
_MATH_VERIFY_TIMEOUT_S = 5


def _rewrite_arguments(s: str, command: str, rewrite: Callable[[str], str | None]) -> str:
    """`s` with the text after each `command` replaced by `rewrite(text)`, or `s` unchanged when
    `rewrite` gives None for one; a `command` with nothing after it raises ValueError."""
    head, *tails = s.split(command)
    parts = [head]
    for tail in tails:
        if not tail:
            raise ValueError(f"{command} without an argument")
        rewritten = rewrite(tail)
        if rewritten is None:
            return s
        parts.append(command + rewritten)
    return "".join(parts)


def _frac_arguments(tail: str) -> str | None:
    r"""``12`` -> ``{1}{2}``, ``1{2}`` -> ``{1}{2}``; braced ones unchanged; None: one character."""
    if tail[0] == "{":
        return tail
    if len(tail) < 2:
        return None
    numerator, second, rest = tail[0], tail[1], tail[2:]
    return "{" + numerator + "}" + (second + rest if second == "{" else "{" + second + "}" + rest)


def _fix_fracs(s: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{2}`` -> ``\frac{1}{2}``; braced ones unchanged
    (a lone ``\frac1`` leaves `s` as it is)."""
    return _rewrite_arguments(s, "\\frac", _frac_arguments)


def _sqrt_argument(tail: str) -> str:
    return tail if tail[0] == "{" else "{" + tail[0] + "}" + tail[1:]


def _fix_sqrt(s: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}`` (one character is taken as the radicand)."""
    return _rewrite_arguments(s, "\\sqrt", _sqrt_argument)


def _fix_slash(s: str) -> str:
    r"""``3/4`` -> ``\frac{3}{4}`` for plain integers; anything else unchanged."""
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _drop_right_units(s: str) -> str:
    r"""Everything before ``\text{ `` (a unit on the right); several such units are ambiguous."""
    if "\\text{ " not in s:
        return s
    pieces = s.split("\\text{ ")
    if len(pieces) != 2:
        raise ValueError("more than one \\text{ } unit")
    return pieces[0]


def _delete(s: str, needles: tuple[str, ...]) -> str:
    for needle in needles:
        s = s.replace(needle, "")
    return s


def strip_string(answer: str) -> str:
    """The MATH grader's canonical form of `answer`; ValueError when it cannot be normalised."""
    s = _delete(answer, _DELETE_FIRST).replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = _drop_right_units(_delete(s, _DELETE_MARKUP))
    s = _delete(s, _DELETE_PERCENT).replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_fracs(_fix_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    """Whether two answers match after `strip_string` (compared raw if either cannot be
    normalised); two missing answers match."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except ValueError:
        return a == b


@functools.cache
def has_math_verify() -> bool:
    """Whether the optional `math-verify` package is installed."""
    return importlib.util.find_spec("math_verify") is not None


def math_verify_equal(answer: str, ground_truth: str) -> bool:
    r"""math-verify's symbolic verdict on ``\boxed{answer}`` against ``\boxed{ground_truth}``.

    Its signal-based timeouts work only on the main thread; elsewhere it runs without one.
    """
    from math_verify import parse, verify

    on_main = threading.current_thread() is threading.main_thread()
    limit = _MATH_VERIFY_TIMEOUT_S if on_main else None
    gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=limit)
    guess = parse("\\boxed{" + answer + "}", parsing_timeout=limit)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=limit))


def compute_score(
    solution_str: str, ground_truth: str, use_math_verify: bool | None = None
) -> float:
    r"""1.0 if the last ``\boxed{}`` answer of `solution_str` equals `ground_truth`, else 0.0.

    `use_math_verify`: also accept answers math-verify finds equivalent (None: when installed).
    """
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    if is_equiv(answer, truth):
        return 1.0
    if use_math_verify is None:
        use_math_verify = has_math_verify()
    return float(use_math_verify and math_verify_equal(answer, truth))
