"""What the training benches share: a run of ``python -m jrl.train`` in this process whose output
goes to a log file, and the rows of its metrics file."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from jrl import train as jrl_train


def train_quietly(card: Path | str, run_dir: Path, steps: int, overrides: list[str]) -> list[dict]:
    """`steps` steps of `card` (validated before the first and after the last, no checkpoints)
    in a fresh `run_dir`, the trainer's output in ``run_dir/train.log``; the metrics' rows."""
    argv = [
        f"--config={card}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.val_before_train=True",
        "trainer.save_freq=-1",
        "trainer.logger=['file']",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
        *overrides,
    ]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    with open(run_dir / "train.log", "w", encoding="utf-8") as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            jrl_train.main(argv)
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]
