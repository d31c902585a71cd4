"""Which TPU slice each model's GRPO and PPO run fits on: `python -m jrl.compile` for the cards of
configs/ with public model shapes (bench/model_shapes.py, config.json only) on Cloud TPU slices,
one JSON line per (card, model, slice), then a Markdown table.

Every figure comes from the TPU compiler (libtpu, no TPU needed): each run is compiled at 1 and 2
decoder layers and extrapolated to the model's depth (`jrl.compile --layers=1,2`; the tests check
the extrapolation against a full-depth compile), the rollout at its widest prompt bucket. Times
are jrl.compile's roofline estimates. A run whose resident states alone (parameters, optimizer
states, reference and rollout weights, per chip as the trainer shards them: exact bytes of the
sharded shapes; a split run's larger mesh) exceed the chip's HBM is not compiled: its line says
`"by": "resident states"`.
Each plan runs in its own process (results are appended to --out as they come, and a rerun skips
the lines already there). The `grpo_split` card is the GRPO card with
``actor_rollout_ref.hybrid_engine=False``: half of each host's chips train, half generate, and its
line adds each mesh's per-chip GiB and the weight sync's GiB, buckets and estimated seconds. A
first pass finds each run's smallest slice that fits (slices in order of total HBM); a second
fills in the other slices.

    python bench/tpu_plan.py --out bench/results/tpu_plan.jsonl
    python bench/tpu_plan.py --table bench/results/tpu_plan.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this host only traces; libtpu describes slices
sys.path.insert(0, str(Path(__file__).parent))
from model_shapes import write_shape  # noqa: E402

MODELS = (
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "llama-3.1-8b",
    "llama-3.1-70b",
)
CARDS = {
    "grpo": ("configs/gsm8k_grpo.py",),
    "ppo": ("configs/gsm8k_ppo.py",),
    "grpo_split": ("configs/gsm8k_grpo.py", "actor_rollout_ref.hybrid_engine=False"),
}
SLICES = (
    "v5litepod-8",
    "v5litepod-16",
    "v5litepod-64",
    "v5litepod-256",
    "v5p-8",
    "v5p-64",
    "v5p-256",
    "v6e-8",
    "v6e-64",
)
# The cards' batch sizes are verl's for 8 GPUs; per chip every update and log-prob pass takes 1
# row at a time here so that the same card splits over any slice (the mini-batch of 256 prompts
# stays).
OVERRIDES = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "critic.forward_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.model.use_fused_kernels=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "critic.model.enable_gradient_checkpointing=True",
)


def _arguments(card: str, folder: Path) -> list[str]:
    path, *extra = CARDS[card]
    return [
        f"--config={path}",
        *extra,
        f"actor_rollout_ref.model.path={folder}",
        f"critic.model.path={folder}",
        *OVERRIDES,
    ]


def resident_only(card: str, model: str, topology: str, folder: Path) -> dict | None:
    """The line of a run whose resident states alone exceed the chip's HBM (no compile), else
    None."""
    from jrl.compile import slice_devices
    from jrl.parallel.topology import open_slice
    from jrl.plan.memory import resident_states
    from jrl.plan.roles import build_roles
    from jrl.runspec import load_config

    where = open_slice(topology)
    arguments = _arguments(card, folder)
    config = load_config([*slice_devices(arguments, where), *arguments])[0]
    resident = resident_states(build_roles(config, where))
    states = max(sum(s.device for s in resident if s.mesh == m) for m in {s.mesh for s in resident})
    if states <= where.hbm_bytes:
        return None
    return {
        "card": card,
        "model": model,
        "topology": topology,
        "fits": False,
        "chips": where.chips,
        "gib_per_chip": round(states / 2**30, 2),
        "hbm_gib": round(where.hbm_bytes / 2**30, 2),
        "by": "resident states",
    }


def plan_one(card: str, model: str, topology: str, folder: Path, timeout: int) -> dict:
    """jrl.compile's JSON plan of one run (in a subprocess), with its wall time."""
    command = [
        sys.executable,
        "-m",
        "jrl.compile",
        f"--topology={topology}",
        "--layers=1,2",
        "--rollout-buckets=largest",
        "--no-advice",
        "--json",
        *_arguments(card, folder),
    ]
    start = time.perf_counter()
    row = {"card": card, "model": model, "topology": topology}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "wall_s": timeout, "error": f"no plan within --timeout={timeout} s"}
    row["wall_s"] = round(time.perf_counter() - start, 1)
    if done.returncode not in (0, 1):
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    plan = json.loads(done.stdout)
    return {
        **row,
        "fits": plan["fits"],
        "chips": plan["chips"],
        "gib_per_chip": round((plan["hbm_bytes"] + plan["over_bytes"]) / 2**30, 2),
        "hbm_gib": round(plan["hbm_bytes"] / 2**30, 2),
        "worst_phase": plan["worst_phase"],
        "step_s_estimate": round(plan["step_seconds_estimate"], 2),
        **_split_figures(plan["split"]),
    }


