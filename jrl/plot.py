"""``python -m jrl.plot RUN_DIR``: PNG curves of a run from ``RUN_DIR/metrics.jsonl``.

Writes into ``RUN_DIR/plots/``: reward (critic/score), response length, KL (actor/kl_loss,
actor/reward_kl_penalty, actor/ppo_kl), entropy (actor/entropy) and validation scores (every
``val-core/...`` metric), each only when the run logged it. A step logged twice (a resumed run)
counts with its last value. Needs matplotlib: ``pip install "jrl[plot]"``.

`validation_summary` is the one line a training run ends with: its first and last validation
score, the steps and the time between, and where the plot is.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from jrl.trainer.io.tracking import METRICS_FILE

PLOT_EXTRA = 'pip install "jrl[plot]"'


@dataclasses.dataclass(frozen=True)
class Figure:
    """One PNG: the curves of `keys` (or of every key starting with `prefix`) against step; with
    `band`, each key's ``/min`` and ``/max`` siblings of a ``/mean`` are shaded around it."""

    name: str
    title: str
    keys: tuple[str, ...] = ()
    prefix: str | None = None
    band: bool = False


FIGURES = (
    Figure("reward", "Reward (critic/score)", ("critic/score/mean",), band=True),
    Figure("response_length", "Response length (tokens)", ("response_length/mean",), band=True),
    Figure("kl", "KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    Figure("entropy", "Entropy", ("actor/entropy",)),
    Figure("validation", "Validation", prefix="val-core/"),
)

Series = dict[str, list[tuple[int, float]]]


def read_metrics(path: Path, start: int = 0) -> Series:
    """Each metric's (step, value) points from a metrics JSON-lines file, from byte `start` on
    (where one run began appending), sorted by step; a step's last row wins. Non-finite values
    (written as text) are kept as NaN."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file; train with this run directory first")
    by_step: dict[int, dict[str, float]] = {}
    content = path.read_bytes()
    before = content[:start].count(b"\n")
    lines = content[start:].decode("utf-8").splitlines()
    for number, line in enumerate(lines, before + 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step, data = int(row["step"]), row["data"]
            if not isinstance(data, dict):
                raise TypeError("'data' is not an object")
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{path}:{number}: not a metrics row ({err}); expected "
                '{"step": N, "data": {...}}'
            ) from err
        values = {k: _to_float(v) for k, v in data.items()}
        by_step.setdefault(step, {}).update({k: v for k, v in values.items() if v is not None})
    if not by_step:
        raise ValueError(f"{path}: the metrics file is empty; nothing to plot")
    series: Series = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            series.setdefault(key, []).append((step, value))
    return series


def plot_run(run_dir: str | Path) -> list[Path]:
    """Writes the run's PNGs into ``run_dir/plots/`` and returns their paths. Figures without
    data are skipped. Raises FileNotFoundError/ValueError for a missing or empty metrics file and
    ImportError without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError(f"jrl.plot needs matplotlib: {PLOT_EXTRA}")
    run_dir = Path(run_dir)
    series = read_metrics(run_dir / METRICS_FILE)
    out_dir = run_dir / "plots"
    written = []
    for figure in FIGURES:
        keys = figure_keys(figure, series)
        if keys:
            out_dir.mkdir(parents=True, exist_ok=True)
            written.append(_draw(figure, keys, series, out_dir / f"{figure.name}.png"))
    return written


def plot_after_training(run_dir: str | Path) -> list[Path]:
    """`plot_run` for the end of training: prints one line saying where the plots went, or why
    there are none (no matplotlib, no metrics), and never fails the run for those reasons."""
    try:
        paths = plot_run(run_dir)
    except (ImportError, FileNotFoundError, ValueError) as err:
        print(f"jrl: plots skipped: {err}", flush=True)
        return []
    print(f"jrl: {len(paths)} plots written to {Path(run_dir) / 'plots'}", flush=True)
    return paths


def validation_summary(
    run_dir: str | Path, seconds: float, plots: list[Path], start: int = 0
) -> str | None:
    """'val reward 0.22 -> 0.38 in 8 steps, 7m41s; plot: RUN_DIR/plots/validation.png' from the
    metrics this run appended from byte `start` on (an earlier run in the same folder wrote
    the rows before): the first ``val-core/.../mean@N`` score (the first data source by name)
    at its first and last validation. None without a metrics file or without two validations."""
    try:
        series = read_metrics(Path(run_dir) / METRICS_FILE, start)
    except (FileNotFoundError, ValueError):
        return None
    scores = sorted(k for k in series if k.startswith("val-core/") and "/mean@" in k)
    if not scores or len(series[scores[0]]) < 2:
        return None
    (first_step, first), (last_step, last) = series[scores[0]][0], series[scores[0]][-1]
    minutes, secs = divmod(round(seconds), 60)
    steps = last_step - first_step
    line = f"val reward {first:.2f} -> {last:.2f} in {steps} steps, {minutes}m{secs:02d}s"
    shown = [path for path in plots if path.stem == "validation"]
    return line + (f"; plot: {shown[0].resolve()}" if shown else "")


def figure_keys(figure: Figure, series: Series) -> list[str]:
    """The keys of `figure` that `series` has finite values for."""
    names = (
        sorted(k for k in series if k.startswith(figure.prefix)) if figure.prefix else figure.keys
    )
    return [k for k in names if any(math.isfinite(v) for _, v in series.get(k, []))]


def _draw(figure: Figure, keys: list[str], series: Series, path: Path) -> Path:
    from matplotlib.figure import Figure as MplFigure  # no pyplot: no global backend state

    fig = MplFigure(figsize=(7, 4))
    draw_axis(fig.subplots(), figure, keys, series)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, path)
    return path


def draw_axis(ax: Any, figure: Figure, keys: list[str], series: Series) -> None:
    """Draws `figure`'s curves of `keys` from `series` on the matplotlib axes `ax`."""
    from matplotlib.ticker import MaxNLocator

    for key in keys:
        steps, values = zip(*series[key], strict=True)
        (line,) = ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
        low, high = (dict(series.get(key.removesuffix("/mean") + s, [])) for s in ("/min", "/max"))
        band_steps = sorted(low.keys() & high.keys())
        if figure.band and key.endswith("/mean") and band_steps:
            ax.fill_between(
                band_steps,
                [low[s] for s in band_steps],
                [high[s] for s in band_steps],
                alpha=0.2,
                color=line.get_color(),
                label="min-max",
            )
    ax.set_title(figure.title)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _to_float(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
        return float(value)
    return None


def main(argv: list[str] | None = None) -> int:
    """CLI: plot a run directory; errors go to stderr with exit code 2."""
    parser = argparse.ArgumentParser(
        prog="python -m jrl.plot",
        description=f"Plot a run's curves from RUN_DIR/{METRICS_FILE} into RUN_DIR/plots/.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="trainer.default_local_dir of the run")
    args = parser.parse_args(argv)
    try:
        paths = plot_run(args.run_dir)
    except (ImportError, FileNotFoundError, ValueError) as err:
        print(f"jrl.plot: error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
