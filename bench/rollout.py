"""Rollout throughput: jrl's `jax` engine against Hugging Face `generate`, same run, same weights.

Workloads (sampling at temperature 1, no top-k / top-p):
- `fixed`: every prompt `--prompt` tokens long, exactly `--new` new tokens (EOS ignored), for each
  batch size of `--batches`.
- `mixed`: a GSM8K-like mix of `--mixed-rows` prompts of uniformly random length and responses
  that end at an EOS (a set of token ids whose total probability gives about one stop every
  `--stop-every` tokens) or at `--mixed-new` tokens. jrl runs it with continuous batching and with
  static batching in `--slots` slots; transformers in static batches of `--slots` rows.

Prints one JSON line per measurement, then ratio lines: jrl / transformers tokens/s per workload,
and continuous / static for jrl on the mixed workload:

    python bench/rollout.py --shape tiny                 # CPU, a minute or two
    python bench/rollout.py --shape qwen2.5-0.5b         # one GPU

Each implementation runs in its own subprocess and loads the same random weights, written first
(`init_random`, `save_pretrained`, on the CPU) unless `--weights` names an existing folder;
`--shape smollm2` loads the quickstart's SmolLM2-135M-Instruct (`jrl.assets.prepare_smollm2`).

`--vs vllm` measures jrl against vLLM's own `LLM.generate` instead (`rollout_vllm.py` says how):

    python bench/rollout.py --vs vllm --shape tiny       # vLLM installed; seconds once started
    python bench/rollout.py --vs vllm --shape smollm2 --dtype fp32 --batches 128
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import rollout_vllm
from train_step import GIB, SHAPES

ROOT = Path(__file__).resolve().parents[1]
# The implementations compared by each baseline (`--vs`).
IMPLS = {"hf": ("jrl", "hf"), "vllm": ("jrl", "vllm")}
WORKERS = ("jrl", "hf", "vllm", "weights")
DTYPES = ("fp32", "bf16")
PAD = 0
# Per shape: prompt and new tokens of the fixed workload, its batch sizes, and the mixed workload.
WORKLOADS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "prompt": 256,
        "new": 256,
        "batches": [128, 512],
        "mixed_rows": 512,
        "mixed_new": 400,
        "min_prompt": 64,
        "slots": 128,
        "stop_every": 200,
    },
    "smollm2": {
        "prompt": 32,
        "new": 64,
        "batches": [128],
        "mixed_rows": 128,
        "mixed_new": 128,
        "min_prompt": 8,
        "slots": 64,
        "stop_every": 64,
    },
    "tiny": {
        "prompt": 64,
        "new": 64,
        "batches": [16, 64],
        "mixed_rows": 64,
        "mixed_new": 100,
        "min_prompt": 16,
        "slots": 16,
        "stop_every": 40,
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; workload sizes default to the shape's own (for `--vs vllm`, to
    `rollout_vllm.VS_WORKLOADS`)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(WORKLOADS), default="qwen2.5-0.5b")
    p.add_argument("--vs", choices=sorted(IMPLS), default="hf", help="the baseline")
    p.add_argument("--prompt", type=int, help="prompt tokens (fixed workload; mixed maximum)")
    p.add_argument("--new", type=int, help="new tokens per row (fixed workload)")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes of the fixed workload")
    p.add_argument("--mixed-rows", type=int, help="prompts of the mixed workload (0: skip it)")
    p.add_argument("--mixed-new", type=int, help="longest response of the mixed workload")
    p.add_argument("--min-prompt", type=int, help="shortest prompt of the mixed workload")
    p.add_argument("--slots", type=int, help="sequences decoding together")
    p.add_argument("--stop-every", type=int, help="mean tokens between EOS draws (mixed)")
    p.add_argument("--dtype", choices=(*DTYPES, "both"), help="bf16, or both with --vs vllm")
    p.add_argument("--impl", choices=(*WORKERS[:3], "both"), default="both")
    p.add_argument("--n", type=int, default=4, help="answers per prompt (--vs vllm)")
    samplings = rollout_vllm.SAMPLINGS
    p.add_argument("--sampling", nargs="+", choices=samplings, default=list(samplings))
    p.add_argument("--repeats", type=int, default=3, help="timed calls (--vs vllm)")
    p.add_argument("--batched-tokens", type=int, default=8192, help="tokens per step (--vs vllm)")
    p.add_argument("--weights", help="HF folder of the model (written if missing)")
    p.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.impl not in ("both", *IMPLS[args.vs]):
        p.error(f"--impl {args.impl} is not compared with --vs {args.vs}")
    if args.vs == "vllm":
        for key in ("batches", "slots"):
            if getattr(args, key) is None:
                setattr(args, key, rollout_vllm.VS_WORKLOADS[args.shape][key])
        bad = [rows for rows in args.batches if rows % args.n]
        if bad or args.repeats < 1:
            p.error(f"--batches must be multiples of --n {args.n} and --repeats >= 1")
        args.dtype = args.dtype or "both"
        return args
    for key, value in WORKLOADS[args.shape].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.dtype = args.dtype or "bf16"
    return args


def fixed_prompts(args: argparse.Namespace, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """[rows, prompt] random token ids (never PAD) and an all-ones mask."""
    vocab = rollout_vllm.vocab_size(args.weights)
    ids = np.random.default_rng(rows).integers(1, vocab, (rows, args.prompt))
    return ids.astype(np.int32), np.ones_like(ids, np.int32)


def mixed_prompts(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Prompts of uniform random length in [min_prompt, prompt], left-padded to `prompt`."""
    rng = np.random.default_rng(7)
    ids, _ = fixed_prompts(args, args.mixed_rows)
    lengths = rng.integers(args.min_prompt, args.prompt + 1, args.mixed_rows)
    mask = (np.arange(args.prompt)[None] >= args.prompt - lengths[:, None]).astype(np.int32)
    return np.where(mask > 0, ids, PAD).astype(np.int32), mask