def _split_figures(split: dict | None) -> dict:
    """A split run's figures: each mesh's chips and per-chip GiB, and the weight sync."""
    if split is None:
        return {}
    meshes, sync = split["meshes"], split["sync"]
    return {
        **{f"{m}_chips": sum(len(h[m]) for h in split["hosts"]) for m in meshes},
        **{f"{m}_gib_per_chip": round(v["total_bytes"] / 2**30, 2) for m, v in meshes.items()},
        "sync_gib": round(sync["sent_bytes"] / 2**30, 2),
        "sync_buckets": sync["buckets"],
        "sync_s_estimate": round(sync["seconds_estimate"], 4),
    }


def _total_hbm(topology: str) -> float:
    from jrl.parallel.topology import open_slice

    where = open_slice(topology)
    return where.chips * where.hbm_bytes


def table(rows: list[dict]) -> str:
    """Markdown: per card and model planned on any of `SLICES`, each slice's per-chip GiB (fits
    or not) and the estimated step time; the smallest slice that fits (least HBM in all, as the
    first pass orders them)."""
    lines = [
        "| card | model | " + " | ".join(SLICES) + " | smallest that fits |",
        "|---" * (len(SLICES) + 3) + "|",
    ]
    found = {(r["card"], r["model"], r["topology"]): r for r in rows}
    for card in CARDS:
        for model in MODELS:
            if not any((card, model, name) in found for name in SLICES):
                continue
            cells, smallest = [], None
            for name in SLICES:
                r = found.get((card, model, name))
                if r is None or "error" in r:
                    cells.append("—" if r is None else "error")
                    continue
                if "by" in r:
                    cells.append(f"**no**: states {r['gib_per_chip']} GiB")
                    continue
                mark = "fits" if r["fits"] else "**no**"
                cells.append(f"{mark} {r['gib_per_chip']} GiB, {r['step_s_estimate']} s")
                total = r["chips"] * r["hbm_gib"]
                if r["fits"] and (smallest is None or total < smallest[1]):
                    smallest = (name, total)
            best = smallest[0] if smallest else "none listed"
            lines.append(f"| {card} | {model} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/tpu_plan.jsonl")
    parser.add_argument("--table", help="print the Markdown table of a results file and stop")
    parser.add_argument("--cards", default="grpo,ppo", help=f"of {', '.join(CARDS)}")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--slices", default=",".join(SLICES))
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per plan")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line]
        print(table(rows))
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    rows = [r for r in rows if "error" not in r]
    done = {(r["card"], r["model"], r["topology"]) for r in rows}
    slices = sorted(args.slices.split(","), key=_total_hbm)
    with tempfile.TemporaryDirectory() as tmp:
        folders = {m: write_shape(m, Path(tmp) / m) for m in args.models.split(",")}
        runs = [(c, m) for m in folders for c in args.cards.split(",")]
        for first_fit_only in (True, False):
            for card, model in runs:
                for name in slices:
                    if first_fit_only and _fits_somewhere(rows, card, model):
                        break
                    if (card, model, name) in done:
                        continue
                    row = resident_only(card, model, name, folders[model])
                    row = row or plan_one(card, model, name, folders[model], args.timeout)
                    print(json.dumps(row), flush=True)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    rows.append(row)
                    done.add((card, model, name))


def _fits_somewhere(rows: list[dict], card: str, model: str) -> bool:
    return any(r.get("fits") and r["card"] == card and r["model"] == model for r in rows)


if __name__ == "__main__":
    main()
