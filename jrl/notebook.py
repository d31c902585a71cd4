"""Notebook helpers: run a jrl command with a live plot of its metrics.

`run("jrl.train", [...], run_dir=...)` starts ``python -m jrl.train ...`` in a subprocess, prints
its progress lines and one short line per logged step, and redraws a PNG of the chosen curves
(reward and response length by default) in the notebook as ``metrics.jsonl`` grows. The
accelerator belongs to the subprocess: a TPU can be opened by one process at a time, so the
notebook's own kernel never has to start JAX's backend.
"""

from __future__ import annotations

import collections
import io
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jrl.plot import FIGURES, Figure, Series, draw_axis, figure_keys, read_metrics
from jrl.trainer.io.tracking import METRICS_FILE

FIGURES_BY_NAME = {figure.name: figure for figure in FIGURES}
DEFAULT_LIVE = ("reward", "response_length")
# Output lines kept for the error message of a failed command.
TAIL_LINES = 40


def live_figures(names: Sequence[str]) -> list[Figure]:
    """The `jrl.plot` figures called `names` ('reward', 'response_length', 'kl', 'entropy',
    'validation'); any other name is a metric key drawn on its own (e.g. 'train/loss')."""
    return [FIGURES_BY_NAME.get(name) or Figure(name, name, (name,)) for name in names]


def last_values(series: Series) -> dict[str, float]:
    """Each metric's value at the last step that logged it, plus that run's last ``step``."""
    out = {key: points[-1][1] for key, points in series.items() if points}
    steps = [points[-1][0] for points in series.values() if points]
    if steps:
        out["step"] = float(max(steps))
    return out


def render_png(figures: Sequence[Figure], series: Series, title: str = "") -> bytes | None:
    """A PNG with one panel per figure that has data, or None when none has."""
    panels = [(figure, figure_keys(figure, series)) for figure in figures]
    panels = [(figure, keys) for figure, keys in panels if keys]
    if not panels:
        return None
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(5.5 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (figure, keys) in zip(axes, panels, strict=True):
        draw_axis(ax, figure, keys, series)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


class _LiveView:
    """The notebook output that shows the latest PNG (nothing outside IPython)."""

    def __init__(self) -> None:
        self.handle = None
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return
        if get_ipython() is not None:
            self._image, self._display = Image, display

    def show(self, png: bytes) -> None:
        if not hasattr(self, "_display"):
            return
        image = self._image(data=png, format="png")
        if self.handle is None:
            self.handle = self._display(image, display_id=True)
        else:
            self.handle.update(image)


def _step_line(step: int, row: dict[str, float], keys: Sequence[str]) -> str:
    """One line for a logged step: the `keys` it has, then its validation scores."""
    keys = [*keys, *sorted(k for k in row if k.startswith("val-core/"))]
    shown = [f"{key} {row[key]:.4g}" for key in keys if key in row and math.isfinite(row[key])]
    return f"step {step}: " + (", ".join(shown) if shown else "logged")


def _read_lines(stream: Any, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


class _Output:
    """A command's output lines: the last ones kept for an error message, all written to the
    log file (when there is one), the ``jrl:`` ones (or all, with `echo`) printed."""

    def __init__(self, log_path: Path | None, echo: bool) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.log = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115
        self.echo = echo

    def drain(self, lines: queue.Queue, seconds: float) -> bool:
        """Takes the lines that arrive within `seconds`; True once the command's output ended."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return True
            self.tail.append(line)
            if self.log is not None:
                self.log.write(line + "\n")
            if self.echo or line.startswith("jrl"):
                print(line, flush=True)
        return False

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def run(
    module: str,
    args: Sequence[str] = (),
    *,
    run_dir: str | os.PathLike | None = None,
    live: Sequence[str] = DEFAULT_LIVE,
    plot_name: str = "live",
    echo: bool = False,
    env: dict[str, str] | None = None,
    poll_s: float = 1.0,
) -> dict[str, float]:
    """Runs ``python -m module *args`` and returns the last logged value of every metric.

    Prints the command's ``jrl:`` progress lines (every line with `echo`), and with `run_dir` (the
    command's ``trainer.default_local_dir``) one line per new step of its ``metrics.jsonl`` and a
    live plot of the `live` curves (see `live_figures`), saved at the end to
    ``run_dir/plots/{plot_name}.png``. The whole output goes to ``run_dir/{module}.log``. Raises
    RuntimeError with the output's last lines when the command fails. Returns {} without
    `run_dir`.
    """
    command = [sys.executable, "-u", "-m", module, *map(str, args)]
    print("$ python -m", module, " ".join(map(str, args)), flush=True)
    run_path = Path(run_dir) if run_dir is not None else None
    metrics_file = run_path / METRICS_FILE if run_path else None
    figures = live_figures(live)
    summary_keys = [key for figure in figures for key in figure.keys]
    view, seen_steps = _LiveView(), -1
    if run_path is not None:
        run_path.mkdir(parents=True, exist_ok=True)
    output = _Output(run_path / f"{module}.log" if run_path else None, echo)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    title = f"{module}: {run_path.name}" if run_path is not None else module
    series: Series = {}
    finished = False
    try:
        while not finished:
            finished = output.drain(lines, poll_s)
            if metrics_file is None or not metrics_file.is_file():
                continue
            try:
                series = read_metrics(metrics_file)
            except ValueError:  # empty, or its last line is still being written
                continue
            rows = _rows_by_step(series)
            new = [step for step in sorted(rows) if step > seen_steps]
            for step in new:
                print(_step_line(step, rows[step], summary_keys), flush=True)
            if new:
                seen_steps = new[-1]
                png = render_png(figures, series, title=title)
                if png is not None:
                    view.show(png)
    finally:
        output.close()
        if process.poll() is None:  # interrupted (or failed) here: stop the command too
            process.terminate()
    status = process.wait()
    if status != 0:
        raise RuntimeError(
            f"python -m {module} failed (exit status {status}); its last lines:\n"
            + "\n".join(output.tail)
        )
    if run_path is None:
        return {}
    png = render_png(figures, series, title=title)
    if png is not None:
        out = run_path / "plots" / f"{plot_name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_bytes(png)
        os.replace(tmp, out)
    return last_values(series)


def _rows_by_step(series: Series) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for key, points in series.items():
        for step, value in points:
            rows.setdefault(step, {})[key] = value
    return rows
