"""Fused log-prob + entropy: time and memory of each `jrl_kernels.logprob_entropy` implementation.

One step = forward and backward of sum(log p · g1 + H · g2) (random cotangents g1, g2) with
respect to hidden [N, D] and the LM head [D, V], bf16 inputs. Every implementation (naive,
chunked, pallas_gpu, pallas_tpu) runs on the same problem, each in its own subprocess so that its
peak memory is its own; the Pallas kernels of another backend are skipped with a line saying why.

    python bench/logprob_kernel.py                 # N 16384, D 896 and 3584, V 151936 (a GPU/TPU)
    python bench/logprob_kernel.py --small         # N 512, D 64, V 8192: seconds on a CPU
    python bench/logprob_kernel.py --shape 4096,896,151936 --impls naive,chunked
    JAX_PLATFORMS=cpu python bench/logprob_kernel.py --tpu-gates   # libtpu, no TPU needed

One JSON line per (D, implementation): `fwd_bwd_ms` and `fwd_ms` (means over --steps after
--warmup), `temp_bytes` (XLA's compiled memory analysis of the forward + backward), `peak_bytes`
(the device's `peak_bytes_in_use`; null where the backend does not report it) and
`peak_above_inputs_bytes` (less the inputs), `loss` (the same for every implementation up to
rounding). Then one `summary` line per D and implementation with its ratios to naive and chunked
and the goals: peak memory at most a tenth of naive's, forward + backward no slower than naive
and at least 1.3x faster than chunked.

`--tpu-gates` compiles (never runs) forward + backward with the real TPU compiler for the slices
of `TPU_GATES`, the rows split over `fsdp` and the LM head laid out as the trainer lays it out
(D over `fsdp`, V over `tensor`), and prints one JSON line per slice: per-chip bytes (argument +
output + temp - alias) of naive, of chunked and pallas_tpu as they run now (vocabulary-parallel
under a mesh) and `before` (the earlier path: Pallas with the whole LM head on every chip,
chunked partitioned by XLA), their ratios to naive, and whether both fused implementations are
within the slice's bound. A naive program too big to compile is counted as the temporaries its
RESOURCE_EXHAUSTED error reports plus its arguments and outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IMPLS = ("naive", "chunked", "pallas_gpu", "pallas_tpu")
KERNEL_BACKENDS = {"pallas_gpu": ("gpu", "cuda"), "pallas_tpu": ("tpu",)}
FULL = {"tokens": 16384, "dims": (896, 3584), "vocab": 151936, "steps": 10, "warmup": 2}
SMALL = {"tokens": 512, "dims": (64,), "vocab": 8192, "steps": 3, "warmup": 1}
# (slice, N, D, V, largest per-chip bytes of a fused implementation relative to naive's).
TPU_GATES = (
    ("v5e:4x4", 16384, 3584, 152064, 0.5),
    ("v5p:4x4x4", 16384, 3584, 152064, 0.5),
    ("v5e:1x1", 16384, 896, 151936, 0.1),
)
GATE_IMPLS = ("chunked", "pallas_tpu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="a tiny problem (CPU, seconds)")
    p.add_argument("--shape", help="N,D,V (overrides the default problem)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated implementations")
    p.add_argument("--steps", type=int, help="timed steps")
    p.add_argument("--warmup", type=int, help="untimed steps first (compilation included)")
    p.add_argument(
        "--tpu-gates",
        action="store_true",
        help="per-chip memory of forward + backward compiled for TPU slices (needs libtpu only)",
    )
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    spec = dict(SMALL if args.small else FULL)
    if args.shape:
        try:
            tokens, dim, vocab = (int(x) for x in args.shape.split(","))
        except ValueError:
            p.error(f"--shape must be N,D,V (three integers), got {args.shape!r}")
        spec.update(tokens=tokens, dims=(dim,), vocab=vocab)
    args.tokens, args.dims, args.vocab = spec["tokens"], spec["dims"], spec["vocab"]
    args.steps = args.steps or spec["steps"]
    args.warmup = spec["warmup"] if args.warmup is None else args.warmup
    args.impls = [x for x in args.impls.split(",") if x]
    unknown = sorted(set(args.impls) - set(IMPLS))
    if unknown:
        p.error(f"unknown --impls {unknown}; choose from {', '.join(IMPLS)}")
    return args


def _mean_ms(fn, args: tuple, steps: int, warmup: int) -> float:
    """Mean wall time of `fn(*args)` in ms over `steps` calls after `warmup` calls."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(steps):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / steps * 1e3


