"""Metric loggers named by ``trainer.logger``: console (verl's line format), file (JSON lines),
tensorboard, wandb, mlflow and swanlab.

Whatever the list, every step's metrics are also appended to ``<run_dir>/metrics.jsonl``, the
source of ``python -m jrl.plot``. Loggers that can reach a server stay on the machine unless told
otherwise: wandb runs offline without ``WANDB_MODE``/``WANDB_API_KEY``, swanlab without
``SWANLAB_MODE``/``SWANLAB_API_KEY``, and mlflow writes a local file store under ``run_dir``
without ``MLFLOW_TRACKING_URI``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import numbers
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from jrl.parallel.distributed import is_primary

METRICS_FILE = "metrics.jsonl"


@dataclasses.dataclass(frozen=True)
class Extra:
    """The module an optional logger imports, its package and the jrl extra that installs it."""

    module: str
    package: str
    extra: str


OPTIONAL_LOGGERS = {
    "tensorboard": Extra("tensorboardX", "tensorboardX", "tensorboard"),
    "wandb": Extra("wandb", "wandb", "wandb"),
    "mlflow": Extra("mlflow", "mlflow-skinny", "mlflow"),
    "swanlab": Extra("swanlab", "swanlab", "swanlab"),
}


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What loggers are told about the run: verl's project/experiment names, where its files go
    and the resolved config."""

    project: str
    experiment: str
    run_dir: Path
    config: dict[str, Any]


