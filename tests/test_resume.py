"""Exact resume: a `:tiny` PPO run killed with SIGKILL (during step 5, or while a checkpoint is
being written) and restarted with ``resume_mode=auto`` logs the same metrics, bitwise, as a run
that was never interrupted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, WatchedRun

from jrl.assets import prepare_tiny

STEPS = 6
# Timings and throughput differ between runs; everything else must not.
TIME_DEPENDENT = ("timing_s/", "timing_per_token_ms/", "perf/")


def _args(run_dir: Path) -> list[str]:
    return [
        "--config=configs/gsm8k_ppo.py:tiny",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=['console','file']",
    ]


def _env(metrics_file: Path) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": "", "JRL_FILE_LOGGER_PATH": str(metrics_file)}


def _run(run_dir: Path, metrics_file: Path, args: list[str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "jrl.train", *(args or _args(run_dir))],
        cwd=REPO,
        env=_env(metrics_file),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _metrics(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["data"] for row in rows}


def _comparable(data: dict) -> dict:
    return {k: v for k, v in data.items() if not k.startswith(TIME_DEPENDENT)}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """An uninterrupted run: its folder holds `run/` (checkpoints) and `metrics.jsonl`."""
    prepare_tiny()
    root = tmp_path_factory.mktemp("reference")
    _run(root / "run", root / "metrics.jsonl")
    return root


@pytest.fixture(scope="module")
def reference(reference_run) -> dict[int, dict]:
    """Metrics of the uninterrupted run."""
    metrics = _metrics(reference_run / "metrics.jsonl")
    assert sorted(metrics) == list(range(STEPS + 1))
    return metrics


def _kill_when(run_dir: Path, metrics_file: Path, condition, args: list[str] | None = None) -> str:
    """Starts a run and SIGKILLs it as soon as `condition(stdout so far)` holds; returns stdout."""
    run = WatchedRun(args or _args(run_dir), env={"JRL_FILE_LOGGER_PATH": str(metrics_file)})
    try:
        run.wait_for(lambda: condition(run.output))
    finally:
        run.process.send_signal(signal.SIGKILL)
        run.finish()
    return run.output


def _assert_resumes_exactly(reference, run_dir, metrics_file, from_step: int) -> str:
    out = _run(run_dir, metrics_file)
    assert f"resumed from {run_dir / f'global_step_{from_step}'} at global step {from_step}" in out
    resumed = _metrics(metrics_file)
    for step in range(from_step + 1, STEPS + 1):
        assert _comparable(resumed[step]) == _comparable(reference[step]), step
    assert resumed[STEPS]["training/global_step"] == STEPS
    return out


def test_sigkill_during_step_five_resumes_exactly(reference, tmp_path):
    run_dir = tmp_path / "run"
    out = _kill_when(run_dir, tmp_path / "killed.jsonl", lambda text: "\nstep:4 - " in text)
    lines = [line.split(" - ")[0] for line in out.splitlines() if line.startswith("step:")]
    assert lines[-1] == "step:4"  # killed after logging step 4, before step 5 finished
    # The step-4 save may or may not have finished when the process died: either way the
    # tracker names a complete step, and the resumed run replays the same numbers.
    tracked = int((run_dir / "latest_checkpointed_iteration.txt").read_text())
    assert tracked in (2, 4)
    _assert_resumes_exactly(reference, run_dir, tmp_path / "resumed.jsonl", tracked)


def test_sigkill_during_a_save_keeps_the_previous_checkpoint(reference, tmp_path):
    run_dir = tmp_path / "run"

    def saving_step_four(_text: str) -> bool:
        return run_dir.is_dir() and any(
            p.name.startswith(".global_step_4.tmp-") for p in run_dir.iterdir()
        )

    _kill_when(run_dir, tmp_path / "killed.jsonl", saving_step_four)
    assert not (run_dir / "global_step_4").exists()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "2"
    _assert_resumes_exactly(reference, run_dir, tmp_path / "resumed.jsonl", 2)
    assert not [p for p in run_dir.iterdir() if ".tmp-" in p.name]  # the stale folder is gone


def test_a_corrupted_chunk_is_never_resumed_from(reference, reference_run, tmp_path):
    """256 random bytes (same size) over the middle of the largest array chunk of the actor's
    model in steps 6 and 4 of a finished run: the rerun warns naming each file, resumes from
    step 2 and replays steps 3-6 bit for bit."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run / "run", run_dir)
    victims = []
    for step in (6, 4):
        chunks = run_dir / f"global_step_{step}" / "actor" / "model" / "ocdbt.process_0" / "d"
        victim = max(chunks.iterdir(), key=lambda p: p.stat().st_size)
        data = bytearray(victim.read_bytes())
        middle = len(data) // 2 - 128
        data[middle : middle + 256] = np.random.default_rng(step).bytes(256)
        victim.write_bytes(bytes(data))
        victims.append(victim)
    out = _assert_resumes_exactly(reference, run_dir, tmp_path / "resumed.jsonl", 2)
    for victim in victims:
        assert f"{victim} is damaged" in out


def _lookup_args(run_dir: Path) -> list[str]:
    """4 steps of configs/lookup_tool_grpo.py (multi-turn rows, tool calls), saved every 2."""
    return [
        "--config=configs/lookup_tool_grpo.py",
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=['console','file']",
    ]


def test_multi_turn_rows_resume_exactly(tmp_path):
    _run(tmp_path / "ref", tmp_path / "ref.jsonl", _lookup_args(tmp_path / "ref"))
    reference = _metrics(tmp_path / "ref.jsonl")
    run_dir = tmp_path / "run"
    args = _lookup_args(run_dir)
    _kill_when(run_dir, tmp_path / "killed.jsonl", lambda text: "\nstep:3 - " in text, args)
    assert int((run_dir / "latest_checkpointed_iteration.txt").read_text()) == 2
    out = _run(run_dir, tmp_path / "resumed.jsonl", args)
    assert f"resumed from {run_dir / 'global_step_2'} at global step 2" in out
    resumed = _metrics(tmp_path / "resumed.jsonl")
    ignored = (*TIME_DEPENDENT, "agent/tool_latency")
    for step in (3, 4):
        assert reference[step]["agent/tool_calls"] > 0
        same = {k: v for k, v in resumed[step].items() if not k.startswith(ignored)}
        assert same == {k: v for k, v in reference[step].items() if not k.startswith(ignored)}