def measure(impl: str, tokens: int, dim: int, vocab: int, steps: int, warmup: int) -> dict:
    """Runs one implementation on one problem in this process."""
    import jax
    import jax.numpy as jnp

    from jrl_kernels import logprob_entropy

    keys = jax.random.split(jax.random.key(0), 5)
    hidden = jax.random.normal(keys[0], (tokens, dim), jnp.bfloat16)
    lm_head = (jax.random.normal(keys[1], (dim, vocab)) * dim**-0.5).astype(jnp.bfloat16)
    targets = jax.random.randint(keys[2], (tokens,), 0, vocab)
    g_logprob = jax.random.normal(keys[3], (tokens,))
    g_entropy = jax.random.normal(keys[4], (tokens,))
    inputs = (hidden, lm_head, targets, g_logprob, g_entropy)
    device = jax.local_devices()[0]
    in_use = (device.memory_stats() or {}).get("bytes_in_use")

    def outputs(h, w, t):
        return logprob_entropy(h, w, t, 1.0, impl=impl)

    def loss(h, w, t, g1, g2):
        logprob, entropy = outputs(h, w, t)
        return jnp.sum(logprob * g1 + entropy * g2)

    fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    compiled = fwd_bwd.lower(*inputs).compile()
    fwd_bwd_ms = _mean_ms(compiled, inputs, steps, warmup)
    fwd_ms = _mean_ms(jax.jit(outputs), inputs[:3], steps, warmup)
    value = float(compiled(*inputs)[0])
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    return {
        "fwd_bwd_ms": round(fwd_bwd_ms, 3),
        "fwd_ms": round(fwd_ms, 3),
        "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
        "peak_bytes": peak,
        "peak_above_inputs_bytes": None if peak is None or in_use is None else peak - in_use,
        "loss": value,
    }


def run_worker(impl: str, args: argparse.Namespace, dim: int) -> dict[str, Any]:
    """One implementation in a subprocess (device memory preallocation off)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", impl]
    cmd += ["--shape", f"{args.tokens},{dim},{args.vocab}"]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail) or f"exit code {proc.returncode}"}
    return json.loads(lines[-1])


def summarise(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Ratios of each implementation to naive and chunked, and the goals, for one problem."""
    naive, chunked = records.get("naive", {}), records.get("chunked", {})
    lines = []
    for impl, rec in records.items():
        if impl == "naive" or "fwd_bwd_ms" not in rec:
            continue
        line: dict[str, Any] = {"impl": impl}
        if "fwd_bwd_ms" in naive:
            line["speedup_vs_naive"] = round(naive["fwd_bwd_ms"] / rec["fwd_bwd_ms"], 3)
            for key in ("temp_bytes", "peak_bytes", "peak_above_inputs_bytes"):
                if rec.get(key) and naive.get(key):
                    line[f"{key}_vs_naive"] = round(rec[key] / naive[key], 4)
            memory = line.get("peak_bytes_vs_naive", line.get("temp_bytes_vs_naive"))
            line["goal_memory_tenth_of_naive"] = memory is not None and memory <= 0.1
            line["goal_not_slower_than_naive"] = line["speedup_vs_naive"] >= 1.0
        if impl != "chunked" and "fwd_bwd_ms" in chunked:
            line["speedup_vs_chunked"] = round(chunked["fwd_bwd_ms"] / rec["fwd_bwd_ms"], 3)
            line["goal_1.3x_chunked"] = line["speedup_vs_chunked"] >= 1.3
        lines.append(line)
    return lines


def _shard_bytes(structs: Any) -> int:
    """Bytes of one device's shard of each `jax.ShapeDtypeStruct` in `structs`."""
    import jax

    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        for x in jax.tree.leaves(structs)
    )


