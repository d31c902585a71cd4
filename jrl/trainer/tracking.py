"""Metric loggers named by ``trainer.logger`` (console in verl's line format, JSON lines, ...)."""

from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path
from typing import Any

OPTIONAL_LOGGERS = {"wandb": "wandb", "tensorboard": "tensorboardX", "mlflow": "mlflow"}


def format_console_line(data: dict[str, Any], step: int) -> str:
    """verl's console line: ``step:N - name:value - ...`` with each number written in full."""
    parts = [f"step:{step}"]
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            continue
        if isinstance(value, numbers.Integral):
            parts.append(f"{key}:{value}")
        else:
            parts.append(f"{key}:{float(value)!r}")
    return " - ".join(parts)


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
    def __init__(self, log_dir: Path):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    def log(self, data: dict[str, Any], step: int) -> None:
        for key, value in data.items():
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                self._writer.add_scalar(key, float(value), step)

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    def __init__(self, project: str, experiment: str, config: dict[str, Any]):
        import wandb

        self._run = wandb.init(project=project, name=experiment, config=config)

    def log(self, data: dict[str, Any], step: int) -> None:
        self._run.log(data, step=step)

    def close(self) -> None:
        self._run.finish()


class Tracking:
    """Fans each step's metrics out to the loggers named in ``trainer.logger``."""

    def __init__(
        self,
        loggers: list[str] | str,
        *,
        project: str,
        experiment: str,
        run_dir: Path,
        config: dict[str, Any] | None = None,
    ):
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        self._check_installed(names)
        self.loggers: list[Any] = []
        for name in names:
            if name == "console":
                self.loggers.append(ConsoleLogger())
            elif name == "file":
                path = os.environ.get("JRL_FILE_LOGGER_PATH") or Path(run_dir) / "metrics.jsonl"
                self.loggers.append(JsonLinesLogger(Path(path)))
            elif name == "tensorboard":
                tb_dir = os.environ.get("TENSORBOARD_DIR") or Path(run_dir) / "tensorboard"
                self.loggers.append(TensorboardLogger(Path(tb_dir)))
            elif name == "wandb":
                self.loggers.append(WandbLogger(project, experiment, config or {}))
            else:
                raise ValueError(
                    f"trainer.logger: unknown logger {name!r}; available: console, file, "
                    "tensorboard, wandb"
                )

    @staticmethod
    def _check_installed(names: list[str]) -> None:
        import importlib.util

        for name in names:
            module = OPTIONAL_LOGGERS.get(name)
            if module and importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"trainer.logger includes {name!r} but the {module!r} package is not "
                    "installed: "
                    f"`pip install {module}`, or drop it, e.g. trainer.logger=['console']"
                )

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def _json_value(value: Any) -> Any:
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    return value