class Logger(Protocol):
    def log(self, data: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def format_console_line(data: dict[str, Any], step: int) -> str:
    """verl's console line: ``step:N - name:value - ...`` with each number written in full."""
    parts = [f"step:{step}"]
    for key, value in data.items():
        if not _is_number(value):
            continue
        if isinstance(value, numbers.Integral):
            parts.append(f"{key}:{value}")
        else:
            parts.append(f"{key}:{float(value)!r}")
    return " - ".join(parts)


def scalars(data: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict, as floats (booleans and text dropped)."""
    return {key: float(value) for key, value in data.items() if _is_number(value)}


class ConsoleLogger:
    def log(self, data: dict[str, Any], step: int) -> None:
        print(format_console_line(data, step), flush=True)

    def close(self) -> None:
        pass


class JsonLinesLogger:
    """Appends one JSON object per step (``{"step": N, "data": {...}}``) to a file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, data: dict[str, Any], step: int) -> None:
        row = {k: _json_value(v) for k, v in data.items()}
        self._file.write(json.dumps({"step": step, "data": row}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardLogger:
    """Scalars into ``$TENSORBOARD_DIR``, else ``<run_dir>/tensorboard``, under their own names
    (``mean@1`` stays ``mean@1``, as torch's writer that verl uses keeps it; tensorboardX's
    ``add_scalar`` would write '_')."""

    def __init__(self, info: RunInfo):
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.summary_pb2 import Summary

        log_dir = os.environ.get("TENSORBOARD_DIR") or info.run_dir / "tensorboard"
        self._writer = SummaryWriter(str(log_dir))
        self._summary = Summary

    def log(self, data: dict[str, Any], step: int) -> None:
        values = [
            self._summary.Value(tag=key, simple_value=value) for key, value in scalars(data).items()
        ]
        self._writer._get_file_writer().add_summary(self._summary(value=values), step)

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        self._writer.add_text("val/generations", generations_markdown(rows), step)

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """A wandb run named ``experiment`` in ``project``, its files under ``run_dir`` (or
    ``$WANDB_DIR``); offline unless ``WANDB_MODE`` or ``WANDB_API_KEY`` is set."""

    def __init__(self, info: RunInfo):
        import wandb

        offline = not (os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"))
        wandb_dir = None if os.environ.get("WANDB_DIR") else info.run_dir
        if wandb_dir is not None:
            wandb_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=info.project,
            name=info.experiment,
            config=info.config,
            dir=None if wandb_dir is None else str(wandb_dir),
            mode="offline" if offline else None,
        )
        self._generation_rows: list[list[Any]] = []
        self.generations: Any = None  # the last table logged

    def log(self, data: dict[str, Any], step: int) -> None:
        self._run.log(data, step=step)

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """verl's ``val/generations`` table: a row per validation, growing over the run, with
        the columns step, input_1, output_1, score_1, input_2, ..."""
        import wandb

        sample = GENERATION_COLUMNS[1:]
        columns = ["step", *(f"{c}_{i + 1}" for i in range(len(rows)) for c in sample)]
        self._generation_rows.append([step, *(row[c] for row in rows for c in sample)])
        self.generations = wandb.Table(columns=columns, data=self._generation_rows)
        self._run.log({"val/generations": self.generations}, step=step)

    def close(self) -> None:
        self._run.finish()


def mlflow_store_uri(run_dir: str | os.PathLike) -> str:
    """Where a run's mlflow data goes: ``$MLFLOW_TRACKING_URI``, else a file store in
    ``<run_dir>/mlruns`` (allowed through ``MLFLOW_ALLOW_FILE_STORE``, which mlflow 3 asks for)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (Path(run_dir) / "mlruns").resolve().as_uri()


class MlflowLogger:
    """An mlflow run named ``experiment`` in the mlflow experiment ``project``, with the config
    flattened into params, in the run's store (`mlflow_store_uri`)."""

    def __init__(self, info: RunInfo):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(mlflow_store_uri(info.run_dir))
        experiment = self._client.get_experiment_by_name(info.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(info.project)
        )
        self._run_id = self._client.create_run(experiment_id, run_name=info.experiment).info.run_id
        params = [Param(k, v) for k, v in mlflow_params(info.config).items()]
        for start in range(0, len(params), 100):  # mlflow takes at most 100 params per batch
            self._client.log_batch(self._run_id, params=params[start : start + 100])

    def log(self, data: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_metric_name(k), v, now, step) for k, v in scalars(data).items()]
        for start in range(0, len(metrics), 1000):  # and at most 1000 metrics
            self._client.log_batch(self._run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class SwanlabLogger:
    """A swanlab run named ``experiment`` in ``project``, logged under ``$SWANLAB_LOG_DIR`` else
    ``<run_dir>/swanlog``; mode ``$SWANLAB_MODE``, else online with ``SWANLAB_API_KEY`` and
    offline without it."""

    def __init__(self, info: RunInfo):
        import swanlab

        mode = os.environ.get("SWANLAB_MODE") or (
            "online" if os.environ.get("SWANLAB_API_KEY") else "offline"
        )
        self._run = swanlab.init(
            project=info.project,
            name=info.experiment,
            config={"FRAMEWORK": "jrl", **info.config},
            log_dir=os.environ.get("SWANLAB_LOG_DIR") or str(info.run_dir / "swanlog"),
            mode=mode,
        )

    def log(self, data: dict[str, Any], step: int) -> None:
        self._run.log(scalars(data), step=step)

    def close(self) -> None:
        self._run.finish()


GENERATIONS_FILE = "val_generations.jsonl"
GENERATION_COLUMNS = ("step", "input", "output", "score")


def file_logger_path(info: RunInfo) -> Path:
    """Where the ``file`` logger writes: verl's ``$VERL_FILE_LOGGER_PATH`` (or
    ``$JRL_FILE_LOGGER_PATH``), else ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`` as
    verl, else the run's metrics file (verl's default root is the working directory)."""
    path = os.environ.get("VERL_FILE_LOGGER_PATH") or os.environ.get("JRL_FILE_LOGGER_PATH")
    if path:
        return Path(path)
    root = os.environ.get("VERL_FILE_LOGGER_ROOT")
    if root:
        return Path(root) / info.project / f"{info.experiment}.jsonl"
    return Path(info.run_dir) / METRICS_FILE


LOGGERS: dict[str, Callable[[RunInfo], Logger]] = {
    "console": lambda info: ConsoleLogger(),
    "file": lambda info: JsonLinesLogger(file_logger_path(info)),
    "tensorboard": TensorboardLogger,
    "wandb": WandbLogger,
    "mlflow": MlflowLogger,
    "swanlab": SwanlabLogger,
}


class Tracking:
    """Fans each step's metrics out to the loggers named in ``trainer.logger``, and always to
    ``<run_dir>/metrics.jsonl``. In a multi-process run only process 0 logs (`primary`, by
    default whether this is process 0); the others check the names and log nowhere."""

    def __init__(
        self,
        loggers: list[str] | str,
        *,
        project: str,
        experiment: str,
        run_dir: Path,
        config: dict[str, Any] | None = None,
        primary: bool | None = None,
    ):
        names = list(dict.fromkeys([loggers] if isinstance(loggers, str) else loggers))
        check_loggers(names)
        self.run_dir = Path(run_dir)
        info = RunInfo(project, experiment, self.run_dir, config or {})
        self.loggers: list[Logger] = []
        self.primary = is_primary() if primary is None else primary
        if not self.primary:
            return
        try:
            for name in names:
                self.loggers.append(LOGGERS[name](info))
            if not any(_writes(logger, self.metrics_path) for logger in self.loggers):
                self.loggers.append(JsonLinesLogger(self.metrics_path))
        except BaseException:
            self.close()
            raise

    @property
    def metrics_path(self) -> Path:
        """The JSON-lines file that always receives every step's metrics."""
        return self.run_dir / METRICS_FILE

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """Validation samples (``trainer.log_val_generations``): appended to
        ``<run_dir>/val_generations.jsonl`` and shown by the loggers that have tables
        (wandb, tensorboard)."""
        if not rows or not self.primary:
            return
        with open(self.run_dir / GENERATIONS_FILE, "a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps({c: _json_value(row[c]) for c in GENERATION_COLUMNS}) + "\n")
        for logger in self.loggers:
            if hasattr(logger, "log_generations"):
                logger.log_generations(rows, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def generations_markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of validation samples."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(GENERATION_COLUMNS) + " |", "|---" * len(GENERATION_COLUMNS) + "|"]
    lines += ["| " + " | ".join(cell(row[c]) for c in GENERATION_COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def check_loggers(names: list[str]) -> None:
    """Fails on an unknown logger name, or on one whose optional package is not installed."""
    for name in names:
        if name not in LOGGERS:
            raise ValueError(
                f"trainer.logger: unknown logger {name!r}; available: {', '.join(LOGGERS)}"
            )
        extra = OPTIONAL_LOGGERS.get(name)
        if extra and importlib.util.find_spec(extra.module) is None:
            raise ValueError(
                f"trainer.logger includes {name!r} but the {extra.package!r} package is not "
                f'installed: pip install "jrl[{extra.extra}]" (or pip install {extra.package}), '
                "or drop it, e.g. trainer.logger=['console']"
            )


_MLFLOW_INVALID = re.compile(r"[^/\w.\- :]")


def mlflow_metric_name(name: str) -> str:
    """A metric name mlflow accepts, as verl writes it: '@' becomes '_at_', runs of '/' one '/',
    and any other character outside letters, digits, ``_ - . : /`` and space an '_'."""
    name = re.sub(r"/+", "/", name.replace("@", "_at_"))
    return _MLFLOW_INVALID.sub("_", name)


def mlflow_params(config: dict[str, Any], max_length: int = 6000) -> dict[str, str]:
    """The config as mlflow params: nested keys joined by '/', values as text (lists as JSON),
    cut to mlflow's ``max_length`` characters."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), item)
            return
        text = json.dumps(value, default=str) if isinstance(value, list | tuple) else str(value)
        out[mlflow_metric_name(prefix)] = text[:max_length]

    walk("", config)
    return out


def _writes(logger: Logger, path: Path) -> bool:
    return isinstance(logger, JsonLinesLogger) and logger.path.resolve() == path.resolve()


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _json_value(value: Any) -> Any:
    if _is_number(value):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    return value
