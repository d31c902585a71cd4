"""Shared pieces of the tests: a tiny llama configuration, a training run in a subprocess whose
output is watched line by line, a finiteness check of run metrics and the arguments of a small
generation run."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from jrl.models import ModelConfig

REPO = Path(__file__).resolve().parents[1]

TINY_LLAMA = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    attention_bias=False,
    max_position_embeddings=64,
    model_type="llama",
    eos_token_id=1,
)


def tiny_llama(**changes) -> ModelConfig:
    """`TINY_LLAMA` with some fields changed."""
    return dataclasses.replace(TINY_LLAMA, **changes)


def flatten(tree: dict, prefix: str = "") -> dict:
    """Dotted leaf path -> value of a nested dict (empty dicts are leaves)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def assert_finite(metrics: dict, keys: Iterable[str]) -> None:
    """Each of `keys` is in `metrics` and finite."""
    for key in keys:
        assert math.isfinite(metrics[key]), (key, metrics.get(key))


def generate_args(
    prompts: str | Path,
    output: str | Path,
    model: str | Path,
    *overrides: str,
    samples: int,
    batch_size: int,
) -> list[str]:
    """``jrl.generate`` arguments: `samples` answers of up to 3 tokens (float32, plain sampling,
    on the CPU) per digits-task prompt in `prompts` by the model at `model`, then `overrides`."""
    return [
        f"data.path={prompts}",
        f"data.output_path={output}",
        f"model.path={model}",
        f"data.n_samples={samples}",
        f"data.batch_size={batch_size}",
        "rollout.name=jax",
        "rollout.dtype=float32",
        "rollout.prompt_length=8",
        "rollout.response_length=3",
        "rollout.top_k=-1",
        "rollout.top_p=1.0",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        *overrides,
    ]


def one_tiny_ppo_step(run_dir: Path, *overrides: str) -> dict:
    """One step of the `:tiny` PPO card (no validation) with `overrides`; checks that it ran and
    that the actor's and critic's losses and norms are finite; returns the metrics."""
    from jrl import train

    metrics = train.main(
        [
            "--config=configs/gsm8k_ppo.py:tiny",
            *overrides,
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    assert metrics["training/global_step"] == 1
    assert_finite(
        metrics, ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/values/mean"]
    )
    return metrics


class WatchedRun:
    """``python -m jrl.train ARGS`` in a subprocess (one CPU device), its stdout collected line by
    line while it runs."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jrl.train", *args],
            cwd=REPO,
            env={**os.environ, "XLA_FLAGS": "", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(self.process.stdout), daemon=True
        )
        self._reader.start()

    @property
    def output(self) -> str:
        """Standard output so far."""
        return "".join(self.lines)

    def wait_for(self, condition: Callable[[], bool], timeout: float = 600) -> None:
        """Polls `condition` until it holds; fails if the run ends first or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, "the run ended early:\n" + self.output[-3000:]
            assert time.monotonic() < deadline, "timed out waiting on the run"
            time.sleep(0.002)

    def finish(self, timeout: float = 300) -> int:
        """Waits for the process to end; returns its exit status."""
        code = self.process.wait(timeout=timeout)
        self._reader.join()
        return code
