"""`default_compute_score`: the built-in rule reward for each verl data source."""

from __future__ import annotations

from functools import partial
from typing import Any

from jrl.reward import arithmetic, digits, gsm8k, lookup, math

_SCORERS = {
    "openai/gsm8k": gsm8k.compute_score,
    "lighteval/MATH": math.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math.compute_score,
    "HuggingFaceH4/MATH-500": math.compute_score,
    "jrl/digits": digits.compute_score,
    "jrl/lookup": lookup.compute_score,
    "jrl/arithmetic": arithmetic.compute_score,
    "jrl/word_problems": partial(gsm8k.compute_score, method="flexible"),
}

# Data sources verl scores with rules that jrl does not ship yet.
_NOT_BUILT_IN = (
    "math_dapo",
    "math",
    "math_dapo_reasoning",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
    "codecontests",
    "apps",
    "codeforces",
    "taco",
    "hiyouga/geometry3k",
)
_NOT_BUILT_IN_PREFIXES = ("aime", "searchR1_")


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """The rule score of `solution_str` for `data_source`: a float, or a dict with a "score" key.

    openai/gsm8k uses the GSM8K scorer; lighteval/MATH, DigitalLearningGmbH/MATH-lighteval and
    HuggingFaceH4/MATH-500 the boxed-answer MATH scorer; jrl/digits (`jrl.data.digits`) the
    first-word match of the digits task; jrl/lookup (`jrl.data.lookup`) the answer after the
    lookup tool's; jrl/arithmetic (`jrl.data.arithmetic`) the last number; jrl/word_problems
    (`jrl.data.gsm8k`'s one_step problems) the GSM8K scorer in its flexible mode (the last
    number). Other sources raise
    NotImplementedError; score them with custom_reward_function.path / custom_reward_function.name.
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        known = data_source in _NOT_BUILT_IN or data_source.startswith(_NOT_BUILT_IN_PREFIXES)
        raise NotImplementedError(
            f"no built-in reward for data_source={data_source!r}"
            + (" (verl has one; jrl does not ship it yet)" if known else "")
            + f"; built in: {', '.join(_SCORERS)}. Point custom_reward_function.path (and "
            "custom_reward_function.name) at a Python file with a "
            "compute_score(data_source, solution_str, ground_truth, extra_info) function"
        )
    result = scorer(solution_str, ground_truth)
    return result if isinstance(result, dict) else float(result)
