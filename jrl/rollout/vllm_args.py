"""verl's `rollout` keys as arguments of vLLM's `LLM(...)` and `SamplingParams(...)`.

Pure Python (no vLLM import), so the mapping is checked anywhere. The engine these arguments
build runs in this process on one GPU (see `jrl.rollout.vllm_rollout`), hence the checks that
reject settings needing several engine processes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from jrl.rollout.sampling import SamplingParams

_SECTION = "actor_rollout_ref.rollout"
# The oldest vLLM whose V1 engine has everything used here: `logprobs_mode`, `wake_up(tags=...)`,
# in-process `collective_rpc` with a callable, and model buffers kept across sleep.
MIN_VLLM_VERSION = (0, 10, 2)
_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "float32": "float32",
    "fp32": "float32",
}
# Keys handed to `vllm.LLM` unchanged when the section has them (and they are not null).
VLLM_PASS_THROUGH = (
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "disable_log_stats",
    "logprobs_mode",
    "scheduling_policy",
    "skip_tokenizer_init",
)
_SINGLE_ENGINE = {
    "tensor_model_parallel_size": "tensor_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "pipeline_model_parallel_size": "pipeline_parallel_size",
}


def _get(cfg: Any, key: str, default: Any = ...) -> Any:
    """`cfg[key]`; a missing key is an error naming it unless a default is given."""
    try:
        value = cfg[key]
    except (KeyError, AttributeError, TypeError):
        if default is ...:
            raise KeyError(f"missing config key {_SECTION}.{key}") from None
        return default
    return default if value is None and default is not ... else value


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


def engine_kwargs(
    rollout_cfg: Any, *, model_path: str, trust_remote_code: bool = False
) -> dict[str, Any]:
    """Keyword arguments of `vllm.LLM` from the rollout section; `engine_kwargs.vllm` entries
    are applied last and win. Raises for settings this in-process engine cannot run."""
    prompt_length = int(_get(rollout_cfg, "prompt_length"))
    response_length = int(_get(rollout_cfg, "response_length"))
    kwargs: dict[str, Any] = {
        "model": os.path.expanduser(str(model_path)),
        "dtype": vllm_dtype(_get(rollout_cfg, "dtype")),
        "gpu_memory_utilization": float(_get(rollout_cfg, "gpu_memory_utilization")),
        "enforce_eager": bool(_get(rollout_cfg, "enforce_eager")),
        "enable_sleep_mode": bool(_get(rollout_cfg, "free_cache_engine")),
        "load_format": load_format(_get(rollout_cfg, "load_format")),
        "max_num_batched_tokens": int(_get(rollout_cfg, "max_num_batched_tokens")),
        "max_num_seqs": int(_get(rollout_cfg, "max_num_seqs")),
        "max_model_len": int(_get(rollout_cfg, "max_model_len", prompt_length + response_length)),
        "seed": int(_get(rollout_cfg, "seed", 0)),
        "trust_remote_code": bool(trust_remote_code),
    }
    for key, vllm_key in _SINGLE_ENGINE.items():
        kwargs[vllm_key] = int(_get(rollout_cfg, key, 1))
    for key in VLLM_PASS_THROUGH:
        value = _get(rollout_cfg, key, None)
        if value is not None:
            kwargs[key] = value
    sizes = _get(rollout_cfg, "cudagraph_capture_sizes", None)
    if sizes and not kwargs["enforce_eager"]:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": [int(s) for s in sizes]}
    extra = _get(_get(rollout_cfg, "engine_kwargs", {}), "vllm", None) or {}
    kwargs.update(extra.to_dict() if hasattr(extra, "to_dict") else dict(extra))
    _check_engine(rollout_cfg, kwargs)
    return kwargs


def _check_engine(rollout_cfg: Any, kwargs: Mapping[str, Any]) -> None:
    """Reject what needs more than one in-process engine on one GPU, or quantized weights."""
    for key, vllm_key in _SINGLE_ENGINE.items():
        if kwargs[vllm_key] != 1:
            raise ValueError(
                f"{_SECTION}.{key}={kwargs[vllm_key]}: the vllm rollout runs one in-process "
                f"engine on one GPU; set {_SECTION}.{key}=1 (or use rollout.name=jax, which "
                "shards over the mesh)"
            )
    if int(_get(rollout_cfg, "expert_parallel_size", 1)) != 1:
        raise ValueError(f"{_SECTION}.expert_parallel_size must be 1 for the vllm rollout")
    if _get(rollout_cfg, "quantization", None) or kwargs.get("quantization"):
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
