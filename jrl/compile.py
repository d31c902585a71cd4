"""``python -m jrl.compile``: compile every program of a run for a TPU slice, from any host, and
print its per-chip memory plan.

Usage::

    python -m jrl.compile --config=CARD.py[:preset] --topology=NAME [--json] [key=value ...]

NAME is a slice as JAX names it (``v5p:4x4x4``), a Cloud TPU accelerator type (``v5p-128``,
``v5litepod-16``, ``v6e-64``) or ``local`` (this machine's devices). The overrides are
``jrl.train``'s. TPU names need libtpu (``pip install 'jax[tpu]'``), not a TPU. The roles are
built from the model's config.json (and its tokenizer, when present) without reading a weight or
a data file; ``trainer.nnodes`` and ``trainer.n_gpus_per_node`` default to the slice's hosts and
chips. Every program the trainer would compile for a step of full-length rows is compiled:
rollout (each prompt bucket), old log-prob, reference, critic values and update, actor update.

A split card (``actor_rollout_ref.hybrid_engine=False``) gets half of each host's chips for the
trainer and half for the rollout by default (``trainer.*`` and ``rollout.*`` ``nnodes`` and
``n_gpus_per_node``); the training programs are compiled on the trainer's chips, the rollout's
on the rollout's, and the weight-sync program of the largest bucket
(``update_weights_bucket_megabytes``) over both. The plan names each host's chips of either
mesh, each mesh's per-chip memory and the sync's bytes, buckets and estimated time.

The plan: each role's resident states per chip, each phase's compiled peak plus the states the
other roles keep, against the chip's HBM; analytic FLOPs and a roofline estimate of each phase's
time (peak figures named in the output); collective counts. When the run does not fit, each memory
knob the config does not use yet is tried by planning again with it, and its saving is printed.
``--layers=A,B`` compiles A- and B-layer copies of the models instead of the full depth and
extrapolates every figure linearly to it (`jrl.plan.extrapolate`: close to affine, erring high
for the rollout): minutes instead of hours for a 70B model on a laptop; the output says so.

Options: ``--json`` prints one JSON object instead of the table; ``--rollout-buckets=largest``
compiles only the widest prompt bucket (which sets the rollout's peak); ``--no-advice`` skips the
knob trials. Exit status: 0 when the run fits, 1 when it does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from jrl.assets import prepare_for
from jrl.config import ConfigError
from jrl.config.loading import read_config
from jrl.parallel.topology import open_slice
from jrl.plan.advice import advice_lines, advise
from jrl.plan.extrapolate import deep_plan
from jrl.plan.memory import make_plan
from jrl.plan.report import as_json, as_table
from jrl.runspec import load_config

_BAD_INPUT = (
    ConfigError,
    FileNotFoundError,
    ImportError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jrl.compile",
        description="Compile a run for a TPU slice and print its per-chip memory plan.",
    )
    parser.add_argument("--config", required=True, help="CARD.py[:preset], as jrl.train takes")
    parser.add_argument("--topology", required=True, help="v5p:4x4x4, v5p-128, v5litepod-16, local")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    parser.add_argument(
        "--rollout-buckets",
        choices=("all", "largest"),
        default="all",
        help="compile every prompt bucket (default) or the widest only",
    )
    parser.add_argument("--no-advice", action="store_true", help="skip the knob trials")
    parser.add_argument(
        "--layers",
        default=None,
        help="A,B: compile A- and B-layer copies of the models and extrapolate to their depth",
    )
    return parser


def slice_devices(card: list[str], where: Any) -> list[str]:
    """Overrides that give the run of `card` (its --config and overrides) every chip of each
    host: all to the trainer, or with ``hybrid_engine=False`` half each to the trainer and the
    rollout. The card's own overrides come after them and win."""
    per_host = where.chips // where.hosts
    if read_config(card)[0].actor_rollout_ref.hybrid_engine:
        return [f"trainer.nnodes={where.hosts}", f"trainer.n_gpus_per_node={per_host}"]
    if per_host < 2:
        raise ValueError(
            f"actor_rollout_ref.hybrid_engine=False splits each host's chips between the trainer "
            f"and the rollout, but {where.name} has {per_host} chip per host"
        )
    return [
        f"{section}.{key}"
        for section in ("trainer", "rollout")
        for key in (f"nnodes={where.hosts}", f"n_gpus_per_node={per_host // 2}")
    ]


def _config(args: argparse.Namespace, overrides: list[str], where: Any) -> Any:
    card = [f"--config={args.config}", *overrides]
    return load_config([card[0], *slice_devices(card, where), *overrides])[0]


def _layers(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError as err:
        raise ValueError(f"--layers={text!r}: give two layer counts A,B such as 2,4") from err
    return a, b


def run(argv: list[str]) -> tuple[int, dict[str, Any]]:
    """Plans the run of `argv`; returns (exit status, the plan as JSON)."""
    args, overrides = _parser().parse_known_args(argv)
    if args.topology != "local":  # the host only traces; libtpu describes the slice
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    where = open_slice(args.topology)
    config = _config(args, overrides, where)
    prepare_for(config)
    largest = args.rollout_buckets == "largest"
    layers = _layers(args.layers)
    out = sys.stderr if args.json else sys.stdout

    def say(message: str) -> None:
        print(message, file=out, flush=True)

    def plan_with(knobs: list[str]) -> Any:
        """The plan with the extra overrides `knobs` (extrapolated in depth with --layers)."""
        if layers is None:
            return make_plan(_config(args, [*overrides, *knobs], where), where, largest, say)

        def config_of(extra: list[str]) -> Any:
            return _config(args, [*overrides, *knobs, *extra], where)

        return deep_plan(config_of, where, layers, largest, say)

    plan = plan_with([])
    advice: list[dict[str, Any]] = []
    if not plan.fits and not args.no_advice:
        advice = advise(plan, config, plan_with, say)
    report = as_json(plan, advice)
    if args.json:
        print(json.dumps(report, indent=2), flush=True)
    else:
        print(as_table(plan), flush=True)
        if advice:
            print("measured advice (each knob planned again):", *advice_lines(advice), sep="\n")
    return (0 if plan.fits else 1), report


def main(argv: list[str] | None = None) -> int:
    """Command line: exit 0 when the run fits, 1 when it does not, 2 for bad input."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    try:
        return run(argv)[0]
    except _BAD_INPUT as err:
        print(f"jrl.compile: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
