"""Smoke runs of the bench scripts at the tiny shape: each reports sane JSON."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_train_step_bench_tiny_reports_both_implementations():
    args = "--shape tiny --steps 2 --warmup 1".split()
    cmd = [sys.executable, "bench/train_step.py", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]
    by_impl = {r["impl"]: r for r in lines}
    assert list(by_impl) == ["jrl", "torch", "jrl/torch"]

    for impl in ("jrl", "torch"):
        r = by_impl[impl]
        assert (r["shape"], r["batch"], r["seq"], r["dtype"]) == ("tiny", 4, 128, "bf16")
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
        assert math.isfinite(r["step_time_s"]) and r["step_time_s"] > 0
        assert r["peak_memory_gb"] > 0
        assert r["mfu"] is None  # no peak FLOP/s is known for a CPU
        # At random init the logits are near zero: the mean next-token NLL is close to ln(vocab).
        assert abs(r["loss"] - math.log(1024)) < 0.1, r["loss"]
    assert by_impl["jrl"]["params"] == by_impl["torch"]["params"]
    assert by_impl["jrl"]["flops_per_step"] == by_impl["torch"]["flops_per_step"]
    # 6 * N * tokens with N = all parameters but the q/k/v biases (2 layers x 8 heads x 32) and the
    # norm scales (2 x 2 x 128 + 128), plus 12 * layers * heads * head_dim * seq^2 * batch.
    matmul_params = by_impl["jrl"]["params"] - 2 * 8 * 32 - (2 * 2 * 128 + 128)
    attention = 12 * 2 * 4 * 32 * 128**2 * 4
    assert by_impl["jrl"]["flops_per_step"] == 6 * matmul_params * 4 * 128 + attention

    ratio = by_impl["jrl/torch"]
    jrl, torch = by_impl["jrl"], by_impl["torch"]
    assert math.isclose(ratio["tokens_per_s_ratio"], jrl["tokens_per_s"] / torch["tokens_per_s"])
    assert math.isclose(ratio["peak_memory_ratio"], jrl["peak_memory_gb"] / torch["peak_memory_gb"])


def test_checkpoint_bench_tiny_round_trips_and_sizes():
    cmd = [sys.executable, "bench/checkpoint.py", "--shape", "tiny", "--hf-model"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]
    by_key = {(r["impl"], r["measure"]): r for r in lines}
    assert list(by_key) == [
        ("jrl-no-checksums", "save_return"),
        ("jrl-no-checksums", "save_complete"),
        ("jrl", "save_return"),
        ("jrl", "save_complete"),
        ("jrl", "size"),
        ("jrl", "checksum_pass"),
        ("numpy", "save"),
        ("numpy", "size"),
        ("jrl-no-checksums", "restore"),
        ("jrl", "verify_pass"),
        ("jrl", "restore"),
        ("numpy", "load"),
        ("jrl/numpy", "ratio"),
        ("checksums/none", "ratio"),
    ]
    assert {(r["shape"], r["devices"]) for r in lines} == {("tiny", 8)}  # conftest's 8 devices
    for key in (("jrl", "restore"), ("jrl-no-checksums", "restore"), ("numpy", "load")):
        assert by_key[key]["equal"] is True and by_key[key]["optimizer_equal"] is True
    save_return, save_complete = (
        by_key[("jrl", m)]["seconds"] for m in ("save_return", "save_complete")
    )
    assert 0 < save_return <= save_complete

    # fp32 parameters and two fp32 AdamW moments: the .npy files hold 12 bytes per parameter
    # plus headers; Orbax's compression saves a little on random weights, never most of it.
    raw = 12 * lines[0]["params"]
    numpy_bytes = by_key[("numpy", "size")]["bytes"]
    jrl_size = by_key[("jrl", "size")]
    assert raw < numpy_bytes < raw * 1.05
    assert jrl_size["bytes"] == jrl_size["model_bytes"] + jrl_size["optimizer_bytes"]
    assert 0.5 * raw < jrl_size["bytes"] < 1.1 * raw
    assert jrl_size["hf_model_bytes"] >= 4 * lines[0]["params"]  # safetensors in fp32
    assert jrl_size["step_folder_bytes"] > jrl_size["bytes"] + jrl_size["hf_model_bytes"]

    ratio = by_key[("jrl/numpy", "ratio")]
    assert math.isclose(ratio["size_ratio"], jrl_size["bytes"] / numpy_bytes)
    numpy_save = by_key[("numpy", "save")]["seconds"]
    assert math.isclose(ratio["save_complete_ratio"], save_complete / numpy_save)
    restore, load = by_key[("jrl", "restore")]["seconds"], by_key[("numpy", "load")]["seconds"]
    assert math.isclose(ratio["restore_ratio"], restore / load)
    costs = by_key[("checksums/none", "ratio")]
    unverified = by_key[("jrl-no-checksums", "restore")]["seconds"]
    assert math.isclose(costs["restore_ratio"], restore / unverified)
    verify = by_key[("jrl", "verify_pass")]["seconds"]
    assert math.isclose(costs["verify_pass_of_restore"], verify / unverified)


def test_actor_update_memory_drops_with_fused_kernels():
    """bench/actor_memory.py's measure on a tiny model with a large vocabulary, where the logits
    dominate: the compiled actor update with ``use_fused_kernels`` plans less memory than the
    materialised logits, by at least one float32 copy of them."""
    sys.path.insert(0, str(ROOT))
    from bench.actor_memory import update_memory
    from jrl.runspec import load_config
    from tests.helpers import tiny_llama

    model = tiny_llama(vocab_size=65536, max_position_embeddings=128)
    sizes = [
        "data.max_prompt_length=16",
        "data.max_response_length=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    ]
    peaks = {}
    for fused in (False, True):
        argv = [f"--config={ROOT}/configs/gsm8k_grpo.py", *sizes]
        argv.append(f"actor_rollout_ref.model.use_fused_kernels={fused}")
        config, _ = load_config(argv)
        peaks[fused] = update_memory(config, model, micro_batches=1)["peak_bytes"]
    logits_bytes = 4 * 64 * 65536 * 4  # rows x response tokens x vocab x float32
    assert peaks[True] < peaks[False] - logits_bytes, peaks


def test_async_bench_reports_each_mode_on_digits(tmp_path):
    cmd = [sys.executable, "bench/async.py", "--cards", "digits", "--steps", "2"]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = {line["mode"]: line for line in map(json.loads, proc.stdout.splitlines())}
    assert list(lines) == ["sync", "one_step_off", "fully_async"]
    assert lines["sync"]["staleness_mean"] == 0 and lines["sync"]["overlap_fraction"] == 0
    assert lines["one_step_off"]["staleness_mean"] == 1  # step 2 trains on version-0 rows
    for line in lines.values():
        assert line["steps"] == 2 and 0 <= line["val_after"] <= 1
        assert 0 <= line["overlap_fraction"] <= 1
