"""GSM8K to parquet in verl's schema, from the hub or generated offline.

    python -m jrl.data.gsm8k --local_dir ~/data/gsm8k            # openai/gsm8k from the hub
    python -m jrl.data.gsm8k --local_dir ~/data/gsm8k --offline  # generated, no network
    python -m jrl.data.gsm8k --local_dir ~/data/gsm8k --offline --generator gsm_symbolic

Offline generators:
- `arithmetic` (built in): short, easy word problems (add, take away, multiply, share, two steps).
- `one_step` (built in): the one-step kinds only (add, take away, multiply), asked for the bare
  answer (`ANSWER_ONLY`), with data_source "jrl/word_problems": scored by verl's GSM8K rule in
  its flexible mode (the last number of the response is the answer). SmolLM2-135M-Instruct
  answers about half of them right greedily before training and a quarter when sampling at
  temperature 0.7, so RL has signal and room (configs/word_problems_grpo.py).
- `gsm_symbolic`: GSM8K-style templated problems from the `reasoning-gym` package, installed by
  the `offline-data` extra.

With ``--agent tool``, the rows take the schema of verl's GSM8K tool-agent example: agent_name
"tool_agent", a system message asking the model to check its answer with the
``calc_gsm8k_reward`` tool, and extra_info's ``tools_kwargs`` (the tool's ground truth) and
``interaction_kwargs`` (query and ground truth, for the GSM8K interaction).

Each row: data_source "openai/gsm8k" (scored by verl's strict GSM8K rule: the last ``#### N``)
unless the generator says otherwise, prompt [{"role": "user", "content": question + " " +
instruction}] (`INSTRUCTION`, verl's, unless the generator says otherwise), ability "math",
reward_model {"style": "rule", "ground_truth"}, extra_info {"split", "index", "answer",
"question"}.
"""

from __future__ import annotations

import argparse
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jrl.data.splits import add_save_dir, load_hub_split, save_dir
from jrl.data.splits import write_splits as write_gsm8k

DATA_SOURCE = "openai/gsm8k"
WORD_PROBLEMS = "jrl/word_problems"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
ANSWER_ONLY = "Answer with the number only, after '#### '."
GENERATORS = ("arithmetic", "one_step", "gsm_symbolic")
AGENTS = ("tool",)
TOOL_AGENT_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
TOOL_AGENT_SYSTEM = (
    "You solve math word problems. Think step by step first. Before you give the final answer, "
    "check it at least once with the `calc_gsm8k_reward` tool, and correct it if the tool says "
    "it is wrong. Write the final answer as `#### <answer>`."
)
SPLIT_SIZES = {"train": 7473, "test": 1319}
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")

_NAMES = ("Tom", "Ana", "Ben", "Mia", "Sam", "Lily", "Max", "Zoe", "Leo", "Ivy")
_ITEMS = (
    "apples",
    "books",
    "pens",
    "cards",
    "eggs",
    "shells",
    "stamps",
    "cookies",
    "toys",
    "coins",
)


def ground_truth(solution: str) -> str:
    """The final answer of a GSM8K solution: the number after ``#### ``, commas removed."""
    match = _ANSWER.search(solution)
    if match is None:
        raise ValueError(f"solution has no '#### <number>' final answer: {solution[-200:]!r}")
    return match.group(1).replace(",", "")


def gsm8k_rows(
    records: Iterable[Mapping[str, str]],
    split: str,
    instruction: str = INSTRUCTION,
    data_source: str = DATA_SOURCE,
) -> list[dict[str, Any]]:
    """verl's GSM8K rows from raw ``{"question", "answer"}`` records (answer = worked solution),
    each question followed by `instruction`."""
    rows = []
    for index, record in enumerate(records):
        question, answer = record["question"], record["answer"]
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": question + " " + instruction}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(answer)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": question,
                },
            }
        )
    return rows


def tool_agent_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """GSM8K `rows` in the schema of verl's tool-agent example: agent_name "tool_agent", the
    system message, the question with `TOOL_AGENT_INSTRUCTION`, and extra_info's tools_kwargs
    (``calc_gsm8k_reward``'s create_kwargs: the ground truth) and interaction_kwargs."""
    out = []
    for row in rows:
        info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
        question = info["question"]
        prompt = question + " " + TOOL_AGENT_INSTRUCTION
        out.append(
            {
                **row,
                "agent_name": "tool_agent",
                "prompt": [
                    {"role": "system", "content": TOOL_AGENT_SYSTEM},
                    {"role": "user", "content": prompt},
                ],
                "extra_info": {
                    **info,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {
                        "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": truth}}
                    },
                    # verl's example: the query is the question with the instruction
                    "interaction_kwargs": {"query": prompt, "ground_truth": truth},
                },
            }
        )
    return out


# The problem kinds of `_problem`: the first three take one step.
_KINDS = ("add", "take away", "multiply", "share", "two steps")
_ONE_STEP_KINDS = 3


