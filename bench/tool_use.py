"""A real model and a real tool: SmolLM2-135M-Instruct with the calculator, before and after.

The task (`jrl.data.arithmetic`): two-digit additions and multiplications, the calculator offered
to the model in the system message (Hermes format; SmolLM2's template has no ``tools=``). For
each seed, three stages, each measured greedily on the same 32 held-out problems: accuracy and
the rate of answers that call the tool.

1. ``base``: the pretrained model (the baseline, in the same run).
2. ``sft``: after a warm-up with ``jrl.sft`` on ``--sft-rows`` synthetic traces (question,
   calculator call, the tool's answer, ``#### <answer>``), ``--sft-steps`` steps of 8 rows. The
   base model does not call the tool even when sampling (a probe: 0 of 128 answers at
   temperature 1, the tools listed in its system message), so RL alone has nothing to reinforce:
   the warm-up is what makes it try.
3. ``rl``: then ``--rl-steps`` GRPO steps (configs/word_problems_grpo.py's algorithm) with
   multi-turn rollouts through the tool agent, rewarded by the answer only.

    python bench/tool_use.py                       # seeds 0 1 2
    python bench/tool_use.py --seeds 0 --rl-steps 2

Prints one JSON line per (seed, stage) and one per stage (means over the seeds); writes
``<out>/tool_use.jsonl``, ``<out>/tool_use.md`` (the table) and ``<out>/tool_use.png`` (needs
matplotlib). The runs' own files are under ``<out>/seed<seed>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jrl import sft, train  # noqa: E402
from jrl.agent.chat import ChatTemplate  # noqa: E402
from jrl.agent.tools.registry import load_tools  # noqa: E402
from jrl.assets import prepare_smollm2  # noqa: E402
from jrl.data import arithmetic  # noqa: E402
from jrl.data.splits import write_splits  # noqa: E402
from jrl.data.tokenizer import load_tokenizer  # noqa: E402

STAGES = ("base", "sft", "rl")
ACCURACY = "val-core/jrl/arithmetic/acc/mean@1"
CALLS = "val-aux/jrl/arithmetic/called/mean@1"
CALCULATOR = {
    "tools": [
        {"class_name": "jrl.agent.tools.calculator.CalculatorTool", "config": {"type": "native"}}
    ]
}
MAX_RESPONSE = 96


def prepare(folder: Path, seed: int, sft_rows: int, model: Path) -> Path:
    """The seed's RL rows (512 to train on, 32 held out), SFT traces and tool config."""
    tools = folder / "tools.yaml"
    tools.write_text(yaml.safe_dump(CALCULATOR))
    schemas = [tool.tool_schema for tool in load_tools(str(tools), None).values()]
    chat = ChatTemplate.of(load_tokenizer(str(model)), {}, schemas)
    write_splits(
        folder / "rl_data",
        {
            "train": arithmetic.make_rows(512, seed, "train"),
            "test": arithmetic.make_rows(32, 0, "test"),
        },
    )
    traces = arithmetic.sft_traces(sft_rows, seed, chat.tool_listing)
    write_splits(folder / "sft_data", {"train": traces, "test": traces[:8]})
    return tools


def quietly(run_dir: Path, main, argv: list[str]) -> None:
    """`main(argv)` with its output in ``run_dir/log.txt``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "log.txt", "w", encoding="utf-8") as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            main(argv)


def rl_args(folder: Path, tools: Path, model: str, seed: int, run_dir: Path) -> list[str]:
    return [
        f"--config={ROOT / 'configs' / 'word_problems_grpo.py'}",
        f"data.train_files={folder / 'rl_data' / 'train.parquet'}",
        f"data.val_files={folder / 'rl_data' / 'test.parquet'}",
        f"data.max_response_length={MAX_RESPONSE}",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "trainer.logger=['file']",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
    ]


def validations(run_dir: Path) -> dict[int, dict[str, float]]:
    """Accuracy and call rate at each validated step of a run."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if ACCURACY in row["data"]:
            out[row["step"]] = {"accuracy": row["data"][ACCURACY], "calls": row["data"][CALLS]}
    return out


