"""Loggers (tensorboard, wandb, mlflow, swanlab read back from their files), the always-written
metrics file, and the MFU / memory metrics against closed forms."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import jax
import pytest
from flax import nnx

from jrl import train
from jrl.models import ModelConfig, init_random
from jrl.plot import plot_run
from jrl.trainer.io.flops import active_params, peak_flops, train_flops
from jrl.trainer.io.metrics import memory_metrics, mfu_metrics
from jrl.trainer.io.tracking import (
    OPTIONAL_LOGGERS,
    RunInfo,
    Tracking,
    WandbLogger,
    mlflow_metric_name,
)

VAL_KEY = "val-core/openai/gsm8k/reward/mean@1"
LOGGER_ENV = (
    "WANDB_MODE",
    "WANDB_API_KEY",
    "WANDB_DIR",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_ALLOW_FILE_STORE",
    "TENSORBOARD_DIR",
    "JRL_FILE_LOGGER_PATH",
    "VERL_FILE_LOGGER_PATH",
    "VERL_FILE_LOGGER_ROOT",
    "SWANLAB_MODE",
    "SWANLAB_API_KEY",
    "SWANLAB_LOG_DIR",
)


@pytest.fixture
def clean_env(monkeypatch):
    """No logger settings from the environment (restored afterwards, whatever the run sets)."""
    for name in LOGGER_ENV:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tiny_run_writes_every_logger(tmp_path, clean_env):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    train.main(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            f"trainer.default_local_dir={run_dir}",
            "trainer.project_name=jrl_test",
            "trainer.experiment_name=all_loggers",
            "trainer.logger=['console','tensorboard','wandb','mlflow']",
        ]
    )
    # metrics.jsonl although 'file' is not listed: validation at step 0, then steps 1..3
    rows = _rows(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    val_steps = [row["step"] for row in rows if VAL_KEY in row["data"]]
    assert val_steps[0] == 0 and len(val_steps) > 1

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("actor/pg_loss")] == [1, 2, 3]
    # the tags are the metrics' own names (torch's writer, which verl uses, keeps '@')
    assert [e.step for e in events.Scalars(VAL_KEY)] == val_steps

    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("jrl_test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "all_loggers" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "actor/pg_loss")
    assert [m.step for m in history] == [1, 2, 3]
    val_history = client.get_metric_history(run.info.run_id, VAL_KEY.replace("@", "_at_"))
    assert [m.step for m in val_history] == val_steps
    assert run.data.params["trainer/experiment_name"] == "all_loggers"

    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert wandb_run.stat().st_size > 0

    names = {path.stem for path in plot_run(run_dir)}
    assert {"reward", "response_length", "kl", "entropy", "validation"} <= names


def test_wandb_generations_table_grows_a_row_per_validation(tmp_path, clean_env):
    """verl's layout: one row per validation (step, input_1, output_1, score_1, ...), the rows of
    earlier validations kept."""
    logger = WandbLogger(RunInfo("p", "e", tmp_path, {}))
    samples = [{"input": f"q{i}", "output": f"a{i}", "score": float(i), "step": 0} for i in (1, 2)]
    logger.log_generations(samples, step=0)
    logger.log_generations(samples[::-1], step=5)
    logger.close()
    table = logger.generations
    assert table.columns == [
        "step",
        "input_1",
        "output_1",
        "score_1",
        "input_2",
        "output_2",
        "score_2",
    ]
    assert table.data == [
        [0, "q1", "a1", 1.0, "q2", "a2", 2.0],
        [5, "q2", "a2", 2.0, "q1", "a1", 1.0],
    ]


@pytest.mark.parametrize("name", sorted(OPTIONAL_LOGGERS))
def test_missing_package_names_logger_package_and_extra(name, tmp_path, monkeypatch):
    module = OPTIONAL_LOGGERS[name].module
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda mod, *a: None if mod == module else real_find_spec(mod, *a),
    )
    with pytest.raises(ValueError) as err:
        Tracking(["console", name], project="p", experiment="e", run_dir=tmp_path)
    message = str(err.value)
    extra = OPTIONAL_LOGGERS[name]
    assert f"'{name}'" in message
    assert f"'{extra.package}'" in message
    assert f'pip install "jrl[{extra.extra}]"' in message
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing opened before the check


def test_unknown_logger_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown logger 'nope'.*tensorboard, wandb, mlflow"):
        Tracking(["nope"], project="p", experiment="e", run_dir=tmp_path)


def _log_two_steps(tracking: Tracking) -> None:
    tracking.log({"a": 1.0}, step=1)
    tracking.log({"a": 2.0}, step=2)
    tracking.close()


def test_metrics_file_is_always_written_once(tmp_path, clean_env, monkeypatch):
    _log_two_steps(Tracking([], project="p", experiment="e", run_dir=tmp_path / "none"))
    assert [r["step"] for r in _rows(tmp_path / "none" / "metrics.jsonl")] == [1, 2]

    # 'file' at the default path: the same file, one line per step
    _log_two_steps(Tracking(["file"], project="p", experiment="e", run_dir=tmp_path / "same"))
    assert [r["step"] for r in _rows(tmp_path / "same" / "metrics.jsonl")] == [1, 2]

    # 'file' elsewhere: both files
    elsewhere = tmp_path / "elsewhere.jsonl"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(elsewhere))
    _log_two_steps(Tracking(["file"], project="p", experiment="e", run_dir=tmp_path / "two"))
    assert _rows(elsewhere) == _rows(tmp_path / "two" / "metrics.jsonl")
    assert len(_rows(elsewhere)) == 2

    # verl's variables: its path, else <root>/<project>/<experiment>.jsonl
    monkeypatch.delenv("JRL_FILE_LOGGER_PATH")
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "root"))
    _log_two_steps(Tracking(["file"], project="p", experiment="e", run_dir=tmp_path / "three"))
    assert len(_rows(tmp_path / "root" / "p" / "e.jsonl")) == 2
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    _log_two_steps(Tracking(["file"], project="p", experiment="e", run_dir=tmp_path / "four"))
    assert len(_rows(tmp_path / "verl.jsonl")) == 2


def test_swanlab_offline_run(tmp_path, clean_env):
    pytest.importorskip("swanlab")
    _log_two_steps(Tracking(["swanlab"], project="p", experiment="e", run_dir=tmp_path))
    assert list((tmp_path / "swanlog").glob("run-*/run-*.swanlab"))


def test_mlflow_names_as_verl():
    assert mlflow_metric_name("val-core/openai/gsm8k/acc/mean@4") == (
        "val-core/openai/gsm8k/acc/mean_at_4"
    )
    assert mlflow_metric_name("a//b/c") == "a/b/c"
    assert mlflow_metric_name("x(y)+z: w.v-1") == "x_y__z: w.v-1"


TINY = dict(
    model_type="llama",
    vocab_size=10,
    hidden_size=4,
    intermediate_size=6,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=2,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    rope_theta=1e4,
    max_position_embeddings=16,
)


def test_active_params_count_the_models_weight_matrices():
    config = ModelConfig.from_hf(TINY)
    # per layer: q,o 4x4 + k,v 4x2 = 48, MLP 3*4*6 = 72; two layers; embedding + head 2*10*4
    assert active_params(config) == 2 * (48 + 72) + 80 == 320
    params = jax.tree.leaves(nnx.state(init_random(config), nnx.Param))
    assert sum(p.size for p in params if p.ndim == 2) == 320


def test_train_flops_closed_form():
    config = ModelConfig.from_hf(TINY)
    # 6*N*tokens + 6 * sum(s^2) * head_dim * heads * layers (causal attention)
    assert train_flops(config, [3, 5]) == 6 * 320 * 8 + 6 * (9 + 25) * 2 * 2 * 2
    sliding = ModelConfig.from_hf({**TINY, "model_type": "mistral", "sliding_window": 4})
    # every layer attends to at most 4 tokens: 3*3 + 5*4
    assert train_flops(sliding, [3, 5]) == 6 * 320 * 8 + 6 * (9 + 20) * 2 * 2 * 2


# verl's tests/utils/test_flops_counter.py (HEAD b178a3c, 2026-01-29): config.json fields and the
# FLOPs verl counts for batches of lengths [512, 1024, 2048] and [4096, 4096, 4096].
VERL_FLOPS_CASES = {
    "llama": (  # llama2-7B
        dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32),
        dict(num_attention_heads=32, num_key_value_heads=32),
        (149226491215872, 536372695793664),
    ),
    "qwen2": (  # Qwen2.5-7B-Instruct
        dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28),
        dict(num_attention_heads=28, num_key_value_heads=4),
        (167073690943488, 591764889010176),
    ),
    "qwen3": (  # Qwen3-8B
        dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36),
        dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128),
        (180997438046208, 648394032807936),
    ),
    "mistral": (  # Mistral-Small-24B-Instruct-2501
        dict(vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40),
        dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128),
        (512303699066880, 1787393589903360),
    ),
    "qwen3_moe": (  # Qwen3-30B-A3B-Base: 8 of 128 experts of 768 per token, every layer sparse
        dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48),
        dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
             num_experts_per_tok=8, moe_intermediate_size=768),
        (78593069678592, 306570470621184),
    ),
    "gemma3_text": (  # Gemma3-12B-IT, every 6th layer global, the others a 1024 window
        dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48),
        dict(num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=1024),
        (279084659638272, 963929979224064),
    ),
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(VERL_FLOPS_CASES))
def test_train_flops_match_verl_flops_counter(model_type):
    shape, attention, expected = VERL_FLOPS_CASES[model_type]
    config = ModelConfig.from_hf({"model_type": model_type, **shape, **attention})
    for seqlens, flops in zip(([512, 1024, 2048], [4096] * 3), expected, strict=True):
        assert train_flops(config, seqlens) == flops


def test_peak_flops_by_device_kind():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("NVIDIA H20") == 148e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("TPU v4") == 275e12
    assert peak_flops("TPU v5 lite") == 197e12
    assert peak_flops("TPU v5") == 459e12
    assert peak_flops("TPU v6 lite") == 918e12
    assert peak_flops("cpu") is None


def test_mfu_closed_form_and_absent_on_cpu():
    config = ModelConfig.from_hf(TINY)
    flops = 6 * 320 * 8 + 6 * 34 * 8
    got = mfu_metrics(
        config, [3, 5], 2.0, epochs=3, world_size=4, role="actor", device_kind="NVIDIA H100"
    )
    assert got.keys() == {"perf/mfu/actor"}
    assert math.isclose(got["perf/mfu/actor"], flops * 3 / (2.0 * 989e12 * 4))
    assert mfu_metrics(config, [3, 5], 2.0, epochs=1, world_size=1) == {}  # CPU: unknown peak


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_memory_metrics_take_the_largest_device():
    gib = 1024**3
    devices = [
        _Device({"peak_bytes_in_use": 2 * gib, "peak_pool_bytes": 6 * gib}),
        _Device({"peak_bytes_in_use": 3 * gib, "peak_bytes_reserved": 4 * gib}),
    ]
    assert memory_metrics(devices) == {
        "perf/max_memory_allocated_gb": 3.0,
        "perf/max_memory_reserved_gb": 6.0,
    }
    assert memory_metrics([_Device({"peak_bytes_in_use": gib})]) == {
        "perf/max_memory_allocated_gb": 1.0
    }
    assert memory_metrics() == {}  # CPU devices report no memory stats
