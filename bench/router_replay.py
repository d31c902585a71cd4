"""Router replay (R3) against training that routes afresh: how many tokens training sends to other
experts than the rollout did, and how far apart their log-probs are.

The digits task's tiny Qwen3-MoE (`jrl.assets.TINY_MOE`: 4 experts, 2 per token) on its GRPO card
(configs/digits_grpo.py), rollout and actor in bfloat16, ``--steps`` steps per run. The rollout
records each token's experts in every run (``rollout.enable_rollout_routing_replay``); then

- ``off``: training routes its tokens itself (``actor.router_replay.mode=disabled``), so the
  old-log-prob pass measures how many tokens it routes elsewhere;
- ``R3``: training replays the rollout's experts (``router_replay.mode=R3``).

Each runs in two placements: ``colocated`` (one mesh, the rollout on the weights it trains, so
rollout and training differ only by their bfloat16 arithmetic) and ``one_step_off`` (half the
devices generate batch t + 1 while batch t trains: the rollout's weights are one update old, as
in asynchronous training; needs ``XLA_FLAGS=--xla_force_host_platform_device_count=8``).

One JSON line per run, with means over the steps: ``routes_differ_fraction`` (tokens with a
different set of experts in at least one layer), ``route_layers_differ_fraction`` ((token, layer)
pairs), the rollout-correction KL of the rollout's log-probs against the old-log-prob pass's
(``rollout_corr/kl`` = mean(log p_rollout - log p_old), ``rollout_corr/k3_kl``) and
``training/rollout_probs_diff_mean``; and the held-out greedy reward after the last step.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/router_replay.py
    python bench/router_replay.py --placements colocated --steps 2      # a smoke run
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

from jrl.assets import prepare_digits_moe  # noqa: E402

CARD = ROOT / "configs" / "digits_grpo.py"
VAL_KEY = "val-core/jrl/digits/reward/mean@1"
MEASURED = (
    "training/routes_differ_fraction",
    "training/route_layers_differ_fraction",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "training/rollout_probs_diff_mean",
)
REPLAY = {"off": "disabled", "R3": "R3"}
PLACEMENTS = ("colocated", "one_step_off")


def placement_overrides(placement: str, devices: int) -> list[str]:
    """The keys of `placement` on `devices` devices (the card's 64 answers per mini-batch split
    over the trainer's devices)."""
    trainer = devices if placement == "colocated" else devices // 2
    keys = [
        f"trainer.n_gpus_per_node={trainer}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={max(64 // trainer, 1)}",
    ]
    if placement == "colocated":
        return keys
    return [*keys, "actor_rollout_ref.hybrid_engine=False", f"rollout.n_gpus_per_node={trainer}"]


def summary(placement: str, replay: str, rows: list[dict], wall_s: float) -> dict:
    """One run's line (module docstring)."""
    steps = {int(row["step"]): row["data"] for row in rows}
    trained = [data for step, data in sorted(steps.items()) if step > 0]
    line = {"bench": "router_replay", "placement": placement, "replay": replay}
    line["steps"] = len(trained)
    for key in MEASURED:
        line[key] = statistics.fmean(float(data[key]) for data in trained)
    line["routed_tokens_per_step"] = statistics.fmean(
        float(data["training/routed_tokens"]) for data in trained
    )
    validated = [data[VAL_KEY] for _, data in sorted(steps.items()) if VAL_KEY in data]
    line["val_after"] = float(validated[-1])
    line["wall_s"] = round(wall_s, 1)
    return line


def main(argv: list[str] | None = None) -> list[dict]:
    """Command line: an ``off`` and an ``R3`` run per placement; prints the JSON lines."""
    import jax

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS))
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "router_replay")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args(argv)
    devices = jax.device_count()
    if "one_step_off" in args.placements and devices < 2:
        parser.error(
            "one_step_off needs 2 devices or more: "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8"
        )
    common = [
        f"actor_rollout_ref.model.path={prepare_digits_moe()['model_path']}",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
    ]
    lines = []
    for placement in args.placements:
        for replay, mode in REPLAY.items():
            keys = [
                *common,
                *placement_overrides(placement, devices),
                f"actor_rollout_ref.actor.router_replay.mode={mode}",
                *args.overrides,
            ]
            start = time.perf_counter()
            rows = train_quietly(CARD, args.out / f"{placement}_{replay}", args.steps, keys)
            line = summary(placement, replay, rows, time.perf_counter() - start)
            print(json.dumps(line), flush=True)
            lines.append(line)
    return lines


if __name__ == "__main__":
    main()