def stop_ids(args: argparse.Namespace) -> list[int]:
    """The mixed workload's EOS ids: vocab / stop_every random ids other than PAD."""
    vocab = rollout_vllm.vocab_size(args.weights)
    count = max(1, round(vocab / args.stop_every))
    return sorted(np.random.default_rng(3).choice(np.arange(1, vocab), count, replace=False))


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Mean and percentiles of the response lengths."""
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90])
    return {"len_mean": float(lengths.mean()), "len_p10": p10, "len_p50": p50, "len_p90": p90}


def measure(
    args: argparse.Namespace,
    impl: str,
    workload: str,
    rows: int,
    seconds: float,
    lengths: np.ndarray,
    **extra: Any,
) -> dict[str, Any]:
    """One JSON-ready measurement."""
    tokens = int(lengths.sum())
    return {
        "impl": impl,
        "shape": args.shape,
        "workload": workload,
        "rows": rows,
        "dtype": args.dtype,
        "tokens": tokens,
        "time_s": seconds,
        "tokens_per_s": tokens / seconds,
        **length_stats(lengths),
        **extra,
    }


def write_weights(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The model's HF folder: SmolLM2-135M-Instruct (fetched once), or a random model of the
    shape written at `args.weights`."""
    from jrl.assets import prepare_smollm2
    from jrl.models import ModelConfig, init_random, save_pretrained

    if args.shape == "smollm2":
        return [{"impl": "weights", "shape": args.shape, "folder": str(prepare_smollm2())}]
    config = ModelConfig.from_hf(SHAPES[args.shape]["config"])
    save_pretrained(init_random(config, seed=0), args.weights)
    return [{"impl": "weights", "shape": args.shape, "folder": args.weights}]


