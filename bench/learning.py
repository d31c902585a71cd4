"""Proof that RL learns: GRPO and PPO, held-out greedy accuracy over training.

Three models (``--model``):
- ``digits``: configs/digits_<algo>.py, a tiny random-init model on `jrl.data.digits`, 256
  held-out prompts; 60 steps, validated every 10.
- ``digits_moe``: the same cards with a tiny random-init mixture of experts (Qwen3-MoE, 4 experts,
  2 per token: `jrl.assets.TINY_MOE`) as the actor and the critic.
- ``smollm2``: configs/word_problems_<algo>.py, the pretrained SmolLM2-135M-Instruct on one-step
  word problems scored by verl's GSM8K rule in its flexible mode (the last number), 128 held-out
  problems; 20 steps, validated every 4.

Each run trains the card with one seed (``data.seed``: data order and every sampling key) and
validates greedily before training, every ``--test-freq`` steps and at the end. The untrained
model is the baseline: ``before`` is its accuracy, ``after`` the trained one's, in the same run.

    python bench/learning.py                                 # digits: GRPO + PPO, seeds 0 1 2
    python bench/learning.py --algos grpo --seeds 3 --steps 30 --test-freq 5
    python bench/learning.py --model smollm2 --algos grpo    # SmolLM2, seeds 0 1 2

Prints one JSON line per run (algo, seed, before, after, best, wall_s) and one per algorithm
(means and range over the seeds). Writes ``<out>/learning.jsonl`` (one line per run and step:
train_reward = mean sampled reward, val_accuracy where validated) and ``<out>/learning.png``
(needs matplotlib: ``pip install "jrl[plot]"``; without it the PNG is skipped with a message).
The runs' own files (train.log, metrics.jsonl, plots) are under ``<out>/<algo>_seed<seed>/``.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
ALGOS = ("grpo", "ppo")
TRAIN_KEY = "critic/score/mean"


@dataclass(frozen=True)
class Task:
    """A model's experiment: its cards (``card.format(algo=...)`` under configs/), the metric of
    its held-out greedy accuracy, its default length, and the asset set (`jrl.assets`) whose
    model replaces the card's (None: the card's own)."""

    card: str
    val_key: str
    steps: int
    test_freq: int
    model_set: str | None = None

    def model_overrides(self) -> list[str]:
        """The overrides that put the asset set's model in the actor's and critic's place."""
        if self.model_set is None:
            return []
        from jrl.assets import PATHS

        path = PATHS[self.model_set]()["model_path"]
        return [f"actor_rollout_ref.model.path={path}", f"critic.model.path={path}"]


DIGITS = "val-core/jrl/digits/reward/mean@1"
TASKS = {
    "digits": Task("digits_{algo}.py", DIGITS, 60, 10),
    "digits_moe": Task("digits_{algo}.py", DIGITS, 60, 10, model_set="digits_moe"),
    "smollm2": Task("word_problems_{algo}.py", "val-core/jrl/word_problems/reward/mean@1", 20, 4),
}


@dataclass
class Run:
    """One training run: per-step sampled reward, held-out accuracy where validated, wall time."""

    algo: str
    seed: int
    wall_s: float
    train_reward: dict[int, float] = field(default_factory=dict)
    val_accuracy: dict[int, float] = field(default_factory=dict)

    def summary(self) -> dict:
        steps = sorted(self.val_accuracy)
        return {
            "algo": self.algo,
            "seed": self.seed,
            "steps": max(self.train_reward, default=0),
            "before": self.val_accuracy[steps[0]],
            "after": self.val_accuracy[steps[-1]],
            "best": max(self.val_accuracy.values()),
            "gain": round(self.val_accuracy[steps[-1]] - self.val_accuracy[steps[0]], 4),
            "wall_s": round(self.wall_s, 1),
        }


def read_run(algo: str, seed: int, wall_s: float, metrics_file: Path, val_key: str) -> Run:
    """The `Run` recorded in a trainer's metrics JSON-lines file (a repeated step: last wins)."""
    run = Run(algo, seed, wall_s)
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        for key, values in ((TRAIN_KEY, run.train_reward), (val_key, run.val_accuracy)):
            if key in row["data"]:
                values[int(row["step"])] = float(row["data"][key])
    if not run.val_accuracy:
        raise ValueError(f"{metrics_file}: no {val_key} values; was validation switched off?")
    return run


