"""The benches' GPU goals, checked against the JSON lines of a `bench/gpu_check.sh` run.

    python bench/goals.py outputs/gpu_check   # one line per goal: met, not met, not measured
    python bench/goals.py --table             # the goals as a Markdown table

`GOALS` is the goals' one home: bench/README.md's "Goals" table is `--table`'s output, and
tests/test_gpu_check.py checks that the two agree. A goal reads the figure `fields` (the first
one present) of the lines of `<bench>.jsonl` in the results folder whose fields equal `match`;
where several lines match (one per problem size) the worst figure counts. A line with a
`skipped`, `error` or `failed` field, agreeing with `match` on the fields it has, says why a
figure is missing. Unmet goals are reported, never an error: the exit status is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import operator
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Comparison of a measured figure with its target; the worst of several figures is the min for
# a lower bound and the max for an upper one.
OPS: dict[str, tuple[Callable[[float, float], bool], Callable[..., float]]] = {
    ">=": (operator.ge, min),
    "<=": (operator.le, max),
    "<": (operator.lt, max),
}
REASONS = ("skipped", "error", "failed")
# Fields of the matched lines that say what was measured, shown beside the figure.
CONTEXT = ("shape", "rows", "dim")


@dataclasses.dataclass(frozen=True)
class Goal:
    """`what` in words: the figure `fields` of the `bench` lines matching `match`, held to
    `op` `target` (a target of None: reported, no goal), set by `source`."""

    what: str
    bench: str
    match: Mapping[str, Any]
    fields: tuple[str, ...]
    op: str
    target: float | None
    source: str


GOALS = (
    Goal(
        "train step tokens/s, jrl / transformers + torch",
        "train_step",
        {"impl": "jrl/torch"},
        ("tokens_per_s_ratio",),
        ">=",
        1.4,
        "issue 3",
    ),
    Goal(
        "train step peak memory, jrl / torch",
        "train_step",
        {"impl": "jrl/torch"},
        ("peak_memory_ratio",),
        "<",
        1.0,
        "issue 3",
    ),
    Goal(
        "rollout tokens/s at 128 rows, jrl / HF generate",
        "rollout",
        {"impl": "jrl/hf", "workload": "fixed", "rows": 128},
        ("tokens_per_s_ratio",),
        ">=",
        30.0,
        "issue 10",
    ),
    Goal(
        "rollout tokens/s at 512 rows, jrl",
        "rollout",
        {"impl": "jrl", "workload": "fixed", "rows": 512},
        ("tokens_per_s",),
        ">=",
        150_000.0,
        "issue 10",
    ),
    Goal(
        "rollout on mixed lengths, jrl continuous / static batching",
        "rollout",
        {"impl": "jrl continuous/static", "workload": "mixed"},
        ("tokens_per_s_ratio",),
        ">=",
        1.5,
        "issue 10",
    ),
    Goal(
        "rollout tokens/s at 128 rows, jrl / vLLM",
        "rollout_vllm",
        {"impl": "jrl/vllm", "rows": 128},
        ("tokens_per_s_ratio",),
        ">=",
        1.0,
        "issue 45",
    ),
    Goal(
        "fused log-prob kernel (pallas_gpu) memory / naive",
        "logprob_kernel",
        {"summary": True, "impl": "pallas_gpu"},
        ("peak_bytes_vs_naive", "temp_bytes_vs_naive"),
        "<=",
        0.1,
        "issue 9",
    ),
    Goal(
        "fused log-prob kernel (pallas_gpu) speed / naive",
        "logprob_kernel",
        {"summary": True, "impl": "pallas_gpu"},
        ("speedup_vs_naive",),
        ">=",
        1.0,
        "issue 9",
    ),
    Goal(
        "fused log-prob kernel (pallas_gpu) speed / chunked",
        "logprob_kernel",
        {"summary": True, "impl": "pallas_gpu"},
        ("speedup_vs_chunked",),
        ">=",
        1.3,
        "issue 9",
    ),
    Goal(
        "actor update peak memory, use_fused_kernels (triton) / off",
        "actor_memory",
        {"variant": "use_fused_kernels=True impl_backend=triton"},
        ("peak_ratio",),
        "<=",
        None,
        "issue 9",
    ),
)


def figure(line: Mapping[str, Any], fields: tuple[str, ...]) -> float | None:
    """The first of `fields` that `line` has, or None."""
    return next((line[f] for f in fields if line.get(f) is not None), None)


def why_missing(goal: Goal, lines: list[dict[str, Any]]) -> str:
    """The reason a line gives for the goal's missing figure, or what was looked for."""
    for line in lines:
        reason = next((line[k] for k in REASONS if line.get(k)), None)
        if reason and all(line.get(k, v) == v for k, v in goal.match.items()):
            return str(reason)
    return f"no {goal.bench} line with {' or '.join(goal.fields)} where {dict(goal.match)}"


