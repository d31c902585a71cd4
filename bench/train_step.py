"""Training-step throughput: jrl (JAX) against Hugging Face transformers + torch, same run.

One step = forward of a randomly initialised causal LM, the mean next-token log-prob loss (as RL
losses use it), backward, gradient clipping at 1.0 and AdamW (lr 1e-6). Precision: bf16 compute
with fp32 master weights and optimizer state on both sides (jrl: bf16 compute dtype over fp32
params; torch: `torch.autocast(bfloat16)` over fp32 params); `--dtype fp32` runs both in fp32.

Each implementation runs in its own subprocess so that its peak memory is its own. The parent prints
one JSON line per implementation and, when both ran, a line with the jrl/torch ratios:

    python bench/train_step.py --shape tiny
    python bench/train_step.py --shape qwen2.5-0.5b --batch 16 --seq 1024  # on a GPU

Heavy imports (jax, torch) happen inside the worker functions, so that each subprocess loads only
its own framework.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("jrl", "torch")

# Hugging Face config.json content of each shape, with its default batch, sequence length and
# numbers of timed and warm-up steps.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "batch": 16,
        "seq": 1024,
        "steps": 10,
        "warmup": 3,
        "config": {
            "model_type": "qwen2",
            "vocab_size": 151936,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
            "max_position_embeddings": 32768,
            "use_sliding_window": False,
        },
    },
    "tiny": {
        "batch": 4,
        "seq": 128,
        "steps": 3,
        "warmup": 1,
        "config": {
            "model_type": "qwen2",
            "vocab_size": 1024,
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
            "max_position_embeddings": 2048,
            "use_sliding_window": False,
        },
    },
}

LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-6, (0.9, 0.999), 0.01, 1.0
# Dense bf16 peak FLOP/s by device-name fragment (first match wins).
PEAK_BF16_FLOPS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12))
GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; batch, seq, steps and warmup default to the shape's own."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, help="sequences per step (default: the shape's)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: the shape's)")
    p.add_argument("--steps", type=int, help="timed steps (default: the shape's)")
    p.add_argument("--warmup", type=int, help="untimed steps first, compilation included")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="compute dtype")
    p.add_argument("--impl", choices=(*IMPLS, "both"), default="both")
    p.add_argument(
        "--logprob-impl", default="auto", help="jrl_kernels.logprob_entropy impl for jrl"
    )
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shape = SHAPES[args.shape]
    for name in ("batch", "seq", "steps", "warmup"):
        if getattr(args, name) is None:
            setattr(args, name, shape[name])
    for name, low in (("batch", 1), ("seq", 2), ("steps", 1), ("warmup", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name} must be at least {low}, got {getattr(args, name)}")
    return args


def step_flops(hf: dict[str, Any], batch: int, seq: int) -> float:
    """Training FLOPs of one step: 6 * N * tokens + 12 * layers * heads * head_dim * seq^2 * batch.

    N counts the matmul parameters: every non-embedding weight matrix plus the LM head (V x D),
    tied to the embedding or not. The attention term counts the full (not causal) QK^T and AV.
    """
    d, inter, layers = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    heads, kv_heads, head_dim = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    attn = d * (heads + 2 * kv_heads) * head_dim + heads * head_dim * d
    n = layers * (attn + 3 * d * inter) + hf["vocab_size"] * d
    return 6.0 * n * batch * seq + 12.0 * layers * heads * head_dim * seq**2 * batch


def peak_flops(device: str, dtype: str) -> float | None:
    """The device's dense bf16 peak FLOP/s, or None (CPU, fp32, unknown device)."""
    if dtype != "bf16":
        return None
    return next((peak for name, peak in PEAK_BF16_FLOPS if name in device), None)


def random_tokens(vocab: int, batch: int, seq: int) -> np.ndarray:
    """The fixed [batch, seq] int32 token batch that both implementations train on."""
    return np.random.default_rng(0).integers(0, vocab, (batch, seq), dtype=np.int32)


def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def time_steps(
    step: Callable[[], Any], sync: Callable[[Any], Any], steps: int, warmup: int
) -> tuple[float, float, Any]:
    """Runs `warmup` then `steps` steps; returns (warmup seconds, seconds per step, last output)."""
    start = time.perf_counter()
    out = None
    for _ in range(warmup):
        out = step()
    sync(out)
    timed = time.perf_counter()
    for _ in range(steps):
        out = step()
    sync(out)
    end = time.perf_counter()
    return timed - start, (end - timed) / steps, out


def record(
    args: argparse.Namespace,
    *,
    impl: str,
    device: str,
    params: int,
    timing: tuple[float, float, Any],
    loss: float,
    peak_memory: int,
    memory_kind: str,
    **extra: Any,
) -> dict[str, Any]:
    """One JSON-ready measurement; MFU uses `step_flops` over the device's bf16 peak."""
    warmup_s, step_s, _ = timing
    flops = step_flops(SHAPES[args.shape]["config"], args.batch, args.seq)
    peak = peak_flops(device, args.dtype)
    return {
        "impl": impl,
        "device": device,
        "shape": args.shape,
        "batch": args.batch,
        "seq": args.seq,
        "dtype": args.dtype,
        "params": params,
        "tokens_per_s": args.batch * args.seq / step_s,
        "mfu": None if peak is None else flops / step_s / peak,
        "peak_memory_gb": peak_memory / GIB,
        "memory_kind": memory_kind,
        "step_time_s": step_s,
        "warmup_s": warmup_s,
        "steps": args.steps,
        "warmup": args.warmup,
        "flops_per_step": flops,
        "loss": loss,
        **extra,
    }


