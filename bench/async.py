"""Synchronous (colocated) against one-step-off against fully-async training, in one run.

On a card (``--cards``: digits, word_problems) and 8 devices (``--devices``; the CPU's host
devices by default, ``XLA_FLAGS=--xla_force_host_platform_device_count=8``):

- ``sync``: the card on every device, phases in turn (``hybrid_engine=True``);
- ``one_step_off``: half the devices train, half generate (``hybrid_engine=False``), batch t + 1
  generated while batch t trains;
- ``fully_async``: the same split, the rollouter streaming finished groups
  (``async_training.mode=fully_async``; ``--staleness``, ``--trigger``, partial rollouts on).

Every mode trains the same steps on the same prompts (a step: the card's ``train_batch_size``
prompts; fully async: ``require_batches`` = that over ``ppo_mini_batch_size``), so the same
number of samples, and validates greedily before and after. One JSON line per (card, mode):
the mean step time after the first (compiling) step, the wall time, the held-out reward before
and after, the mean staleness of the trained rows, and the measured overlap: the fraction of the
trainer's busy time (after its rows arrived) during which the rollout was generating.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/async.py
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/async.py --cards digits \
        --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runs import train_quietly  # noqa: E402

from jrl.config import load_config_file  # noqa: E402

CARDS = {
    "digits": (ROOT / "configs" / "digits_grpo.py", "val-core/jrl/digits/reward/mean@1"),
    "word_problems": (
        ROOT / "configs" / "word_problems_grpo.py",
        "val-core/jrl/word_problems/reward/mean@1",
    ),
}
MODES = ("sync", "one_step_off", "fully_async")


def mode_overrides(mode: str, devices: int, card, args: argparse.Namespace) -> list[str]:
    """The keys that make `mode` of `card` on `devices` devices."""
    mini = card.actor_rollout_ref.actor.ppo_mini_batch_size
    micro = max(1, mini * card.actor_rollout_ref.rollout.n // devices)  # divides both meshes'
    common = [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"]
    if mode == "sync":
        return [*common, f"trainer.n_gpus_per_node={devices}"]
    split = [
        *common,
        "actor_rollout_ref.hybrid_engine=False",
        f"trainer.n_gpus_per_node={devices // 2}",
        f"rollout.n_gpus_per_node={devices // 2}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ]
    if mode == "one_step_off":
        return split
    return [
        *split,
        "async_training.mode=fully_async",
        f"async_training.staleness_threshold={args.staleness}",
        f"async_training.trigger_parameter_sync_step={args.trigger}",
        f"async_training.require_batches={card.data.train_batch_size // mini}",
        "async_training.partial_rollout=True",
    ]


def summary(card: str, mode: str, rows: list[dict], val_key: str, wall_s: float) -> dict:
    """One run's line (module docstring)."""
    steps = {int(row["step"]): row["data"] for row in rows}
    trained = [data for step, data in sorted(steps.items()) if step > 0]
    validated = [data[val_key] for _, data in sorted(steps.items()) if val_key in data]
    later = trained[1:] or trained

    def mean(key: str) -> float | None:
        values = [data[key] for data in later if key in data]
        return round(statistics.fmean(values), 4) if values else None

    busy = sum(data.get("overlap/trainer_busy_s", 0.0) for data in later)
    generating = sum(data.get("overlap/rollout_generating_s", 0.0) for data in later)
    return {
        "card": card,
        "mode": mode,
        "steps": len(trained),
        "step_s_mean": mean("timing_s/step"),
        "wall_s": round(wall_s, 1),
        "val_before": validated[0],
        "val_after": validated[-1],
        "staleness_mean": mean("training/staleness_mean") or 0.0,
        "overlap_fraction": round(generating / busy, 4) if busy else 0.0,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Command line: each mode of each card; prints and returns the JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cards", nargs="+", choices=sorted(CARDS), default=sorted(CARDS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--staleness", type=float, default=0.5)
    parser.add_argument("--trigger", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "async")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args(argv)
    results = []
    for name in args.cards:
        path, val_key = CARDS[name]
        card = load_config_file(str(path))[0]
        for mode in args.modes:
            keys = [*mode_overrides(mode, args.devices, card, args), *args.overrides]
            start = time.perf_counter()
            rows = train_quietly(path, args.out / f"{name}_{mode}", args.steps, keys)
            line = summary(name, mode, rows, val_key, time.perf_counter() - start)
            results.append(line)
            print(json.dumps(line), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
