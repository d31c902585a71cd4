"""Step metrics under verl's names, computed on host from a finished batch."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np

from jrl.batch import Batch, attended_lengths
from jrl.models.config import ModelConfig
from jrl.trainer.io.flops import peak_flops, train_flops

GB = 1024**3


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def data_metrics(batch: Batch, use_critic: bool) -> dict[str, float]:
    """verl's data metrics: critic/score|rewards over the rows with a response (0 where none
    has), advantages|returns|values over `response_mask`, response_length/* and
    response_length_non_aborted/* (an aborted row has no response token), response/aborted_ratio,
    prompt_length/*, and num_turns/* where an agent loop counted them."""
    t = {k: np.asarray(v) for k, v in batch.tensors.items()}
    mask = t["response_mask"].astype(bool)
    response_width = t["responses"].shape[1]
    prompt_length, response_length = (x.astype(np.float32) for x in attended_lengths(batch))
    aborted = response_length == 0
    kept = response_length[~aborted]
    out = {
        **_stats("critic/score", t["token_level_scores"].sum(-1)[~aborted]),
        **_stats("critic/rewards", t["token_level_rewards"].sum(-1)[~aborted]),
        **_stats("critic/advantages", t["advantages"][mask]),
        **_stats("critic/returns", t["returns"][mask]),
    }
    if use_critic:
        values, returns = t["values"][mask], t["returns"][mask]
        out.update(_stats("critic/values", values))
        explained = 1.0 - _sample_var(returns - values) / (_sample_var(returns) + 1e-5)
        out["critic/vf_explained_var"] = float(explained)
    out.update(_stats("response_length", response_length))
    out["response_length/clip_ratio"] = float(np.mean(response_length == response_width))
    out.update(_stats("response_length_non_aborted", kept))
    out["response_length_non_aborted/clip_ratio"] = (
        float(np.mean(kept == response_width)) if kept.size else 0.0
    )
    out["response/aborted_ratio"] = float(np.mean(aborted))
    out.update(_stats("prompt_length", prompt_length))
    out["prompt_length/clip_ratio"] = float(
        np.mean(prompt_length == t["attention_mask"].shape[1] - response_width)
    )
    out.update(turn_metrics(batch))
    return out


def turn_metrics(batch: Batch, prefix: str = "") -> dict[str, float]:
    """num_turns/{min,max,mean} of the rows an agent loop made (batch meta ``num_turns``), under
    `prefix` (validation's ``val-aux/``); {} for a batch without turns."""
    if "num_turns" not in batch.meta:
        return {}
    turns = np.asarray(batch.meta["num_turns"], np.float64)
    return {
        f"{prefix}num_turns/min": float(turns.min()),
        f"{prefix}num_turns/max": float(turns.max()),
        f"{prefix}num_turns/mean": float(turns.mean()),
    }


def _sample_var(x: np.ndarray) -> float:
    """torch.var's unbiased variance (n - 1); NaN for fewer than two values, as torch gives."""
    return float(np.var(x, ddof=1)) if x.size > 1 else float("nan")


def throughput_metrics(batch: Batch, timing: dict[str, float], n_gpus: int) -> dict[str, float]:
    """perf/total_num_tokens (an exact count), perf/time_per_step, perf/throughput (over the
    run's `n_gpus`, a split run's rollout devices too) and timing_per_token_ms/* (generation per
    response token, the other phases per prompt and response token)."""
    prompt_length, response_length = (x.astype(np.int64) for x in attended_lengths(batch))
    response_tokens = int(response_length.sum())
    total_tokens = int(prompt_length.sum()) + response_tokens
    step_time = timing["step"]
    out = {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_gpus),
    }
    if "gen" in timing and response_tokens:
        out["timing_per_token_ms/gen"] = 1000.0 * timing["gen"] / response_tokens
    for name in ("ref", "values", "adv", "update_critic", "update_actor"):
        if name in timing and total_tokens:
            out[f"timing_per_token_ms/{name}"] = 1000.0 * timing[name] / total_tokens
    return out


def mfu_metrics(
    model_config: ModelConfig,
    seqlens: Sequence[int] | np.ndarray,
    seconds: float,
    *,
    epochs: int,
    world_size: int,
    role: str = "actor",
    device_kind: str | None = None,
) -> dict[str, float]:
    """``perf/mfu/<role>``: the FLOPs of `epochs` passes over sequences of `seqlens` tokens (the
    rows' attention-mask sums) in `seconds`, over the peak of `world_size` devices of
    `device_kind` (default: that of ``jax.devices()[0]``). Empty where the peak is unknown (CPU).

    FLOPs per pass are verl's count (`train_flops`): 6·N_dense·Σs + 6·layers·heads·head_dim·Σs²,
    the attention term causal (half the q·k and attention·v matmuls; windows on sliding layers)."""
    kind = jax.devices()[0].device_kind if device_kind is None else device_kind
    peak = peak_flops(kind)
    if peak is None or seconds <= 0:
        return {}
    flops = train_flops(model_config, seqlens) * epochs
    return {f"perf/mfu/{role}": flops / (seconds * peak * world_size)}


def memory_metrics(devices: Sequence[Any] | None = None) -> dict[str, float]:
    """``perf/max_memory_allocated_gb`` (peak bytes in use) and ``perf/max_memory_reserved_gb``
    (peak bytes held by the allocator's pool), the largest over `devices` (default: this process's),
    in GiB. Keys the backend does not report are absent; CPUs report none."""
    stats = [s for s in (d.memory_stats() for d in devices or jax.local_devices()) if s]
    out = {}
    allocated = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    if allocated:
        out["perf/max_memory_allocated_gb"] = max(allocated) / GB
    reserved = [s.get("peak_pool_bytes") or s.get("peak_bytes_reserved") for s in stats]
    reserved = [r for r in reserved if r]
    if reserved:
        out["perf/max_memory_reserved_gb"] = max(reserved) / GB
    return out


@contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Adds the wall time of the block to ``timing[name]`` in seconds."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def reduce_metrics(metrics: dict[str, list[Any]]) -> dict[str, float]:
    """verl's reduction of per-mini-batch lists: names with 'max' take the max, 'min' the min,
    the rest the mean."""
    out = {}
    for key, values in metrics.items():
        arr = np.asarray(values, dtype=np.float64)
        if "max" in key:
            out[key] = float(arr.max())
        elif "min" in key:
            out[key] = float(arr.min())
        else:
            out[key] = float(arr.mean())
    return out
