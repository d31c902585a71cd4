"""MATH scorer: boxed-answer extraction, the MATH grader's normalisation, math-verify."""

import threading

import pytest

from jrl.reward.math import compute_score, has_math_verify, is_equiv, last_boxed, strip_string


def test_last_boxed_extraction():
    assert last_boxed("a \\boxed{1} b $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    matrix = "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"
    assert last_boxed("so \\boxed{" + matrix + "} done") == matrix
    assert last_boxed("\\boxed{{a}{b}}") == "{a}{b}"
    assert last_boxed("no answer here") is None
    assert last_boxed("unclosed \\boxed{1 + {2}") is None
    assert last_boxed("\\boxed5 without braces") is None
    # verl's grader finds an \fbox answer, then fails on its prefix: it scores 0
    assert last_boxed("framed \\fbox{7}.") is None
    assert compute_score("framed \\fbox{7}.", "7", use_math_verify=False) == 0.0
    assert last_boxed("\\fbox{1} then \\boxed{2}") == "2"
    # verl's spaced form wins whenever it occurs and runs to the next '$'.
    assert last_boxed("$\\boxed 5$ and later \\boxed{6}") == "5"


@pytest.mark.parametrize(
    "raw, canonical",
    [
        (" \\dfrac{1}{2} ", "\\frac{1}{2}"),
        ("\\tfrac34", "\\frac{3}{4}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\$5", "5"),
        ("10 \\text{ cm}", "10"),
        ("50\\%", "50"),
        (".5", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("k = 3", "3"),
        ("xyz = 3", "xyz=3"),
        ("2\\sqrt3", "2\\sqrt{3}"),
        ("3/4", "\\frac{3}{4}"),
        ("x/4", "x/4"),
        ("a\\\\b", "a\\b"),
        ("1\n0\\!0", "100"),
        ("{.5, .25}", "{0.5,0.25}"),
        ("", ""),
    ],
)
def test_strip_string(raw, canonical):
    assert strip_string(raw) == canonical


def test_unnormalisable_answers_compare_raw():
    for raw in ("1\\text{ m}\\text{ s}", "2\\frac", "\\sqrt"):
        with pytest.raises(ValueError):
            strip_string(raw)
        assert is_equiv(raw, raw)
    assert not is_equiv("1\\text{ m}\\text{ s}", "1")
    assert is_equiv(None, None) and not is_equiv("1", None)


def test_compute_score_string_match():
    assert compute_score("So $x = \\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}") == 1.0
    assert compute_score("\\boxed{0.5}", "\\frac12") == 1.0
    assert compute_score("\\boxed{10 \\text{ cm}}", "10", use_math_verify=False) == 1.0
    assert compute_score("\\boxed{42}", 42) == 1.0
    assert compute_score("\\boxed{41}", "42") == 0.0
    assert compute_score("the answer is 42", "42") == 0.0
    assert compute_score("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", use_math_verify=False) == 0.0


def test_math_verify_accepts_equivalent_forms():
    pytest.importorskip("math_verify", reason="math-verify is the optional `math` extra")
    assert has_math_verify()
    assert compute_score("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}") == 1.0
    assert compute_score("\\boxed{2+2}", "4", use_math_verify=True) == 1.0
    assert compute_score("\\boxed{\\frac{3}{4}}", "\\frac{1}{2}") == 0.0
    # Off the main thread math-verify has no signal-based timeout, and still works.
    scores = []
    thread = threading.Thread(
        target=lambda: scores.append(compute_score("\\boxed{(x+1)^2}", "x^2+2x+1"))
    )
    thread.start()
    thread.join()
    assert scores == [1.0]