def compiled_bytes(impl: str, mesh: Any, tokens: int, dim: int, vocab: int, before: bool) -> dict:
    """Per-chip bytes of forward + backward of `impl` compiled for `mesh` (rows over fsdp, the
    LM head D over fsdp and V over tensor); `before`: without the vocabulary-parallel op. A
    program that does not fit is counted from the temporaries its error reports."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jrl.plan.compiled import needed_bytes
    from jrl_kernels.logprob import _logprob_entropy

    def loss(h, w, t, g1, g2):
        logprob, entropy = _logprob_entropy(
            h, w, t, 1.0, impl, None, None, False, vocab_parallel=not before
        )
        return jnp.sum(logprob * g1 + entropy * g2)

    rows, head = P(("data", "fsdp")), P("fsdp", "tensor")
    layout = [
        ((tokens, dim), jnp.bfloat16, P(("data", "fsdp"), None)),
        ((dim, vocab), jnp.bfloat16, head),
        ((tokens,), jnp.int32, rows),
        ((tokens,), jnp.float32, rows),
        ((tokens,), jnp.float32, rows),
    ]
    args = [
        jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
        for shape, dtype, spec in layout
    ]
    outs = (NamedSharding(mesh, P()), (args[0].sharding, args[1].sharding))
    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), out_shardings=outs)
    with jax.set_mesh(mesh):
        try:
            m = fn.lower(*args).compile().memory_analysis()
        except Exception as err:
            outputs = 4 + _shard_bytes(args[:2])  # the float32 loss and both gradients
            need = needed_bytes(str(err), arguments=_shard_bytes(args) + outputs)
            if need is None:
                raise
            return {"bytes": need, "fits": False}
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return {"bytes": total - m.alias_size_in_bytes, "fits": True}


def tpu_gates() -> None:
    """One JSON line per slice of `TPU_GATES` (see the module docstring)."""
    from jrl.parallel import make_mesh
    from jrl.parallel.topology import libtpu_missing, open_slice

    missing = libtpu_missing()
    if missing:
        print(json.dumps({"bench": "logprob_kernel", "gate": "tpu", "skipped": missing}))
        return
    for name, tokens, dim, vocab, bound in TPU_GATES:
        tpu = open_slice(name)
        mesh = make_mesh(tpu.chips, devices=tpu.devices)
        line: dict[str, Any] = {"bench": "logprob_kernel", "gate": "tpu", "slice": name}
        line.update(chips=tpu.chips, tokens=tokens, dim=dim, vocab=vocab, max_vs_naive=bound)
        naive = compiled_bytes("naive", mesh, tokens, dim, vocab, before=False)
        line["naive_bytes"] = naive["bytes"]
        if not naive["fits"]:
            line["naive_note"] = (
                "does not fit: RESOURCE_EXHAUSTED temporaries + arguments + outputs"
            )
        passed = True
        for impl in GATE_IMPLS:
            for before in (True, False):
                key = f"{impl}_before" if before else impl
                got = compiled_bytes(impl, mesh, tokens, dim, vocab, before)
                ratio = round(got["bytes"] / naive["bytes"], 4)
                line[f"{key}_bytes"], line[f"{key}_vs_naive"] = got["bytes"], ratio
                passed &= before or (got["fits"] and ratio <= bound)
        line["pass"] = passed
        print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.tpu_gates:
        tpu_gates()
        return
    if args.worker:
        dim = args.dims[0]
        result = measure(args.worker, args.tokens, dim, args.vocab, args.steps, args.warmup)
        print(json.dumps(result), flush=True)
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave it to the workers
    import jax

    backend = jax.default_backend()
    base = {"bench": "logprob_kernel", "backend": backend, "device": jax.devices()[0].device_kind}
    for dim in args.dims:
        problem = {**base, "tokens": args.tokens, "dim": dim, "vocab": args.vocab}
        records: dict[str, dict[str, Any]] = {}
        for impl in args.impls:
            needs = KERNEL_BACKENDS.get(impl)
            if needs and backend not in needs:
                reason = f"{impl} needs a {needs[0].upper()} backend; this run is on {backend}"
                print(json.dumps({**problem, "impl": impl, "skipped": reason}), flush=True)
                continue
            records[impl] = run_worker(impl, args, dim)
            print(json.dumps({**problem, "impl": impl, **records[impl]}), flush=True)
        for line in summarise(records):
            print(json.dumps({**problem, "summary": True, **line}), flush=True)


if __name__ == "__main__":
    main()
