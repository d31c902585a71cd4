"""A small run of bench/rollout.py: every workload reports sane, consistent JSON."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = "--shape tiny --dtype fp32 --prompt 8 --new 6 --batches 4 --mixed-rows 8 --slots 4"
MIXED = "--mixed-new 12 --min-prompt 2 --stop-every 6"


def test_rollout_bench_tiny_reports_every_workload():
    cmd = [sys.executable, "bench/rollout.py", *ARGS.split(), *MIXED.split()]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]
    runs = {(r["impl"], r["workload"], r.get("batching")): r for r in lines}
    assert list(runs) == [
        ("jrl", "fixed", "continuous"),
        ("jrl", "mixed", "continuous"),
        ("jrl", "mixed", "static"),
        ("hf", "fixed", None),
        ("hf", "mixed", "static"),
        ("jrl/hf", "fixed", None),
        ("jrl/hf", "mixed", None),
        ("jrl continuous/static", "mixed", None),
    ]
    for key in [("jrl", "fixed", "continuous"), ("hf", "fixed", None)]:
        assert runs[key]["tokens"] == 4 * 6  # EOS ignored: every row runs to --new tokens
    continuous, static = runs[("jrl", "mixed", "continuous")], runs[("jrl", "mixed", "static")]
    assert continuous["tokens"] == static["tokens"]  # the same rows, scheduled differently
    assert continuous["decode_steps"] <= static["decode_steps"]
    assert 8 <= continuous["tokens"] <= 8 * 12
    for r in lines:
        if "tokens_per_s" in r:
            assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
    jrl = runs[("jrl", "fixed", "continuous")]
    assert jrl["decode_steps"] == 5 and 0 < jrl["bandwidth_fraction"]
    ratio = runs[("jrl/hf", "fixed", None)]["tokens_per_s_ratio"]
    assert math.isclose(ratio, jrl["tokens_per_s"] / runs[("hf", "fixed", None)]["tokens_per_s"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_rollout_bench_against_vllm_tiny():
    """`--vs vllm` at the tiny shape: both sides make the same tokens per configuration, their
    timed calls alternate (jrl's call i, vLLM's call i, jrl's call i + 1), and the ratio lines
    divide jrl's tokens/s by vLLM's."""
    args = "--vs vllm --shape tiny --dtype fp32 --batches 8 --prompt 8 --new 6 --repeats 2"
    cmd = [sys.executable, "bench/rollout.py", *args.split()]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    runs = {(r["impl"], r["sampling"]): r for r in lines}
    assert list(runs) == [
        ("jrl", "sample"),
        ("vllm", "sample"),
        ("jrl", "greedy"),
        ("vllm", "greedy"),
        ("jrl/vllm", "sample"),
        ("jrl/vllm", "greedy"),
    ]
    for sampling in ("sample", "greedy"):
        jrl, vllm = runs[("jrl", sampling)], runs[("vllm", sampling)]
        assert jrl["tokens"] == vllm["tokens"] == 8 * 6  # EOS ignored: every row makes --new
        assert (jrl["workload"], jrl["rows"], vllm["n"]) == ("fixed", 8, 4)
        starts = [t for pair in zip(jrl["started_s"], vllm["started_s"], strict=True) for t in pair]
        assert len(starts) == 4 and starts == sorted(starts)
        ratio = runs[("jrl/vllm", sampling)]
        assert (ratio["rows"], ratio["dtype"]) == (8, "fp32")
        expected = jrl["tokens_per_s"] / vllm["tokens_per_s"]
        assert math.isclose(ratio["tokens_per_s_ratio"], expected)
