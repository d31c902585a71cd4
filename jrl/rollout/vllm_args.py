"""vLLM's own settings (`VllmSettings`) and a run's rollout as the arguments of vLLM's `LLM(...)`
and `SamplingParams(...)`.

Pure Python (no vLLM, no JAX import), so the mapping is checked anywhere. The engine these
arguments build runs in this process on the CPU or one GPU (see `jrl.rollout.vllm_rollout`),
hence the checks that reject settings needing several engine processes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jrl.rollout.sampling import SamplingParams

if TYPE_CHECKING:
    from jrl.rollout.spec import RolloutSpec

_SECTION = "actor_rollout_ref.rollout"
# The oldest vLLM whose V1 engine has everything used here: `logprobs_mode`, `wake_up(tags=...)`,
# in-process `collective_rpc` with a callable, and model buffers kept across sleep.
MIN_VLLM_VERSION = (0, 10, 2)
# vLLM raises a temperature in (0, 0.01) to 0.01 (every version) and refuses one above 2 (0.33).
VLLM_TEMPERATURES = (0.01, 2.0)
_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "float32": "float32",
    "fp32": "float32",
}
_PASS_THROUGH = {"pass_through": True}


@dataclasses.dataclass(frozen=True)
class VllmSettings:
    """verl's rollout keys that only vLLM reads, under their key names (the memory keys are the
    `EngineLimits`; dtype, tensor parallel size and seed are the `RolloutSpec`'s).

    `max_model_len` is the longest sequence (verl's default: prompt_length + response_length);
    `load_format` is verl's (`dummy_*`: vLLM starts from random weights, the sync brings the
    actor's); `engine_kwargs` are ``engine_kwargs.vllm``, handed to `vllm.LLM` last. The fields
    marked pass-through (`VLLM_PASS_THROUGH`) go to `vllm.LLM` unchanged when not None.
    """

    max_model_len: int
    enforce_eager: bool
    load_format: str
    data_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_parallel_size: int = 1
    quantization: str | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    engine_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    enable_chunked_prefill: bool | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)
    enable_prefix_caching: bool | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)
    disable_log_stats: bool | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)
    logprobs_mode: str | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)
    scheduling_policy: str | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)
    skip_tokenizer_init: bool | None = dataclasses.field(default=None, metadata=_PASS_THROUGH)


# Keys handed to `vllm.LLM` unchanged when the section has them (and they are not null).
VLLM_PASS_THROUGH = tuple(
    field.name for field in dataclasses.fields(VllmSettings) if field.metadata.get("pass_through")
)
# verl's names of the parallel sizes and vLLM's (each must be 1 for the in-process engine).
_SINGLE_ENGINE = {
    "tensor_model_parallel_size": "tensor_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "pipeline_model_parallel_size": "pipeline_parallel_size",
}


def vllm_dtype(name: str) -> str:
    """vLLM's name of the rollout dtype (`rollout.dtype`: bfloat16/bf16, float16/fp16,
    float32/fp32)."""
    try:
        return _DTYPES[str(name)]
    except KeyError:
        raise ValueError(f"{_SECTION}.dtype={name!r} is not one of {', '.join(_DTYPES)}") from None


def load_format(name: str) -> str:
    """vLLM's load format for verl's `load_format`: `dummy_*` -> random init ('dummy', the
    weights arrive by sync before the first generate); any other value reads the HF folder."""
    return "dummy" if str(name).startswith("dummy") else "auto"


def engine_sizes(spec: RolloutSpec) -> dict[str, int]:
    """verl's parallel sizes of `spec` by key name (`_SINGLE_ENGINE`'s keys)."""
    vllm = spec.vllm
    return {
        "tensor_model_parallel_size": spec.tensor_parallel_size,
        "data_parallel_size": vllm.data_parallel_size,
        "pipeline_model_parallel_size": vllm.pipeline_model_parallel_size,
    }


# The adapter ranks vLLM sizes its LoRA buffers for (`max_lora_rank`, vLLM 0.10.2 to 0.33).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_kwargs(rank: int) -> dict[str, Any]:
    """vLLM's LoRA arguments for adapters of `rank`, as verl starts it: one adapter at a time,
    `max_lora_rank` the smallest of `VLLM_LORA_RANKS` that holds `rank`."""
    fitting = [size for size in VLLM_LORA_RANKS if size >= rank]
    if not fitting:
        raise ValueError(
            f"actor_rollout_ref.model.lora_rank={rank} is above vLLM's largest adapter rank "
            f"({VLLM_LORA_RANKS[-1]}); lower it or use rollout.name=jax"
        )
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": fitting[0]}


def engine_kwargs(spec: RolloutSpec) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` for the rollout of `spec` (its model folder, dtype, limits
    and vLLM settings); ``engine_kwargs.vllm`` entries are applied last and win. Raises for
    settings this in-process engine cannot run."""
    vllm, limits = spec.vllm, spec.limits
    kwargs: dict[str, Any] = {
        "model": os.path.expanduser(str(spec.model_path)),
        "dtype": vllm_dtype(spec.dtype),
        "gpu_memory_utilization": limits.gpu_memory_utilization,
        "enforce_eager": vllm.enforce_eager,
        "enable_sleep_mode": limits.free_cache_engine,
        "load_format": load_format(vllm.load_format),
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "max_num_seqs": limits.max_num_seqs,
        "max_model_len": vllm.max_model_len,
        "seed": spec.seed,
        "trust_remote_code": spec.trust_remote_code,
    }
    for key, size in engine_sizes(spec).items():
        kwargs[_SINGLE_ENGINE[key]] = size
    for key in VLLM_PASS_THROUGH:
        value = getattr(vllm, key)
        if value is not None:
            kwargs[key] = value
    if spec.lora_rank:
        kwargs.update(lora_engine_kwargs(spec.lora_rank))
    sizes = vllm.cudagraph_capture_sizes
    if sizes and not kwargs["enforce_eager"]:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": list(sizes)}
    kwargs.update(vllm.engine_kwargs)
    _check_engine(vllm, kwargs)
    return kwargs