def run_jrl(args: argparse.Namespace) -> dict[str, Any]:
    """jrl's own jitted update (Learner + build_update) on one device."""
    import jax
    import jax.numpy as jnp

    from jrl.models import ModelConfig, init_random
    from jrl.optim.optimizers import make_optimizer
    from jrl.optim.settings import OptimizerSettings, ScheduleSettings
    from jrl.parallel import make_mesh
    from jrl.trainer.update.learner import Learner, build_update
    from jrl_kernels import logprob_entropy

    base_rss = rss_bytes()
    hf = SHAPES[args.shape]["config"]
    compute = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    model = init_random(ModelConfig.from_hf(hf), dtype=compute, param_dtype=jnp.float32)
    constant = ScheduleSettings("constant", None, 0.0)
    optim = OptimizerSettings("AdamW", LR, BETAS, WEIGHT_DECAY, constant)
    state = Learner.create(model, make_optimizer(optim), make_mesh(1))
    del model

    def loss_fn(model, micro, normaliser):
        ids = micro["input_ids"]
        hidden = model.hidden(ids)[:, :-1]
        logp, _ = logprob_entropy(
            hidden, model.lm_head_kernel(), ids[:, 1:], 1.0, impl=args.logprob_impl
        )
        return -jnp.sum(logp) / normaliser["tokens"], {}

    tokens = random_tokens(hf["vocab_size"], args.batch, args.seq)
    minibatch = {"input_ids": jnp.asarray(tokens[None])}  # one micro-batch
    normaliser = {"tokens": jnp.float32(args.batch * (args.seq - 1))}
    update = build_update(state, loss_fn, GRAD_CLIP, minibatch)

    def step() -> Any:
        metrics = state.step(update, minibatch, normaliser, LR)
        return state.trainable, state.opt_state, metrics

    timing = time_steps(step, jax.block_until_ready, args.steps, args.warmup)
    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        peak, kind = stats["peak_bytes_in_use"], "device peak_bytes_in_use"
    else:
        peak, kind = peak_rss_bytes() - base_rss, "process peak RSS delta"
    return record(
        args,
        impl="jrl",
        device="cpu" if dev.platform == "cpu" else dev.device_kind,
        params=sum(x.size for x in jax.tree.leaves(state.params)),
        timing=timing,
        loss=float(timing[2][2]["loss"]),
        peak_memory=peak,
        memory_kind=kind,
        precision=f"{args.dtype} compute, fp32 params and AdamW state",
        logprob_impl=args.logprob_impl,
        version=f"jax {jax.__version__}",
    )


def run_torch(args: argparse.Namespace) -> dict[str, Any]:
    """transformers AutoModelForCausalLM (sdpa attention) with torch AdamW on one device."""
    import torch
    import transformers

    base_rss = rss_bytes()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    hf = SHAPES[args.shape]["config"]
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**hf)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="sdpa", dtype=torch.float32
    ).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    ids = torch.from_numpy(random_tokens(hf["vocab_size"], args.batch, args.seq)).long().to(device)
    bf16 = args.dtype == "bf16"

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        loss = -logp.gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync(_: Any) -> None:
        if cuda:
            torch.cuda.synchronize()

    timing = time_steps(step, sync, args.steps, args.warmup)
    if cuda:
        peak, kind = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        peak, kind = peak_rss_bytes() - base_rss, "process peak RSS delta"
    return record(
        args,
        impl="torch",
        device=torch.cuda.get_device_name() if cuda else "cpu",
        params=sum(p.numel() for p in model.parameters()),
        timing=timing,
        loss=float(timing[2]),
        peak_memory=peak,
        memory_kind=kind,
        precision=("torch.autocast bf16 over fp32 params and AdamW state" if bf16 else "fp32"),
        version=f"torch {torch.__version__}, transformers {transformers.__version__}",
    )


def run_worker(impl: str, argv: list[str]) -> dict[str, Any]:
    """Runs one implementation in a fresh Python process and parses its JSON line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if impl == "jrl":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # measure what jrl uses, not a pool
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", impl]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"the {impl} benchmark failed (exit code {proc.returncode}); see above")
    return json.loads(lines[-1])


def ratios(jrl: dict[str, Any], torch: dict[str, Any]) -> dict[str, Any]:
    """jrl / torch ratios of throughput and peak memory."""

    def ratio(key: str) -> float | None:
        return jrl[key] / torch[key] if torch[key] > 0 else None

    return {
        "impl": "jrl/torch",
        "shape": jrl["shape"],
        "batch": jrl["batch"],
        "seq": jrl["seq"],
        "tokens_per_s_ratio": ratio("tokens_per_s"),
        "peak_memory_ratio": ratio("peak_memory_gb"),
    }


def main(argv: list[str] | None = None) -> None:
    """Parent: run the chosen implementations one after another and print their JSON lines."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        result = (run_jrl if args.worker == "jrl" else run_torch)(args)
        print(json.dumps(result), flush=True)
        return
    impls = IMPLS if args.impl == "both" else (args.impl,)
    results = {}
    for impl in impls:
        results[impl] = run_worker(impl, argv)
        print(json.dumps(results[impl]), flush=True)
    if len(results) == 2:
        print(json.dumps(ratios(results["jrl"], results["torch"])), flush=True)


if __name__ == "__main__":
    main()
