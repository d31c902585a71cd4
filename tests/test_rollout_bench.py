"""A small run of bench/rollout.py: every workload reports sane, consistent JSON."""

import json
import math
import subprocess
import sys
from pathlib import Path

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