def _check_engine(vllm: VllmSettings, kwargs: Mapping[str, Any]) -> None:
    """Reject what needs more than one in-process engine on one GPU, or quantized weights."""
    for key, vllm_key in _SINGLE_ENGINE.items():
        if kwargs[vllm_key] != 1:
            raise ValueError(
                f"{_SECTION}.{key}={kwargs[vllm_key]}: the vllm rollout runs one in-process "
                f"engine on one GPU; set {_SECTION}.{key}=1 (or use rollout.name=jax, which "
                "shards over the mesh)"
            )
    if vllm.expert_parallel_size != 1:
        raise ValueError(f"{_SECTION}.expert_parallel_size must be 1 for the vllm rollout")
    if vllm.quantization or kwargs.get("quantization"):
        raise ValueError(
            f"{_SECTION}.quantization is not supported by the vllm rollout: weights are synced "
            "from the actor in the rollout dtype; set it to null"
        )
    if kwargs["max_model_len"] > kwargs["max_num_batched_tokens"] and not kwargs.get(
        "enable_chunked_prefill", True
    ):
        raise ValueError(
            f"{_SECTION}.max_num_batched_tokens={kwargs['max_num_batched_tokens']} is below "
            f"max_model_len={kwargs['max_model_len']} (prompt_length + response_length) with "
            "enable_chunked_prefill=False: raise max_num_batched_tokens or enable chunked prefill"
        )


def sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one response per request (rows are
    repeated `n` times before generation). Greedy is temperature 0; top_k -1 (or 0) and top_p 1
    are off; with `calculate_log_probs` the sampled token's log-prob is returned (`logprobs=0`).

    Stops are exactly the `jax` engine's: jrl's EOS ids as `stop_token_ids` (kept in the
    response; none with `ignore_eos`) and vLLM's own EOS handling off (`ignore_eos=True`), since
    vLLM would otherwise also stop at the generation config's `eos_token_id` entries."""
    return {
        "n": 1,
        "temperature": 0.0 if sampling.greedy else float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k > 0 else -1,
        "max_tokens": int(sampling.max_new_tokens),
        "ignore_eos": True,
        "stop_token_ids": [] if sampling.ignore_eos else list(sampling.eos_token_ids),
        "logprobs": 0 if sampling.calculate_log_probs else None,
        "detokenize": False,
    }


def parse_version(text: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as '0.11.0rc2' or '0.10.2+cu128'."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if match is None:
        raise ValueError(f"cannot read a version number from {text!r}")
    return tuple(int(g or 0) for g in match.groups())


def check_vllm_version(text: str) -> None:
    """Raise unless `text` is at least `MIN_VLLM_VERSION`."""
    if parse_version(text) < MIN_VLLM_VERSION:
        wanted = ".".join(map(str, MIN_VLLM_VERSION))
        raise ImportError(
            f"vllm {text} is too old for the vllm rollout (it needs vllm>={wanted}, V1 engine); "
            "upgrade vllm or set actor_rollout_ref.rollout.name=jax"
        )
