"""End-to-end: tiny GRPO and PPO runs, bad input at the command line, and 1 vs 8 devices."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jrl import train
from jrl.assets import prepare_for
from jrl.batch import Batch
from jrl.runspec import load_config
from jrl.trainer.ppo.experience import advantage_phase
from jrl.trainer.ppo.trainer import PPOTrainer

REPO = Path(__file__).resolve().parents[1]


def _run_dir(tmp_path: Path) -> str:
    return f"trainer.default_local_dir={tmp_path / 'run'}"


@pytest.mark.parametrize(
    "card, expected",
    [
        ("gsm8k_grpo", ["actor/kl_loss", "actor/pg_loss"]),
        ("gsm8k_ppo", ["critic/vf_loss", "critic/values/mean", "actor/pg_loss"]),
    ],
)
def test_tiny_run_three_steps(card, expected, tmp_path, capsys):
    metrics = train.main([f"--config=configs/{card}.py:tiny", _run_dir(tmp_path)])
    assert metrics["training/global_step"] == 3
    for key in [
        *expected,
        "critic/score/mean",
        "response_length/mean",
        "timing_s/step",
        "actor/entropy",
        "actor/grad_norm",
        "val-core/openai/gsm8k/reward/mean@1",
    ]:
        assert key in metrics, key
        assert math.isfinite(metrics[key]), (key, metrics[key])
    out = capsys.readouterr().out
    step_lines = [line for line in out.splitlines() if line.startswith("step:")]
    # validation before training (step 0) and three training steps, in verl's console format
    assert [line.split(" - ")[0] for line in step_lines] == ["step:0", "step:1", "step:2", "step:3"]
    assert " - actor/pg_loss:" in step_lines[-1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": ""}
    return subprocess.run(
        [sys.executable, "-m", "jrl.train", "--config=configs/gsm8k_grpo.py:tiny", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bad_override_exits_with_suggestion():
    result = _cli("data.train_batch_sise=8")
    assert result.returncode != 0
    assert "data.train_batch_sise" in result.stderr
    assert "data.train_batch_size" in result.stderr


def test_missing_data_file_exits_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "train.parquet"
    result = _cli(f"data.train_files={missing}")
    assert result.returncode != 0
    assert str(missing) in result.stderr
    assert "data.train_files" in result.stderr


def _grpo_trainer(n_devices: int, tmp_path: Path, micro: int = 1) -> PPOTrainer:
    config, _ = load_config(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            f"trainer.n_gpus_per_node={n_devices}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            _run_dir(tmp_path),
        ]
    )
    prepare_for(config)
    return PPOTrainer.from_config(config)


def test_grpo_step_same_for_any_micro_batch_split_and_device_count(tmp_path):
    """One mini-batch of 8 rows: 8, 4 or 2 micro-batches on one device, or 1 on eight devices."""
    assert len(jax.devices()) == 8
    one = _grpo_trainer(1, tmp_path)
    others = [_grpo_trainer(1, tmp_path, micro=2), _grpo_trainer(1, tmp_path, micro=4)]
    eight = _grpo_trainer(8, tmp_path)
    assert eight.mesh.shape["fsdp"] == 8
    prompts = next(iter(one.train_loader.epoch(0)))
    batch, _ = one.make_experience(prompts, 1, {})
    # a random model scores 0 everywhere; random outcome scores give non-zero GRPO advantages
    mask = batch.tensors["response_mask"]
    scores = np.zeros(mask.shape, np.float32)
    last = np.maximum(mask.sum(-1) - 1, 0)
    scores[np.arange(len(batch)), last] = np.random.default_rng(0).normal(size=len(batch))
    scored = batch.union(Batch({"token_level_scores": scores}))
    batch, _ = advantage_phase(scored, one.run.algorithm, one.kl_ctrl, bypass=False)
    assert np.abs(batch.tensors["advantages"]).max() > 0
    ref_one, _ = one.actor.compute_log_prob(batch)
    ref_eight, _ = eight.actor.compute_log_prob(batch)
    np.testing.assert_allclose(ref_one, ref_eight, rtol=1e-5, atol=1e-5)

    before = jax.tree.leaves(jax.device_get(one.ref.params))
    m1 = one.actor.update(batch, 1, lr_step=0)
    p1 = jax.tree.leaves(jax.device_get(one.actor.params))
    assert any(not np.allclose(a, b) for a, b in zip(p1, before, strict=True))  # params moved
    delta1 = np.concatenate([(a - b).ravel() for a, b in zip(p1, before, strict=True)])
    for other in [*others, eight]:
        m = other.actor.update(batch, 1, lr_step=0)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            np.testing.assert_allclose(m1[key], m[key], rtol=1e-4, atol=1e-6, err_msg=key)
        p = jax.tree.leaves(jax.device_get(other.actor.params))
        # Adam divides by sqrt(v): compare the updates as a whole, and each parameter loosely
        delta = np.concatenate([(a - b).ravel() for a, b in zip(p, before, strict=True)])
        assert np.linalg.norm(delta1 - delta) <= 1e-3 * np.linalg.norm(delta1)
        for a, b in zip(p1, p, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
