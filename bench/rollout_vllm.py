"""`bench/rollout.py --vs vllm`: jrl's JAX sampler against vLLM's own `LLM.generate`, same chip.

Each (workload, rows, sampling) runs on both sides with the same prompts, the same token count
and the same engine limits, each side in its own subprocess (one per dtype; jrl, then vLLM):

- workloads, per shape (`VS_WORKLOADS`): `decode` (short prompt, long answer) and `prefill` (long
  prompt, short answer); `--prompt` / `--new` given on the command line make one `fixed`
  workload of that shape instead;
- rows: `--batches` (prompts x `--n` answers each, so 128 rows are 32 prompts x 4); at most
  `--slots` sequences decode together and one step takes at most `--batched-tokens` tokens, on
  both sides (vLLM's `max_num_seqs` / `max_num_batched_tokens`, jrl's `EngineLimits`);
- sampling: `sample` (temperature 1, no top-k / top-p) and `greedy`; EOS is ignored, so every
  row makes exactly `new` tokens on both sides.

A side first makes one untimed call of each configuration (compilation, vLLM's warm-up), then
`--repeats` timed calls, each on fresh random prompts (the same on both sides: a prompt is never
in vLLM's prefix cache from an earlier call). A line reports the median; `load_1min` is the
machine's load average when the line was printed (other jobs on the cores move every figure).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from jrl.models.config import ModelConfig
from jrl.rollout.limits import kv_bytes_per_token
from jrl.rollout.vllm_platform import vllm_platform, vllm_version

# Per shape: (prompt, new) tokens of the decode-heavy and the prefill-heavy workload, the rows
# (`--batches`) and the slots.
VS_WORKLOADS: dict[str, dict[str, Any]] = {
    "tiny": {"decode": (16, 32), "prefill": (128, 4), "batches": [128, 512], "slots": 128},
    "smollm2": {"decode": (32, 64), "prefill": (512, 8), "batches": [128, 512], "slots": 128},
    "qwen2.5-0.5b": {
        "decode": (64, 512),
        "prefill": (1024, 16),
        "batches": [128, 512],
        "slots": 512,
    },
}
SAMPLINGS = ("sample", "greedy")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
KEYS = ("shape", "workload", "rows", "dtype", "sampling")


def workloads(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """Workload name -> (prompt, new tokens): the shape's two, or `fixed` from the command line."""
    if args.prompt is not None or args.new is not None:
        decode = VS_WORKLOADS[args.shape]["decode"]
        prompt = decode[0] if args.prompt is None else args.prompt
        return {"fixed": (prompt, decode[1] if args.new is None else args.new)}
    return {name: VS_WORKLOADS[args.shape][name] for name in ("decode", "prefill")}