def copy_bandwidth() -> float:
    """Bytes per second of a jitted elementwise copy (read + write) of a large array."""
    import jax
    import jax.numpy as jnp

    size = GIB if jax.default_backend() != "cpu" else GIB // 4
    x = jnp.ones(size // 4, jnp.float32)
    copy = jax.jit(lambda a: a + 1)
    jax.block_until_ready(copy(x))
    start = time.perf_counter()
    for _ in range(5):
        y = copy(x)
    jax.block_until_ready(y)
    return 2 * size * 5 / (time.perf_counter() - start)


def run_jrl(args: argparse.Namespace) -> list[dict[str, Any]]:
    """jrl's JaxRollout on one device: fixed batches, then the mixed workload both ways."""
    import jax
    import jax.numpy as jnp

    from jrl.batch import Batch
    from jrl.models import from_pretrained
    from jrl.rollout import EngineLimits, JaxRollout, SamplingParams

    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    model = from_pretrained(args.weights, dtype=dtype, param_dtype=dtype)
    device = jax.devices()[0]
    copy_bw = copy_bandwidth()

    def run(ids, mask, new, eos, slots, continuous, workload) -> dict[str, Any]:
        rollout = JaxRollout(
            model,
            response_length=new,
            pad_token_id=PAD,
            eos_token_ids=eos,
            limits=EngineLimits(max_num_seqs=slots),
            continuous_batching=continuous,
        )
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": positions})
        sampling = SamplingParams(new, eos_token_ids=eos, pad_token_id=PAD, ignore_eos=not eos)
        start = time.perf_counter()
        jax.block_until_ready(rollout.generate(batch, sampling, jax.random.key(0)).tensors)
        first = time.perf_counter() - start
        in_use = (device.memory_stats() or {}).get("bytes_in_use")
        start = time.perf_counter()
        out = rollout.generate(batch, sampling, jax.random.key(0))
        jax.block_until_ready(out.tensors)
        seconds = time.perf_counter() - start
        stats = rollout.stats
        slots_used, steps = int(stats["rollout/slots"]), int(stats["rollout/decode_steps"])
        bucket = int(stats["rollout/prompt_bucket"])
        kv_bytes = rollout.cache_bytes(slots_used, bucket, sampling)
        weights = sum(x.nbytes for x in jax.tree.leaves(rollout.state))
        achieved = steps * (weights + kv_bytes) / seconds
        memory = device.memory_stats() or {}
        lengths = np.asarray(out["response_mask"]).sum(1)
        return measure(
            args,
            "jrl",
            workload,
            len(ids),
            seconds,
            lengths,
            batching="continuous" if continuous else "static",
            slots=slots_used,
            decode_steps=steps,
            first_call_s=first,
            kv_cache_gb=kv_bytes / GIB,
            achieved_bandwidth_gbs=achieved / 1e9,
            copy_bandwidth_gbs=copy_bw / 1e9,
            bandwidth_fraction=achieved / copy_bw,
            bytes_in_use_growth_gb=None
            if in_use is None
            else (memory["bytes_in_use"] - in_use) / GIB,
            peak_memory_gb=memory.get("peak_bytes_in_use", 0) / GIB or None,
            device=device.device_kind if device.platform != "cpu" else "cpu",
        )

    results = []
    for rows in args.batches:
        ids, mask = fixed_prompts(args, rows)
        results.append(run(ids, mask, args.new, [], rows, True, "fixed"))
    if args.mixed_rows:
        ids, mask = mixed_prompts(args)
        eos = stop_ids(args)
        for continuous in (True, False):
            results.append(run(ids, mask, args.mixed_new, eos, args.slots, continuous, "mixed"))
    return results


def run_hf(args: argparse.Namespace) -> list[dict[str, Any]]:
    """transformers `generate` (sdpa attention, static batches) on one device."""
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.weights, dtype=dtype, attn_implementation="sdpa"
    )
    model = model.to(device).eval()

    def generate(ids: np.ndarray, mask: np.ndarray, new: int, eos: list[int]) -> np.ndarray:
        """Response lengths (through the first EOS) of one static batch."""
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.from_numpy(ids).long().to(device),
                attention_mask=torch.from_numpy(mask).long().to(device),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                min_new_tokens=0 if eos else new,
                eos_token_id=eos or None,
                pad_token_id=PAD,
            )
        responses = out[:, ids.shape[1] :].cpu().numpy()
        is_eos = np.isin(responses, eos)
        return np.where(is_eos.any(1), is_eos.argmax(1) + 1, responses.shape[1])

    def timed(batches: list[tuple[np.ndarray, np.ndarray]], new: int, eos: list[int]):
        generate(*batches[0], 2, [])  # warm-up: kernels and allocator
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        lengths = np.concatenate([generate(ids, mask, new, eos) for ids, mask in batches])
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, lengths

    name = torch.cuda.get_device_name() if cuda else "cpu"
    results = []
    for rows in args.batches:
        seconds, lengths = timed([fixed_prompts(args, rows)], args.new, [])
        results.append(measure(args, "hf", "fixed", rows, seconds, lengths, device=name))
    if args.mixed_rows:
        ids, mask = mixed_prompts(args)
        chunks = [
            (ids[i : i + args.slots], mask[i : i + args.slots])
            for i in range(0, len(ids), args.slots)
        ]
        seconds, lengths = timed(chunks, args.mixed_new, stop_ids(args))
        results.append(
            measure(
                args,
                "hf",
                "mixed",
                len(ids),
                seconds,
                lengths,
                batching="static",
                slots=args.slots,
                device=name,
            )
        )
    return results


