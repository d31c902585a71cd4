"""A stand-in for the `vllm` package, which cannot run here (it needs a GPU and cannot be
installed), used only where vLLM itself cannot exist: the tests of the `vllm` rollout engine and
of the `Rollout` protocol build that engine around it. Everything of ours around vLLM is the real
code; only vLLM is replaced.

`FakeRequestOutput` / `FakeCompletion` / `FakeLogprob` are plain dataclasses standing in for
vLLM's `RequestOutput`, `CompletionOutput` and `Logprob` (the fields our code reads), and
`FakeLLM` / `FakeSamplingParams` stand in for `vllm.LLM` and `vllm.SamplingParams`: a transformers
model decoding greedily, with sleep/wake bookkeeping. `install_fake_vllm` puts them in
`sys.modules` as `vllm` (the `fake_vllm` fixture of `conftest.py`).

Also the pieces the two test modules share: tiny left-padded prompts (`TINY_PROMPTS`,
`prompt_batch`), greedy sampling settings (`TINY_SAMPLING`) and a rollout config for one
in-process engine (`tiny_rollout_config`)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.metadata
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from jrl.batch import Batch
from jrl.config import default_config, resolve
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


def tiny_rollout_config(**changes):
    """The default config's rollout section for one tensor-parallel rank, with `changes`."""
    rollout = resolve(default_config()).actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size = 1
    for key, value in changes.items():
        rollout[key] = value
    return rollout


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
class InprocClient:
    """Named as vLLM's in-process engine client, which the engine checks for."""


class FakeVllmModel(torch.nn.Module):
    """A transformers model with vLLM's `load_weights` contract (HF names in, loaded names out)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def load_weights(self, weights):
        params, loaded = dict(self.hf.named_parameters()), set()
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            loaded.add("hf." + name)
        return loaded


class FakeLLM:
    """Stands in for `vllm.LLM` (vLLM cannot be installed here): a randomly initialised
    transformers model (vLLM's dummy load), greedy decoding with log-probs, and sleep/wake
    bookkeeping that refuses work while the memory it needs is asleep."""

    def __init__(self, **kwargs):
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
        return [method(worker, *args)]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, params, use_tqdm=True):
        assert not self.asleep and not use_tqdm
        self.calls.append("generate")
        return [self._greedy(i, p["prompt_token_ids"], sp) for i, (p, sp) in enumerate(zip(
            prompts, params, strict=True))]  # fmt: skip

    def _greedy(self, i, prompt, params):
        assert params.temperature == 0 and params.n == 1 and not params.detokenize
        ids, tokens, steps = list(prompt), [], []
        with torch.no_grad():
            while len(tokens) < params.max_tokens:
                logits = self.model.hf(torch.tensor([ids])).logits[0, -1]
                token = int(torch.argmax(logits))
                log_prob = float(torch.log_softmax(logits, -1)[token])
                tokens.append(token)
                steps.append({token: FakeLogprob(log_prob)})
                ids.append(token)
                if token in (params.stop_token_ids or ()):
                    break
        return FakeRequestOutput(str(i), [FakeCompletion(tokens, steps)])


@dataclasses.dataclass
class FakeSamplingParams:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int] | None
    logprobs: int | None
    detokenize: bool
    seed: int


def install_fake_vllm(monkeypatch) -> None:
    """`vllm` and `vllm.inputs` as modules holding the stand-ins, at a supported version (undone
    with `monkeypatch`)."""
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.11.0" if name == "vllm" else version(name)
    )
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