def check(goal: Goal, lines: list[dict[str, Any]] | None) -> tuple[str, str]:
    """(status, detail): status is met, not met, reported or not measured; `lines` is None
    when the bench's results file does not exist."""
    if lines is None:
        return "not measured", f"the {goal.bench} step did not run (no {goal.bench}.jsonl)"
    matched = [ln for ln in lines if all(ln.get(k) == v for k, v in goal.match.items())]
    values = [(v, ln) for ln in matched if (v := figure(ln, goal.fields)) is not None]
    if not values:
        return "not measured", why_missing(goal, lines)
    worst_of = OPS[goal.op][1]
    value = worst_of(v for v, _ in values)
    context = []
    for key in CONTEXT:
        seen = sorted({str(ln[key]) for _, ln in values if key in ln})
        if seen:
            context.append(f"{key} {'/'.join(seen)}")
    if len(values) > 1:
        context.append(f"worst of {len(values)}")
    detail = f"{value:.4g}" + (f" [{', '.join(context)}]" if context else "")
    if goal.target is None:
        return "reported", detail
    met = OPS[goal.op][0](value, goal.target)
    return ("met" if met else "not met"), f"{detail}, goal {goal.op} {goal.target:g}"


def read_lines(path: Path) -> list[dict[str, Any]] | None:
    """The JSON lines of a results file (other lines skipped), or None when it is absent."""
    if not path.exists():
        return None
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]


def summary(results: Path) -> list[str]:
    """The summary's lines: the machine (from env.jsonl), then one line per goal."""
    env = (read_lines(results / "env.jsonl") or [{}])[0]
    out = []
    if env:
        cuda = " (CUDA)" if env.get("torch_cuda") else ""
        out.append(
            f"machine: {env.get('device')}, jax {env.get('jax')} on {env.get('backend')}, "
            f"torch {env.get('torch')}{cuda}, vLLM {env.get('vllm')}"
        )
    for goal in GOALS:
        status, detail = check(goal, read_lines(results / f"{goal.bench}.jsonl"))
        out.append(f"{status:<13} {goal.what}: {detail}")
    return out


def table() -> str:
    """The goals as bench/README.md's Markdown table."""
    rows = [
        "| goal | bench, line, figure | target | set by |",
        "|---|---|---|---|",
    ]
    for g in GOALS:
        match = ", ".join(f"{k}={v}" for k, v in g.match.items())
        target = "reported" if g.target is None else f"{g.op} {g.target:g}"
        line = f"`{g.bench}` {match}, `{' or '.join(g.fields)}`"
        rows.append(f"| {g.what} | {line} | {target} | {g.source} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, help="folder of <bench>.jsonl files")
    parser.add_argument("--table", action="store_true", help="print the goals as Markdown")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return
    if args.results is None or not args.results.is_dir():
        parser.error(f"a results folder is needed, got {args.results}")
    print("\n".join(summary(args.results)))


if __name__ == "__main__":
    main()