def _problem(rng: np.random.Generator, kinds: int = len(_KINDS)) -> dict[str, str]:
    """One short word problem of the first `kinds` of `_KINDS`, with its worked solution ending in
    ``#### N``."""
    name = str(rng.choice(_NAMES))
    item = str(rng.choice(_ITEMS))
    a, b = (int(x) for x in rng.integers(2, 10, size=2))
    kind = int(rng.integers(kinds))
    if kind == 0:
        question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
        work, result = f"{a} + {b} = {a + b}", a + b
    elif kind == 1:
        a += b
        question = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        work, result = f"{a} - {b} = {a - b}", a - b
    elif kind == 2:
        question = f"{name} buys {a} bags with {b} {item} each. How many {item} is that?"
        work, result = f"{a} * {b} = {a * b}", a * b
    elif kind == 3:
        question = (
            f"{name} shares {a * b} {item} equally among {a} friends. How many does each get?"
        )
        work, result = f"{a * b} / {a} = {b}", b
    else:
        c = int(rng.integers(1, a + b))
        question = f"{name} has {a} {item}, gets {b} more, then loses {c}. How many are left?"
        work, result = f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}", a + b - c
    return {"question": question, "answer": f"{work}.\n#### {result}"}


def make_offline_rows(
    n: int, seed: int, split: str, generator: str = "arithmetic"
) -> list[dict[str, Any]]:
    """`n` generated GSM8K-style rows for `split` from a built-in `generator` ('arithmetic' or
    'one_step'); the same arguments give the same rows."""
    if generator not in ("arithmetic", "one_step"):
        raise ValueError(f"built-in generators are 'arithmetic' and 'one_step', got {generator!r}")
    rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
    if generator == "arithmetic":
        return gsm8k_rows((_problem(rng) for _ in range(n)), split)
    records = (_problem(rng, _ONE_STEP_KINDS) for _ in range(n))
    return gsm8k_rows(records, split, instruction=ANSWER_ONLY, data_source=WORD_PROBLEMS)


def gsm_symbolic_records(n: int, seed: int, split: str) -> list[dict[str, str]]:
    """`n` GSM8K-style problems from reasoning-gym's `gsm_symbolic` generator (integer answers,
    no worked solutions: the answer is written as ``#### N``)."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            "--generator gsm_symbolic needs the `reasoning-gym` package: "
            "`pip install jrl[offline-data]`; or use --generator arithmetic"
        ) from err
    split_seed = int(np.random.default_rng([seed, zlib.crc32(split.encode())]).integers(2**31))
    data = reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=split_seed)
    return [{"question": e["question"], "answer": f"#### {e['answer']}"} for e in data]


def load_hub_records(split: str, size: int | None) -> list[dict[str, str]]:
    """The raw records of openai/gsm8k ("main") for `split` (the first `size` if given)."""
    records = load_hub_split(DATA_SOURCE, split, size, name="main")
    return [{"question": r["question"], "answer": r["answer"]} for r in records]


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Command line: write train.parquet and test.parquet under --local_save_dir (or
    --local_dir)."""
    parser = argparse.ArgumentParser(
        prog="python -m jrl.data.gsm8k", description=__doc__.split("\n")[0]
    )
    add_save_dir(parser, "~/data/gsm8k")
    parser.add_argument(
        "--offline", action="store_true", help="generate problems instead (no network)"
    )
    parser.add_argument(
        "--generator",
        choices=GENERATORS,
        default="arithmetic",
        help="offline generator: built-in easy arithmetic or one-step problems, or "
        "reasoning-gym's gsm_symbolic",
    )
    parser.add_argument("--train_size", type=int, default=None, help="rows in train.parquet")
    parser.add_argument("--test_size", type=int, default=None, help="rows in test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="seed of the offline generator")
    parser.add_argument(
        "--agent",
        choices=AGENTS,
        default=None,
        help="rows for an agent loop: 'tool' gives verl's GSM8K tool-agent schema",
    )
    args = parser.parse_args(argv)
    sizes = {"train": args.train_size, "test": args.test_size}
    rows_by_split = {}
    for split, size in sizes.items():
        if args.offline:
            count = SPLIT_SIZES[split] if size is None else size
            print(
                f"jrl: generating {count} {split} problems ({args.generator}, seed {args.seed})",
                flush=True,
            )
            if args.generator != "gsm_symbolic":
                rows_by_split[split] = make_offline_rows(count, args.seed, split, args.generator)
            else:
                records = gsm_symbolic_records(count, args.seed, split)
                rows_by_split[split] = gsm8k_rows(records, split)
        else:
            print(f"jrl: loading {DATA_SOURCE} ({split}) from the Hugging Face hub", flush=True)
            rows_by_split[split] = gsm8k_rows(load_hub_records(split, size), split)
        if args.agent == "tool":
            rows_by_split[split] = tool_agent_rows(rows_by_split[split])
    return write_gsm8k(save_dir(args), rows_by_split)


if __name__ == "__main__":
    main()