def configurations(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Every measured configuration of one dtype, in the order both sides run them."""
    for workload, (prompt, new) in workloads(args).items():
        for rows in args.batches:
            for sampling in args.sampling:
                yield {
                    "workload": workload,
                    "rows": rows,
                    "sampling": sampling,
                    "prompt": prompt,
                    "new": new,
                }


def vocab_size(weights: str) -> int:
    """The model's vocabulary (its config.json)."""
    return int(json.loads((Path(weights) / "config.json").read_text())["vocab_size"])


def prompts(args: argparse.Namespace, config: dict[str, Any], call: int) -> np.ndarray:
    """[rows / n, prompt] random token ids (never 0) of call `call` of a configuration; the same
    on both sides, different for every call."""
    seed = [call, config["rows"], config["prompt"], config["new"]]
    count = -(-config["rows"] // args.n)
    rng = np.random.default_rng(seed)
    return rng.integers(1, vocab_size(args.weights), (count, config["prompt"]), dtype=np.int32)


def timed_calls(
    args: argparse.Namespace, config: dict[str, Any], generate: Callable[[np.ndarray, int], int]
) -> dict[str, Any]:
    """One untimed call, then `--repeats` timed ones of `generate(prompt ids, call) -> tokens`;
    the configuration's JSON fields."""
    generate(prompts(args, config, 0), 0)
    times, tokens = [], []
    for call in range(1, args.repeats + 1):
        ids = prompts(args, config, call)
        start = time.perf_counter()
        tokens.append(generate(ids, call))
        times.append(time.perf_counter() - start)
    median = float(np.median(times))
    if len(set(tokens)) != 1:
        raise RuntimeError(f"calls made different token counts {tokens} for {config}")
    return {
        "shape": args.shape,
        **config,
        "n": args.n,
        "dtype": args.dtype,
        "slots": min(args.slots, config["rows"]),
        "tokens": tokens[0],
        "time_s": median,
        "times_s": times,
        "tokens_per_s": tokens[0] / median,
        "load_1min": os.getloadavg()[0],
    }


def run_jrl(args: argparse.Namespace) -> list[dict[str, Any]]:
    """jrl's `JaxRollout.generate` on one device, continuous batching."""
    import jax
    import jax.numpy as jnp

    from jrl.batch import Batch
    from jrl.models import from_pretrained
    from jrl.rollout import EngineLimits, JaxRollout, SamplingParams

    dtype = jnp.dtype(DTYPES[args.dtype])
    model = from_pretrained(args.weights, dtype=dtype, param_dtype=dtype)
    device = jax.devices()[0]

    def generate(rollout: JaxRollout, sampling: SamplingParams, ids: np.ndarray, call: int) -> int:
        mask = np.ones_like(ids)
        batch = Batch(
            {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1}
        )
        out = rollout.generate(batch, sampling, jax.random.key(call))
        return int(np.asarray(out["response_mask"]).sum())

    results = []
    for config in configurations(args):
        limits = EngineLimits(max_num_seqs=args.slots, max_num_batched_tokens=args.batched_tokens)
        rollout = JaxRollout(
            model, response_length=config["new"], pad_token_id=0, eos_token_ids=(), limits=limits
        )
        do_sample = config["sampling"] == "sample"
        sampling = SamplingParams(config["new"], n=args.n, ignore_eos=True, do_sample=do_sample)
        line = timed_calls(args, config, functools.partial(generate, rollout, sampling))
        line["decode_steps"] = int(rollout.stats["rollout/decode_steps"])
        line["device"] = device.device_kind if device.platform != "cpu" else "cpu"
        results.append({"impl": "jrl", **line})
    return results


def run_vllm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """vLLM's `LLM.generate` (token-id prompts, its V1 engine in this process), one engine for
    all configurations of the dtype."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    platform = vllm_platform()  # a CPU build: VLLM_TARGET_DEVICE=cpu first, libtpu or not
    import vllm
    from vllm.inputs import TokensPrompt

    configs = list(configurations(args))
    longest = max(c["prompt"] + c["new"] for c in configs)
    slots = min(args.slots, max(c["rows"] for c in configs))
    kv_bytes = _kv_cache_bytes(args.weights, args.dtype, slots * longest)
    llm = vllm.LLM(
        model=args.weights,
        dtype=DTYPES[args.dtype],
        skip_tokenizer_init=True,
        seed=0,
        max_model_len=longest,
        max_num_seqs=args.slots,
        max_num_batched_tokens=max(args.batched_tokens, longest),
        kv_cache_memory_bytes=kv_bytes,
        enforce_eager=args.shape == "tiny",  # the toy shape: no compilation, a quick start
    )
    device = platform.device_name

    def generate(sampling: vllm.SamplingParams, ids: np.ndarray, call: int) -> int:
        copies = args.n // sampling.n  # vLLM samples greedy rows one request each
        rows = np.repeat(ids, copies, axis=0)
        requests = [TokensPrompt(prompt_token_ids=row.tolist()) for row in rows]
        outs = llm.generate(requests, sampling, use_tqdm=False)
        return sum(len(o.token_ids) for request in outs for o in request.outputs)

    results = []
    for config in configs:
        greedy = config["sampling"] == "greedy"
        sampling = vllm.SamplingParams(
            n=1 if greedy else args.n,
            temperature=0.0 if greedy else 1.0,
            top_p=1.0,
            max_tokens=config["new"],
            ignore_eos=True,
        )
        line = timed_calls(args, config, functools.partial(generate, sampling))
        results.append({"impl": "vllm", **line, "vllm": vllm_version(), "device": device})
    return results


def _kv_cache_bytes(weights: str, dtype: str, tokens: int) -> int:
    """vLLM's KV cache for `tokens` tokens (keys and values of every layer), with a quarter more
    for its block rounding, at least 256 MiB."""
    config = ModelConfig.from_hf(json.loads((Path(weights) / "config.json").read_text()))
    numpy_dtype = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}[dtype]
    per_token = kv_bytes_per_token(config, numpy_dtype, 1)
    return max(2**28, int(1.25 * tokens * per_token))


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """jrl / vLLM tokens/s of every configuration both sides measured."""
    vllm = {tuple(r[k] for k in KEYS): r for r in results if r["impl"] == "vllm"}
    lines = []
    for r in results:
        other = vllm.get(tuple(r[k] for k in KEYS))
        if r["impl"] == "jrl" and other is not None:
            ratio = r["tokens_per_s"] / other["tokens_per_s"]
            load = (r["load_1min"] + other["load_1min"]) / 2
            lines.append(
                {"impl": "jrl/vllm", **{k: r[k] for k in KEYS}, "tokens_per_s_ratio": ratio,
                 "load_1min": load}
            )  # fmt: skip
    return lines