def train(
    task: Task, algo: str, seed: int, steps: int, test_freq: int, run_dir: Path, extra: list[str]
) -> Run:
    """Trains the task's card for `algo` in this process (a fresh `run_dir`; the trainer's own
    output goes to ``run_dir/train.log``) and returns its `Run`."""
    from jrl import train as jrl_train

    argv = [
        f"--config={ROOT / 'configs' / task.card.format(algo=algo)}",
        f"data.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        "trainer.logger=['file']",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
        *task.model_overrides(),
        *extra,
    ]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    with open(run_dir / "train.log", "w", encoding="utf-8") as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            jrl_train.main(argv)
    wall_s = time.perf_counter() - start
    return read_run(algo, seed, wall_s, run_dir / "metrics.jsonl", task.val_key)


def aggregate(runs: list[Run]) -> dict:
    """Means and ranges of before/after over one algorithm's runs."""
    before = [r.summary()["before"] for r in runs]
    after = [r.summary()["after"] for r in runs]
    return {
        "algo": runs[0].algo,
        "seeds": [r.seed for r in runs],
        "before_mean": round(statistics.fmean(before), 4),
        "after_mean": round(statistics.fmean(after), 4),
        "after_min": min(after),
        "after_max": max(after),
        "gain_min": round(min(a - b for a, b in zip(after, before, strict=True)), 4),
        "wall_s_total": round(sum(r.wall_s for r in runs), 1),
    }


def write_curves(runs: list[Run], path: Path) -> None:
    """One JSON line per run and logged step: train_reward and, where validated, val_accuracy."""
    with open(path, "w", encoding="utf-8") as out:
        for run in runs:
            for step in sorted(set(run.train_reward) | set(run.val_accuracy)):
                line = {"algo": run.algo, "seed": run.seed, "step": step}
                if step in run.train_reward:
                    line["train_reward"] = run.train_reward[step]
                if step in run.val_accuracy:
                    line["val_accuracy"] = run.val_accuracy[step]
                out.write(json.dumps(line) + "\n")


def plot_curves(runs: list[Run], path: Path) -> bool:
    """Held-out accuracy and sampled training reward against step, one line per run (a color
    per algorithm); False
    (with a message) when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        print(
            f'bench/learning.py: no matplotlib, {path} skipped: pip install "jrl[plot]"',
            file=sys.stderr,
        )
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (val_ax, train_ax) = plt.subplots(1, 2, figsize=(11, 4))
    colors = dict(zip(ALGOS, ("tab:blue", "tab:orange"), strict=True))
    for algo in ALGOS:
        mine = [run for run in runs if run.algo == algo]
        for i, run in enumerate(mine):
            label = f"{algo}, seeds {' '.join(str(r.seed) for r in mine)}" if i == 0 else None
            for ax, values in ((val_ax, run.val_accuracy), (train_ax, run.train_reward)):
                steps = sorted(values)
                ax.plot(steps, [values[s] for s in steps], color=colors[algo], label=label)
    val_ax.set(title="Held-out greedy accuracy", xlabel="step", ylim=(-0.02, 1.02))
    train_ax.set(title="Training reward (sampled, mean)", xlabel="step", ylim=(-0.02, 1.02))
    val_ax.legend(fontsize="small")
    for ax in (val_ax, train_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> list[dict]:
    """Command line: train every (algo, seed), print and write the results; returns the lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(TASKS), default="digits")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="data.seed values")
    parser.add_argument("--steps", type=int, help="training steps per run (default: the task's)")
    parser.add_argument(
        "--test-freq", type=int, help="validate every N steps (default: the task's)"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: outputs/learning_MODEL)")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="config overrides for every run, e.g. actor_rollout_ref.actor.optim.lr=3e-3",
    )
    args = parser.parse_args(argv)
    task = TASKS[args.model]
    args.steps = task.steps if args.steps is None else args.steps
    args.test_freq = task.test_freq if args.test_freq is None else args.test_freq
    args.out = args.out or ROOT / "outputs" / f"learning_{args.model}"
    if args.steps < 1 or args.test_freq < 1:
        parser.error(
            f"--steps and --test-freq must be positive, got {args.steps}, {args.test_freq}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    lines, runs = [], []
    for algo in args.algos:
        mine = []
        for seed in args.seeds:
            run_dir = args.out / f"{algo}_seed{seed}"
            run = train(task, algo, seed, args.steps, args.test_freq, run_dir, args.overrides)
            mine.append(run)
            lines.append(run.summary())
            print(json.dumps(lines[-1]), flush=True)
        runs += mine
        lines.append(aggregate(mine))
        print(json.dumps(lines[-1]), flush=True)
    write_curves(runs, args.out / "learning.jsonl")
    plot_curves(runs, args.out / "learning.png")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
