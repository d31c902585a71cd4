"""DAPO's dynamic sampling against GRPO without filtering, at equal generated samples.

On a card (default: configs/word_problems_grpo.py, SmolLM2-135M-Instruct on one-step word
problems, 4 prompts x 4 answers a step), per seed (``data.seed``):

- ``dapo``: the card with ``algorithm.filter_groups`` on (``--metric``, seq_reward by default:
  the card's GSM8K rule score) and ``data.gen_batch_size`` = ``--gen-factor`` x the card's
  ``train_batch_size``, for ``--steps`` steps. Each step draws generation batches until
  train_batch_size prompts have answers that disagree; it generates
  ``num_gen_batches x gen_batch_size x n`` samples.
- ``grpo``: the card as it is, for as many steps as give the same number of generated samples
  (``train_batch_size x n`` a step; rounded to the nearest step, at least one).

Both validate greedily before training and after their last step. With ``--lrs`` both run at
each actor learning rate of the grid: at equal samples GRPO takes about ``num_gen_batches`` times
as many updates as DAPO, so a single learning rate favours whichever algorithm it suits; each is
compared at its best rate of the same grid. ``--grpo-lrs`` runs GRPO at each of those rates with
each DAPO run's samples (default: the DAPO run's own rate), so that the best rates compare at
equal samples too. One JSON line per run: the learning rate (GRPO's: also ``dapo_lr``, whose
samples it matched), the steps, the generated samples, the batches-per-step figure (mean
``train/num_gen_batches``; 1 for grpo), the held-out reward before and after, the wall time; then
one line per algorithm and learning rate (and ``dapo_lr``) with the means over the seeds.

    python bench/dapo.py                                   # 3 seeds, 12 DAPO steps each
    python bench/dapo.py --lrs 1e-5 2e-5                   # both at each rate of the grid
    python bench/dapo.py --lrs 2e-5 --grpo-lrs 1e-5        # GRPO at another rate, same samples
    python bench/dapo.py --lrs 2e-5 -- data.val_max_samples=64   # overrides behind -- here
    python bench/dapo.py --seeds 0 --steps 1 data.val_max_samples=8     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runs import train_quietly  # noqa: E402

from jrl.config import load_config_file  # noqa: E402

VAL_KEY = "val-core/jrl/word_problems/reward/mean@1"
GEN_BATCHES = "train/num_gen_batches"


def summary(
    algo: str,
    lr: float | None,
    seed: int,
    rows: list[dict],
    prompts: int,
    samples_per_batch: int,
    wall_s: float,
) -> dict:
    """One run's line: learning rate, prompts per update, steps, generated samples, batches per
    step, reward."""
    steps = {int(row["step"]): row["data"] for row in rows}
    trained = [data for step, data in sorted(steps.items()) if step > 0]
    batches = [float(data.get(GEN_BATCHES, 1.0)) for data in trained]
    validated = [data[VAL_KEY] for _, data in sorted(steps.items()) if VAL_KEY in data]
    return {
        "algo": algo,
        "lr": lr,
        "dapo_lr": lr,
        "seed": seed,
        "train_batch_size": prompts,
        "steps": len(trained),
        "generated_samples": int(sum(batches) * samples_per_batch),
        "num_gen_batches_mean": round(statistics.fmean(batches), 3),
        "val_before": validated[0],
        "val_after": validated[-1],
        "wall_s": round(wall_s, 1),
    }


def aggregate(lines: list[dict]) -> dict:
    """Means over the seeds of one algorithm at one learning rate."""
    return {
        "algo": lines[0]["algo"],
        "lr": lines[0]["lr"],
        "dapo_lr": lines[0]["dapo_lr"],
        "train_batch_size": lines[0]["train_batch_size"],
        "seeds": [line["seed"] for line in lines],
        **{
            key.removesuffix("_mean") + "_mean": round(
                statistics.fmean(line[key] for line in lines), 4
            )
            for key in ("generated_samples", "num_gen_batches_mean", "val_before", "val_after")
        },
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Command line: a dapo and a grpo run per seed; prints and returns the JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--card", default=str(ROOT / "configs" / "word_problems_grpo.py"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12, help="DAPO's training steps per run")
    parser.add_argument("--gen-factor", type=int, default=2, help="gen_batch_size / train's")
    parser.add_argument(
        "--dapo-prompts",
        type=int,
        help="DAPO's train_batch_size and ppo_mini_batch_size (default: the card's); the "
        "micro-batch is the card's or the largest that divides the new mini-batch's rows",
    )
    parser.add_argument("--metric", default="seq_reward", help="algorithm.filter_groups.metric")
    parser.add_argument(
        "--lrs", nargs="+", type=float, default=[None], help="actor learning rates (card's: none)"
    )
    parser.add_argument(
        "--grpo-lrs", nargs="+", type=float, help="GRPO's rates (default: each DAPO run's)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "dapo")
    parser.add_argument(
        "overrides", nargs="*", help="config overrides for every run (after -- behind --lrs)"
    )
    args = parser.parse_args(argv)
    card = load_config_file(args.card)[0]
    prompts, n = card.data.train_batch_size, card.actor_rollout_ref.rollout.n
    micro = card.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    dapo_prompts = args.dapo_prompts or prompts
    if min(args.steps, args.gen_factor, dapo_prompts) < 1:
        parser.error(
            "--steps, --gen-factor and --dapo-prompts must be positive: "
            f"{args.steps}, {args.gen_factor}, {dapo_prompts}"
        )
    gen_batch_size = args.gen_factor * dapo_prompts
    dapo_keys = [
        "algorithm.filter_groups.enable=True",
        f"algorithm.filter_groups.metric={args.metric}",
        f"data.gen_batch_size={gen_batch_size}",
        f"data.train_batch_size={dapo_prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={dapo_prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={math.gcd(micro, dapo_prompts * n)}",
    ]
    lines: dict[tuple[str, float | None, float | None], list[dict]] = {}

    def rate(lr: float | None) -> tuple[list[str], str]:
        """The override of learning rate `lr` (none for the card's) and its folder tag."""
        if lr is None:
            return [], ""
        return [f"actor_rollout_ref.actor.optim.lr={lr}"], f"_lr{lr:g}"

    for lr in args.lrs:
        keys, tag = rate(lr)
        for seed in args.seeds:
            seeded = [f"data.seed={seed}", *args.overrides]
            start = time.perf_counter()
            run_dir = args.out / f"dapo{tag}_seed{seed}"
            rows = train_quietly(args.card, run_dir, args.steps, dapo_keys + keys + seeded)
            dapo = summary(
                "dapo",
                lr,
                seed,
                rows,
                dapo_prompts,
                gen_batch_size * n,
                time.perf_counter() - start,
            )
            runs = [dapo]
            steps = max(round(dapo["generated_samples"] / (prompts * n)), 1)
            for grpo_lr in args.grpo_lrs or [lr]:
                grpo_keys, grpo_tag = rate(grpo_lr)
                run_dir = args.out / f"grpo{grpo_tag}_as_dapo{tag}_seed{seed}"
                start = time.perf_counter()
                rows = train_quietly(args.card, run_dir, steps, grpo_keys + seeded)
                wall_s = time.perf_counter() - start
                grpo = summary("grpo", grpo_lr, seed, rows, prompts, prompts * n, wall_s)
                runs.append({**grpo, "dapo_lr": lr})
            for line in runs:
                lines.setdefault((line["algo"], line["lr"], lr), []).append(line)
                print(json.dumps(line), flush=True)
    results = [line for runs in lines.values() for line in runs]
    for runs in lines.values():
        results.append(aggregate(runs))
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
