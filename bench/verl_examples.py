"""How many of verl v0.6.0's own example command lines jrl's config loader accepts.

Reads ``tests/data/verl_v060_examples.json`` (each PPO-family and SFT example script of verl
v0.6.0 with the argument vector it passes to ``verl.trainer.main_ppo`` or
``verl.trainer.fsdp_sft_trainer``) and loads each in-process as jrl's entry points would:
``ppo`` entries with ``--config=configs/gsm8k_ppo.py`` before them (`jrl.runspec.load_config`,
as ``jrl.train``), ``sft`` entries with ``--config=configs/gsm8k_sft.py`` (`load_entry_config`
with the SFT defaults and checks, as ``jrl.sft``). Nothing is built or trained.

Prints one JSON line per failure reason (the error's first problem with keys, values and numbers
normalised; the keys behind it listed), then ``{"entry": ..., "loaded": N, "total": M}`` for each
entry kind. ``--verbose`` also prints each script's outcome. Run from the repository root::

    python bench/verl_examples.py
    python bench/verl_examples.py --fixture tests/data/verl_current_examples.json  # current verl's
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jrl.config.entry import load_entry_config
from jrl.config.trees import SFT
from jrl.runspec import load_config, validate_sft

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "verl_v060_examples.json"
CARDS = {"ppo": "configs/gsm8k_ppo.py", "sft": "configs/gsm8k_sft.py"}

_HYDRA_ARG = re.compile(r"cannot read argument '--config-(path|name)")
_BAD_ARG = re.compile(r"cannot read argument ('.*?'): expected")
_QUOTED_KEY = re.compile(r"'([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)'")
_KEY = re.compile(r"\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+\b")
_KEY_VALUE = re.compile(r"<key>=('[^']*'|\[[^\]]*\]|\S+?)(?=[:\s]|$)")
_QUOTED = re.compile(r"'[^']*'")
_NUMBER = re.compile(r"\b\d+\b")


def load(entry: str, argv: Sequence[str]) -> None:
    """Loads and checks one command line the way jrl's `entry` program does."""
    args = [f"--config={CARDS[entry]}", *argv]
    if entry == "ppo":
        load_config(args)
    else:
        load_entry_config(args, SFT, validate_sft)


def first_problem(err: BaseException) -> str:
    """The error's first line; for a list of problems, the first problem."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
    if lines[0].endswith(":") and len(lines) > 1:
        return lines[1].removeprefix("- ")
    return lines[0] or type(err).__name__


def reason(problem: str) -> tuple[str, list[str]]:
    """A short reason for `problem`, with keys, values and numbers normalised, and its keys."""
    if _HYDRA_ARG.search(problem):
        return "hydra --config-path/--config-name", []
    if bad := _BAD_ARG.search(problem):
        return "cannot read argument <value>", [bad.group(1)]
    text = problem.split(";")[0]
    keys = _QUOTED_KEY.findall(text)
    text = _QUOTED_KEY.sub("<key>", text)
    keys += _KEY.findall(_QUOTED.sub("", text))
    text = _KEY_VALUE.sub("<key>=<value>", _KEY.sub("<key>", text))
    return _NUMBER.sub("<n>", _QUOTED.sub("<value>", text)), keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--verbose", action="store_true", help="print each script's outcome")
    args = parser.parse_args()

    entries: list[dict[str, Any]] = json.loads(args.fixture.read_text())
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    reasons: dict[tuple[str, str], dict[str, Any]] = {}
    for item in entries:
        entry = item["entry"]
        totals[entry][1] += 1
        try:
            load(entry, item["argv"])
        except Exception as err:  # noqa: BLE001 - every failure is a result to report
            problem = first_problem(err)
            short, keys = reason(problem)
            slot = reasons.setdefault(
                (entry, short), {"count": 0, "keys": set(), "example": problem}
            )
            slot["count"] += 1
            slot["keys"].update(keys)
            outcome = problem
        else:
            totals[entry][0] += 1
            outcome = "loaded"
        if args.verbose:
            print(json.dumps({"script": item["script"], "entry": entry, "outcome": outcome}))

    ranked = sorted(reasons.items(), key=lambda kv: (kv[0][0], -kv[1]["count"], kv[0][1]))
    for (entry, short), slot in ranked:
        line = {"entry": entry, "reason": short, "count": slot["count"]}
        print(json.dumps(line | {"keys": sorted(slot["keys"]), "example": slot["example"]}))
    for entry in sorted(totals):
        loaded, total = totals[entry]
        print(json.dumps({"entry": entry, "loaded": loaded, "total": total}))


if __name__ == "__main__":
    main()
