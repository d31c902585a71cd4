"""`bench/rollout.py --vs vllm`: jrl's JAX sampler against vLLM's own `LLM.generate`, same chip.

Each (workload, rows, sampling) runs on both sides with the same prompts, the same token count
and the same engine limits, each side in its own subprocess (one per side and dtype, both alive
for the whole dtype; `--impl` picks one side):

- workloads, per shape (`VS_WORKLOADS`): `decode` (short prompt, long answer) and `prefill` (long
  prompt, short answer); `--prompt` / `--new` given on the command line make one `fixed`
  workload of that shape instead;
- rows: `--batches` (prompts x `--n` answers each, so 128 rows are 32 prompts x 4); at most
  `--slots` sequences decode together and one step takes at most `--batched-tokens` tokens, on
  both sides (vLLM's `max_num_seqs` / `max_num_batched_tokens`, jrl's `EngineLimits`);
- sampling: `sample` (temperature 1, no top-k / top-p) and `greedy`; EOS is ignored, so every
  row makes exactly `new` tokens on both sides.

Per configuration each side makes one untimed call (compilation, vLLM's warm-up), then
`--repeats` timed calls, each on fresh random prompts (the same on both sides: a prompt is never
in vLLM's prefix cache from an earlier call). The calls alternate, jrl's call i, vLLM's call i,
jrl's call i + 1, so that what moves the shared cores' speed over a run (other tenants, clocks;
runs of the same program drift by up to 8% over an hour) moves both sides' figures alike; one
side waits while the other runs. A line reports the median and when each timed call started
(`started_s`, seconds into the run); `load_1min` is the machine's load average when the line
was printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


# A side's engine for one configuration: generate(prompt ids, call) -> (tokens made, fields).
Generate = Callable[[np.ndarray, int], tuple[int, dict[str, Any]]]


def jrl_side(args: argparse.Namespace) -> tuple[Callable[[dict[str, Any]], Generate], dict]:
    """jrl's `JaxRollout.generate` on one device, continuous batching: (an engine per
    configuration, the side's fields)."""
    import jax
    import jax.numpy as jnp

    from jrl.batch import Batch
    from jrl.models import from_pretrained
    from jrl.rollout import EngineLimits, JaxRollout, SamplingParams

    dtype = jnp.dtype(DTYPES[args.dtype])
    model = from_pretrained(args.weights, dtype=dtype, param_dtype=dtype)
    device = jax.devices()[0]

    def engine(config: dict[str, Any]) -> Generate:
        limits = EngineLimits(max_num_seqs=args.slots, max_num_batched_tokens=args.batched_tokens)
        rollout = JaxRollout(
            model, response_length=config["new"], pad_token_id=0, eos_token_ids=(), limits=limits
        )
        do_sample = config["sampling"] == "sample"
        sampling = SamplingParams(config["new"], n=args.n, ignore_eos=True, do_sample=do_sample)

        def generate(ids: np.ndarray, call: int) -> tuple[int, dict[str, Any]]:
            mask = np.ones_like(ids)
            batch = Batch(
                {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1}
            )
            out = rollout.generate(batch, sampling, jax.random.key(call))
            tokens = int(np.asarray(out["response_mask"]).sum())
            return tokens, {"decode_steps": int(rollout.stats["rollout/decode_steps"])}

        return generate

    return engine, {"device": device.device_kind if device.platform != "cpu" else "cpu"}


def vllm_side(args: argparse.Namespace) -> tuple[Callable[[dict[str, Any]], Generate], dict]:
    """vLLM's `LLM.generate` (token-id prompts, its V1 engine in this process), one engine for
    all configurations of the dtype: (a sampling per configuration, the side's fields)."""
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

    def engine(config: dict[str, Any]) -> Generate:
        greedy = config["sampling"] == "greedy"
        sampling = vllm.SamplingParams(
            n=1 if greedy else args.n,
            temperature=0.0 if greedy else 1.0,
            top_p=1.0,
            max_tokens=config["new"],
            ignore_eos=True,
        )

        def generate(ids: np.ndarray, call: int) -> tuple[int, dict[str, Any]]:
            copies = args.n // sampling.n  # vLLM samples greedy rows one request each
            rows = np.repeat(ids, copies, axis=0)
            requests = [TokensPrompt(prompt_token_ids=row.tolist()) for row in rows]
            outs = llm.generate(requests, sampling, use_tqdm=False)
            return sum(len(o.token_ids) for request in outs for o in request.outputs), {}

        return generate

    return engine, {"vllm": vllm_version(), "device": platform.device_name}


SIDES = {"jrl": jrl_side, "vllm": vllm_side}


def serve(args: argparse.Namespace, side: str) -> None:
    """A side's worker: prints its fields as a JSON line, then answers each request line
    {"config", "call"} on stdin with {"time_s", "tokens", ...} (the prompts of that call)."""
    engine, fields = SIDES[side](args)
    print(json.dumps(fields), flush=True)
    current, generate = None, None
    for request in sys.stdin:
        message = json.loads(request)
        config, call = message["config"], message["call"]
        if config != current:
            current, generate = config, engine(config)
        ids = prompts(args, config, call)
        start = time.perf_counter()
        tokens, more = generate(ids, call)
        elapsed = time.perf_counter() - start
        print(json.dumps({"time_s": elapsed, "tokens": tokens, **more}), flush=True)


def interleaved(
    args: argparse.Namespace, sides: tuple[str, ...], start: Callable[[str], subprocess.Popen]
) -> Iterator[dict[str, Any]]:
    """Every configuration's line per side, the sides' calls alternating (module docstring);
    `start(side)` starts a side's worker (`serve`)."""
    clock = time.perf_counter()
    workers: dict[str, subprocess.Popen] = {}
    try:
        for side in sides:
            workers[side] = start(side)
        fields = {side: _reply(worker, side) for side, worker in workers.items()}
        for config in configurations(args):
            calls: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for call in range(args.repeats + 1):
                for side, worker in workers.items():
                    began = time.perf_counter() - clock
                    worker.stdin.write(json.dumps({"config": config, "call": call}) + "\n")
                    worker.stdin.flush()
                    calls[side].append({**_reply(worker, side), "started_s": began})
            for side in sides:
                yield {"impl": side, **_line(args, config, calls[side][1:]), **fields[side]}
    finally:
        for worker in workers.values():
            worker.stdin.close()
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()


def _reply(worker: subprocess.Popen, side: str) -> dict[str, Any]:
    """The worker's next JSON line (other output skipped); a clear error when it died instead."""
    for line in worker.stdout:
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"the {side} worker stopped (exit code {worker.wait()}); see above")


def _line(args: argparse.Namespace, config: dict[str, Any], calls: list[dict]) -> dict[str, Any]:
    """A configuration's JSON fields from its timed calls: the median time, tokens/s."""
    times, tokens = [c["time_s"] for c in calls], {c["tokens"] for c in calls}
    if len(tokens) != 1:
        raise RuntimeError(f"calls made different token counts {sorted(tokens)} for {config}")
    median = float(np.median(times))
    made = tokens.pop()
    extra = {k: v for k, v in calls[-1].items() if k not in ("time_s", "tokens", "started_s")}
    return {
        "shape": args.shape,
        **config,
        "n": args.n,
        "dtype": args.dtype,
        "slots": min(args.slots, config["rows"]),
        "tokens": made,
        "time_s": median,
        "times_s": times,
        "started_s": [c["started_s"] for c in calls],
        "tokens_per_s": made / median,
        "load_1min": os.getloadavg()[0],
        **extra,
    }


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
