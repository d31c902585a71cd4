"""The offline pipeline from the command line: SFT a tiny model on the digits task, sample answers
for held-out prompts, and score them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import generate_args
from sft_digits import REPO, digits_sft_args

from jrl.assets import prepare_digits

STEPS = 96
PROMPTS = 48
SAMPLES = 3


def _run(module: str, *args: str) -> str:
    """``python -m MODULE ARGS``; fails with its output unless it succeeds; returns stdout."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{module} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_sft_then_generate_then_evaluate(tmp_path: Path):
    run_dir = tmp_path / "sft"
    _run(
        "jrl.sft",
        *digits_sft_args(
            run_dir,
            f"trainer.total_training_steps={STEPS}",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.checkpoint.save_contents=['model','hf_model']",
        ),
    )
    model = run_dir / f"global_step_{STEPS}" / "actor" / "huggingface"
    assert (model / "model.safetensors").is_file()

    prompts, generated = tmp_path / "prompts.parquet", tmp_path / "generated.parquet"
    pq.write_table(pq.read_table(prepare_digits()["val_files"]).slice(0, PROMPTS), prompts)
    _run("jrl.generate", *generate_args(prompts, generated, model, samples=SAMPLES, batch_size=6))
    responses = [text for row in pq.read_table(generated)["responses"].to_pylist() for text in row]
    assert len(responses) == PROMPTS * SAMPLES
    # the EOS after the answer was trained on, so most answers stop after one digit
    assert sum(len(text) == 1 for text in responses) >= 0.75 * len(responses)

    out = _run("jrl.evaluate", "--config=configs/eval.py", f"data.path={generated}")
    metrics = json.loads(out.strip().splitlines()[-1])
    assert set(metrics) == {
        f"{name}/jrl/digits" for name in ("test_score", "pass@1", "pass@2", "pass@3")
    }
    assert metrics["test_score/jrl/digits"] > 0.8  # a random model: about 1 in 12
    assert metrics["pass@1/jrl/digits"] == pytest.approx(metrics["test_score/jrl/digits"])
    assert metrics["pass@1/jrl/digits"] <= metrics["pass@2/jrl/digits"]
    assert metrics["pass@2/jrl/digits"] <= metrics["pass@3/jrl/digits"]