def run_seed(seed: int, args: argparse.Namespace, model: Path) -> list[dict]:
    """The three stages of one seed: one result line each."""
    folder = args.out / f"seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tools = prepare(folder, seed, args.sft_rows, model)
    start = time.perf_counter()
    base_dir = folder / "base"
    quietly(
        base_dir,
        train.main,
        [*rl_args(folder, tools, str(model), seed, base_dir), "trainer.val_only=True"],
    )
    base = validations(base_dir)[0]
    sft_dir = folder / "sft"
    quietly(
        sft_dir,
        sft.main,
        [
            f"--config={ROOT / 'configs' / 'gsm8k_sft.py'}",
            f"data.train_files={folder / 'sft_data' / 'train.parquet'}",
            f"data.val_files={folder / 'sft_data' / 'test.parquet'}",
            "data.multiturn.enable=True",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=8",
            "data.max_length=320",
            "data.truncation=error",
            f"trainer.seed={seed}",
            f"model.partial_pretrain={model}",
            "model.fsdp_config.model_dtype=float32",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=1",
            f"trainer.total_training_steps={args.sft_steps}",
            "trainer.test_freq=-1",
            "optim.lr=2e-5",
            "trainer.logger=['console']",
            f"trainer.save_freq={args.sft_steps}",
            "trainer.checkpoint.save_contents=['model','hf_model']",
            f"trainer.default_local_dir={sft_dir}",
        ],
    )
    warmed = sft_dir / f"global_step_{args.sft_steps}" / "actor" / "huggingface"
    rl_dir = folder / "rl_run"
    quietly(
        rl_dir,
        train.main,
        [
            *rl_args(folder, tools, str(warmed), seed, rl_dir),
            f"trainer.total_training_steps={args.rl_steps}",
            f"trainer.test_freq={args.rl_steps}",
        ],
    )
    rl = validations(rl_dir)
    wall = round(time.perf_counter() - start, 1)
    stages = {"base": base, "sft": rl[0], "rl": rl[max(rl)]}
    return [{"seed": seed, "stage": s, **stages[s], "wall_s": wall} for s in STAGES]


def write_table(lines: list[dict], path: Path) -> None:
    """The results as a Markdown table: accuracy and call rate per seed and stage."""
    rows = ["| seed | stage | accuracy | tool-call rate |", "|---|---|---|---|"]
    rows += [
        f"| {r['seed']} | {r['stage']} | {r['accuracy']:.3f} | {r['calls']:.3f} |" for r in lines
    ]
    path.write_text("\n".join(rows) + "\n")


def plot(lines: list[dict], path: Path) -> bool:
    """Accuracy and call rate per stage, a line per seed; False without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        print(f'bench/tool_use.py: no matplotlib, {path} skipped: pip install "jrl[plot]"')
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, title in zip(
        axes, ("accuracy", "calls"), ("Held-out accuracy", "Tool-call rate"), strict=True
    ):
        for seed in sorted({r["seed"] for r in lines}):
            mine = [r for r in lines if r["seed"] == seed]
            ax.plot(
                [r["stage"] for r in mine], [r[key] for r in mine], marker="o", label=f"seed {seed}"
            )
        ax.set(title=title, ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle("SmolLM2-135M-Instruct + calculator: greedy, 32 two-digit problems")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--sft-rows", type=int, default=32, help="synthetic traces per seed")
    parser.add_argument("--sft-steps", type=int, default=8, help="warm-up steps (8 rows each)")
    parser.add_argument("--rl-steps", type=int, default=3, help="GRPO steps after the warm-up")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "tool_use")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = prepare_smollm2()
    lines = []
    for seed in args.seeds:
        for line in run_seed(seed, args, model):
            print(json.dumps(line), flush=True)
            lines.append(line)
    for stage in STAGES:
        mine = [r for r in lines if r["stage"] == stage]
        summary = {
            "stage": stage,
            "seeds": [r["seed"] for r in mine],
            "accuracy_mean": round(statistics.fmean(r["accuracy"] for r in mine), 4),
            "calls_mean": round(statistics.fmean(r["calls"] for r in mine), 4),
        }
        print(json.dumps(summary), flush=True)
    with open(args.out / "tool_use.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)
    write_table(lines, args.out / "tool_use.md")
    plot(lines, args.out / "tool_use.png")
    return lines


if __name__ == "__main__":
    main()
