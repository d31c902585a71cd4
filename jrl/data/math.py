r"""MATH to parquet in verl's schema, from the hub or from a small built-in set of problems.

    python -m jrl.data.math --local_dir ~/data/math            # DigitalLearningGmbH/MATH-lighteval
    python -m jrl.data.math --local_dir ~/data/math --offline  # built-in problems, no network

Each row: data_source "DigitalLearningGmbH/MATH-lighteval", prompt [{"role": "user", "content":
problem + " " + INSTRUCTION}], ability "math", reward_model {"style": "rule", "ground_truth": the
last \boxed{...} of the solution}, extra_info {"split", "index"}.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jrl.data.boxed import last_boxed
from jrl.data.splits import add_save_dir, load_hub_split, save_dir, write_splits

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

# MATH-style problems with worked solutions, for offline runs and tests: (problem, solution).
OFFLINE_PROBLEMS = (
    (
        "What is $\\frac{1}{2} + \\frac{1}{3}$?",
        "Over a common denominator, $\\frac{3}{6} + \\frac{2}{6} = \\boxed{\\frac{5}{6}}$.",
    ),
    (
        "Simplify $\\sqrt{50}$.",
        "$\\sqrt{50} = \\sqrt{25 \\cdot 2} = \\boxed{5\\sqrt{2}}$.",
    ),
    (
        "Solve for $x$: $2x + 3 = 11$.",
        "Subtracting 3 gives $2x = 8$, so $x = \\boxed{4}$.",
    ),
    (
        "What is the greatest common divisor of 84 and 126?",
        "$84 = 2^2 \\cdot 3 \\cdot 7$ and $126 = 2 \\cdot 3^2 \\cdot 7$, so the gcd is "
        "$2 \\cdot 3 \\cdot 7 = \\boxed{42}$.",
    ),
    (
        "Compute $\\dbinom{6}{2}$.",
        "$\\dbinom{6}{2} = \\frac{6 \\cdot 5}{2} = \\boxed{15}$.",
    ),
    (
        "Find the sum of the roots of $x^2 - 5x + 6 = 0$.",
        "By Vieta's formulas the roots sum to $\\boxed{5}$.",
    ),
    (
        "Express $0.\\overline{3}$ as a common fraction.",
        "If $x = 0.\\overline{3}$ then $10x - x = 3$, so $x = \\boxed{\\frac{1}{3}}$.",
    ),
    (
        "How many positive divisors does 36 have?",
        "$36 = 2^2 \\cdot 3^2$ has $(2+1)(2+1) = \\boxed{9}$ divisors.",
    ),
    (
        "What is the area of a circle of radius 3?",
        "The area is $\\pi r^2 = \\boxed{9\\pi}$.",
    ),
    (
        "Find $x$ if $\\log_2 x = 5$.",
        "$x = 2^5 = \\boxed{32}$.",
    ),
    (
        "For which $x$ is $x^2 < 4$? Give your answer in interval notation.",
        "$x^2 < 4$ exactly when $|x| < 2$, that is $x \\in \\boxed{(-2,2)}$.",
    ),
    (
        "Compute $\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix} + \\begin{pmatrix} 3 \\\\ 4 "
        "\\end{pmatrix}$.",
        "Adding entrywise gives $\\boxed{\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}}$.",
    ),
    (
        "What is $\\frac{2}{3}$ of 27?",
        "$\\frac{2}{3} \\cdot 27 = \\boxed{18}$.",
    ),
    (
        "Find the least common multiple of 4 and 6.",
        "The multiples of 6 are 6, 12, ...; the first divisible by 4 is $\\boxed{12}$.",
    ),
    (
        "Evaluate $|{-7}| + |3|$.",
        "$7 + 3 = \\boxed{10}$.",
    ),
    (
        "What is $3^4$?",
        "$3^4 = 9 \\cdot 9 = \\boxed{81}$.",
    ),
)
OFFLINE_TEST_SIZE = 4


def ground_truth(solution: str) -> str:
    r"""The answer of a MATH solution: the content of its last ``\boxed{...}``."""
    answer = last_boxed(solution)
    if answer is None:
        raise ValueError(f"solution has no \\boxed{{...}} answer: {solution[-200:]!r}")
    return answer


def math_rows(records: Iterable[Mapping[str, Any]], split: str) -> list[dict[str, Any]]:
    """verl's MATH rows from raw ``{"problem", "solution", ...}`` records; a record's other
    columns (MATH-lighteval's ``level`` and ``type``) stay, as verl's ``datasets.map`` keeps
    them."""
    rows = []
    for index, record in enumerate(records):
        try:
            truth = ground_truth(record["solution"])
        except ValueError as err:
            raise ValueError(f"{split} record {index}: {err}") from err
        kept = {key: value for key, value in record.items() if key not in ("problem", "solution")}
        rows.append(
            {
                **kept,
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": record["problem"] + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def offline_records(split: str) -> list[dict[str, str]]:
    """The built-in problems of `split`: the last OFFLINE_TEST_SIZE are the test split."""
    cut = len(OFFLINE_PROBLEMS) - OFFLINE_TEST_SIZE
    chosen = OFFLINE_PROBLEMS[:cut] if split == "train" else OFFLINE_PROBLEMS[cut:]
    return [{"problem": p, "solution": s} for p, s in chosen]


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Command line: write train.parquet and test.parquet under --local_save_dir (or
    --local_dir)."""
    parser = argparse.ArgumentParser(
        prog="python -m jrl.data.math", description=__doc__.split("\n")[0]
    )
    add_save_dir(parser, "~/data/math")
    parser.add_argument(
        "--offline", action="store_true", help="use the built-in problems (no network)"
    )
    parser.add_argument("--train_size", type=int, default=None, help="at most this many rows")
    parser.add_argument("--test_size", type=int, default=None, help="at most this many rows")
    args = parser.parse_args(argv)
    rows_by_split = {}
    for split, size in {"train": args.train_size, "test": args.test_size}.items():
        if args.offline:
            records = offline_records(split)[:size]
        else:
            print(f"jrl: loading {DATA_SOURCE} ({split}) from the Hugging Face hub", flush=True)
            records = load_hub_split(DATA_SOURCE, split, size)
        rows_by_split[split] = math_rows(records, split)
    return write_splits(save_dir(args), rows_by_split)


if __name__ == "__main__":
    main()