def worker_command(impl: str, argv: list[str], weights: str) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of a worker in a fresh Python process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # measure what jrl uses, not a pool
    if impl == "weights":
        env["JAX_PLATFORMS"] = "cpu"  # leave the accelerator to the measured workers
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--weights", weights]
    return [*cmd, "--worker", impl], env


def run_worker(impl: str, argv: list[str], weights: str) -> list[dict[str, Any]]:
    """Runs one worker in a fresh Python process; returns its JSON lines."""
    cmd, env = worker_command(impl, argv, weights)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"the {impl} benchmark failed (exit code {proc.returncode}); see above")
    return lines


def interleaved_workers(
    impls: tuple[str, ...], argv: list[str], weights: str, logs: str
) -> Iterator[dict[str, Any]]:
    """`--vs vllm`: the sides' workers alive together, their calls alternating
    (`rollout_vllm.interleaved`); a worker's stderr goes to `logs` and is shown if it fails."""
    files: dict[str, Any] = {}

    def start(impl: str) -> subprocess.Popen:
        cmd, env = worker_command(impl, argv, weights)
        files[impl] = (Path(logs) / f"{impl}.stderr").open("w")
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=files[impl],
            text=True,
            env=env,
        )

    try:
        yield from rollout_vllm.interleaved(parse_args(argv), impls, start)
    except RuntimeError as err:
        for impl in files:
            sys.stderr.write((Path(logs) / f"{impl}.stderr").read_text()[-8000:])
        raise SystemExit(f"the benchmark failed: {err}") from err
    finally:
        for file in files.values():
            file.close()


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """jrl / hf tokens/s per workload (jrl continuous) and jrl continuous / static (mixed)."""
    keys = ("impl", "dtype", "workload", "rows")
    runs = {(*(r[k] for k in keys), r.get("batching", "")): r for r in results}
    lines = []
    for (impl, dtype, workload, rows, batching), r in runs.items():
        if impl != "jrl" or batching != "continuous":
            continue
        hf = next((h for k, h in runs.items() if k[:4] == ("hf", dtype, workload, rows)), None)
        if hf is not None:
            ratio = r["tokens_per_s"] / hf["tokens_per_s"]
            lines.append(_ratio("jrl/hf", r, ratio))
        static = runs.get(("jrl", dtype, workload, rows, "static"))
        if static is not None:
            ratio = r["tokens_per_s"] / static["tokens_per_s"]
            lines.append(_ratio("jrl continuous/static", r, ratio))
    return lines


def _ratio(impl: str, run: dict[str, Any], ratio: float) -> dict[str, Any]:
    keys = ("shape", "workload", "rows", "dtype")
    return {"impl": impl, **{k: run[k] for k in keys}, "tokens_per_s_ratio": ratio}


def main(argv: list[str] | None = None) -> None:
    """Parent: run the chosen implementations one after another (per dtype) and print their
    JSON lines, then the ratio lines."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        if args.vs == "vllm" and args.worker != "weights":
            return rollout_vllm.serve(args, args.worker)  # answers the parent's calls
        workers = {"hf": run_hf, "jrl": run_jrl, "weights": write_weights}
        for line in workers[args.worker](args):
            print(json.dumps(line, default=float), flush=True)
        return
    impls = IMPLS[args.vs] if args.impl == "both" else (args.impl,)
    dtypes = DTYPES if args.dtype == "both" else (args.dtype,)
    with tempfile.TemporaryDirectory() as scratch:
        weights = args.weights or scratch
        if not (Path(weights) / "config.json").exists():
            weights = run_worker("weights", argv, weights)[0]["folder"]
        results = []
        for dtype in dtypes:
            dtype_argv = [*argv, "--dtype", dtype]
            if args.vs == "vllm":
                runs = interleaved_workers(impls, dtype_argv, weights, scratch)
            else:
                runs = (line for impl in impls for line in run_worker(impl, dtype_argv, weights))
            for line in runs:
                print(json.dumps(line), flush=True)
                results.append(line)
    ratio_lines = rollout_vllm.ratios(results) if args.vs == "vllm" else ratios(results)
    for line in ratio_lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
