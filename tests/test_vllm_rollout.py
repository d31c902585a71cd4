"""The `vllm` rollout: HF-named weight export (the sync's own function) against transformers, the
config -> vLLM argument mapping, output assembly in the `jax` engine's layout, the engine class
around a stand-in for vLLM, and a real vLLM generate / sync / generate where vllm and a GPU exist.

vLLM cannot be installed here. `FakeRequestOutput` / `FakeCompletion` / `FakeLogprob` are plain
dataclasses standing in for vLLM's `RequestOutput`, `CompletionOutput` and `Logprob` (the fields our
code reads), and `FakeLLM` / `FakeSamplingParams` stand in for `vllm.LLM` and
`vllm.SamplingParams`: a transformers model decoding greedily, with sleep/wake bookkeeping.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import TINY_LLAMA, assert_close, jit_call, left_padded_inputs, randomise_adapters
from reference import FAMILIES, SHAPE, hf_family_model, torch_logits

from jrl.batch import Batch
from jrl.config import default_config, generation_config, resolve
from jrl.models import (
    apply_lora,
    default_position_ids,
    from_pretrained,
    init_random,
    save_pretrained,
)
from jrl.models.hf_export import hf_arrays, hf_torch_tensors
from jrl.models.layers import Linear
from jrl.parallel import make_mesh
from jrl.rollout import JaxRollout, SamplingParams
from jrl.rollout.vllm_args import (
    check_vllm_version,
    engine_kwargs,
    load_format,
    parse_version,
    sampling_kwargs,
)
from jrl.rollout.vllm_rollout import (
    assemble_batch,
    check_prompts,
    load_hf_weights,
    prompt_token_ids,
    read_outputs,
    row_seeds,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _batch_arrays():
    """Three rows of 12 tokens with 0, 2 and 9 tokens of left padding."""
    return left_padded_inputs((0, 2, 9), 12, SHAPE["vocab_size"], seed=2, low=2)


@pytest.fixture(scope="module")
def batch():
    return _batch_arrays()


def _transformers_model(config):
    """A transformers model built in memory from our config's HF fields (random weights)."""
    hf_config = transformers.AutoConfig.for_model(**config.to_hf())
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
    return model.eval()


def _load_export(model, **export):
    """A transformers model holding exactly what the weight sync exports from `model`."""
    target = _transformers_model(model.config)
    tensors = dict(hf_torch_tensors(model, **export))
    missing, unexpected = target.load_state_dict(tensors, strict=False)
    assert unexpected == []
    assert missing == (["lm_head.weight"] if model.config.tie_word_embeddings else [])
    return target, tensors


# -- weight export ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_loaded_into_transformers_gives_the_same_logits(name, batch, tmp_path):
    reference = hf_family_model(name)
    reference.save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path)
    loaded, tensors = _load_export(model, device=jax.devices()[0])
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors.values())
    assert_close(torch_logits(loaded, batch), torch_logits(reference, batch), batch[1], rel=1e-6)


def test_export_merges_lora_gathers_shards_and_casts(batch, tmp_path):
    reference = hf_family_model("qwen2")
    reference.save_pretrained(tmp_path, safe_serialization=True)
    model = apply_lora(from_pretrained(tmp_path, mesh=make_mesh(8)), rank=4, alpha=8)
    randomise_adapters(model)
    embed = model.model.embed_tokens.embedding.get_value()
    assert len(embed.devices()) == 8  # FSDP-sharded, so the export has to gather

    target = jax.devices()[3]
    placed = {name: value.devices() for name, value in hf_arrays(model, device=target)}
    assert set(map(frozenset, placed.values())) == {frozenset({target})}
    assert not any("lora" in name for name in placed)

    # the oracle: the HF model with W + (A @ B * alpha / rank) in HF's [out, in] layout
    weights = dict(reference.named_parameters())
    with torch.no_grad():
        for path, layer in nnx.iter_modules(model):
            if isinstance(layer, Linear) and layer.has_adapter:
                a, b = (np.asarray(p.get_value()) for p in (layer.lora_a, layer.lora_b))
                delta = torch.from_numpy((a @ b * layer.lora_scale).T.copy())
                weights[".".join(map(str, path)) + ".weight"].add_(delta)
    loaded, tensors = _load_export(model, device=target)
    assert_close(torch_logits(loaded, batch), torch_logits(reference, batch), batch[1], rel=1e-5)
    half = dict(hf_torch_tensors(model, dtype=jnp.bfloat16))
    assert half.keys() == tensors.keys()
    for name, value in half.items():
        assert value.dtype == torch.bfloat16, name
        assert torch.equal(value, tensors[name].to(torch.bfloat16)), name


# -- config -> vLLM arguments -----------------------------------------------------------------
def _rollout(**changes):
    rollout = resolve(default_config()).actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size = 1
    for key, value in changes.items():
        rollout[key] = value
    return rollout


def test_engine_arguments_follow_the_rollout_keys():
    cfg = _rollout(gpu_memory_utilization=0.4, max_num_seqs=64, max_num_batched_tokens=4096)
    kwargs = engine_kwargs(cfg, model_path="/models/m", trust_remote_code=True)
    assert kwargs == {
        "model": "/models/m",
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.4,
        "enforce_eager": True,
        "enable_sleep_mode": True,
        "load_format": "dummy",
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 64,
        "max_model_len": 1024,
        "seed": 0,
        "trust_remote_code": True,
        "tensor_parallel_size": 1,
        "data_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "disable_log_stats": True,
        "logprobs_mode": "processed_logprobs",
        "scheduling_policy": "fcfs",
        "skip_tokenizer_init": True,
    }
    cfg = _rollout(free_cache_engine=False, enforce_eager=False, dtype="fp16", max_model_len=300)
    cfg.cudagraph_capture_sizes = [1, 8]
    cfg.engine_kwargs.vllm = {"swap_space": 0, "max_num_seqs": 8}
    kwargs = engine_kwargs(cfg, model_path="m")
    assert not kwargs["enable_sleep_mode"] and kwargs["dtype"] == "float16"
    assert kwargs["compilation_config"] == {"cudagraph_capture_sizes": [1, 8]}
    assert kwargs["max_model_len"] == 300
    assert kwargs["swap_space"] == 0 and kwargs["max_num_seqs"] == 8  # engine_kwargs.vllm wins
    assert [load_format(f) for f in ("dummy_dtensor", "dummy_hf", "dtensor", "hf", "auto")] == [
        "dummy",
        "dummy",
        "auto",
        "auto",
        "auto",
    ]


def test_engine_arguments_from_the_generation_config():
    rollout = resolve(generation_config()).rollout  # fewer keys than the trainer's section
    kwargs = engine_kwargs(rollout, model_path="m")
    assert kwargs["max_model_len"] == 1536 + 512 and kwargs["seed"] == 0
    assert "logprobs_mode" not in kwargs and kwargs["enable_chunked_prefill"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tensor_model_parallel_size": 2}, "tensor_model_parallel_size=2: the vllm rollout runs"),
        ({"data_parallel_size": 2}, "data_parallel_size=2"),
        ({"quantization": "fp8"}, "quantization is not supported"),
        ({"dtype": "int8"}, "dtype='int8' is not one of"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 512},
            "raise max_num_batched_tokens",
        ),
    ],
)
def test_engine_arguments_reject_what_one_in_process_engine_cannot_run(changes, message):
    with pytest.raises(ValueError, match=message):
        engine_kwargs(_rollout(**changes), model_path="m")


def test_engine_arguments_name_a_missing_key():
    cfg = dict(_rollout().to_dict())
    del cfg["max_num_seqs"]
    with pytest.raises(KeyError, match="actor_rollout_ref.rollout.max_num_seqs"):
        engine_kwargs(cfg, model_path="m")


def test_sampling_arguments():
    base = dict(max_new_tokens=7, eos_token_ids=(2, 5), pad_token_id=0)
    sampled = sampling_kwargs(SamplingParams(**base, temperature=0.7, top_k=0, top_p=0.9, n=4))
    assert sampled == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 7,
        "ignore_eos": False,
        "stop_token_ids": [2, 5],
        "logprobs": None,
        "detokenize": False,
    }
    greedy = SamplingParams(**base, do_sample=False, top_k=20, calculate_log_probs=True)
    assert sampling_kwargs(greedy)["temperature"] == 0.0
    assert sampling_kwargs(greedy)["top_k"] == 20 and sampling_kwargs(greedy)["logprobs"] == 0
    ignoring = sampling_kwargs(SamplingParams(**base, ignore_eos=True))
    assert ignoring["ignore_eos"] and ignoring["stop_token_ids"] is None
    validation = SamplingParams.from_rollout_config(
        _rollout(), response_length=9, eos_token_ids=2, pad_token_id=0, validate=True
    )
    assert sampling_kwargs(validation)["temperature"] == 0.0


def test_vllm_version_floor():
    assert parse_version("0.11.0rc2") == (0, 11, 0)
    assert parse_version("0.10.2+cu128") == (0, 10, 2) and parse_version("1.0") == (1, 0, 0)
    check_vllm_version("0.10.2")
    check_vllm_version("0.12.0.dev3+g1234")
    with pytest.raises(ImportError, match="needs vllm>=0.10.2"):
        check_vllm_version("0.9.2")


# -- requests and outputs ---------------------------------------------------------------------
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


def _fake_output(i, tokens, log_probs=None):
    """vLLM's output shape: one dict per token holding the sampled token (and maybe others)."""
    steps = None
    if log_probs is not None:
        steps = [
            {t: FakeLogprob(lp), t + 1: FakeLogprob(-9.0)}
            for t, lp in zip(tokens, log_probs, strict=True)
        ]
    return FakeRequestOutput(str(i), [FakeCompletion(list(tokens), steps)])


def _prompts(ids, mask):
    ids, mask = np.asarray(ids, np.int32), np.asarray(mask, np.int32)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": np.asarray(default_position_ids(jnp.asarray(mask))),
    }
    return Batch(tensors, {"uid": np.array([f"p{i}" for i in range(len(ids))], object)})


def test_requests_drop_the_left_padding_and_seeds_follow_the_row():
    prompts = _prompts([[0, 0, 5, 6], [7, 8, 9, 3]], [[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_ids(prompts["input_ids"], prompts["attention_mask"]) == [
        [5, 6],
        [7, 8, 9, 3],
    ]
    rng = jax.random.key(4)
    seeds = row_seeds(rng, 5)
    assert seeds[:3] == row_seeds(rng, 3) and len(set(seeds)) == 5
    assert seeds != row_seeds(jax.random.key(5), 5)


def test_read_outputs_takes_the_sampled_tokens_log_probs():
    outputs = [_fake_output(0, [4, 2], [-0.5, -1.5]), _fake_output(1, [3], [-0.25])]
    assert read_outputs(outputs, False) == ([[4, 2], [3]], None)
    assert read_outputs(outputs, True) == ([[4, 2], [3]], [[-0.5, -1.5], [-0.25]])
    with pytest.raises(RuntimeError, match="no log-prob for some tokens of request 0"):
        read_outputs([_fake_output(0, [4, 2])], True)


TINY_PROMPTS = ([[0, 0, 9, 4, 33, 7], [12, 5, 60, 2, 8, 41]], [[0, 0, 1, 1, 1, 1], [1] * 6])
TINY_SAMPLING = SamplingParams(
    max_new_tokens=5, eos_token_ids=(1,), pad_token_id=0, n=2, do_sample=False,
    calculate_log_probs=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def jax_run():
    """A tiny model and the jax engine's greedy output (n=2, 5 of 8 response tokens)."""
    model = init_random(TINY_LLAMA, seed=3)
    engine = JaxRollout(model, response_length=8, pad_token_id=0, eos_token_ids=1)
    prompts = _prompts(*TINY_PROMPTS)
    return model, prompts, engine.generate(prompts, TINY_SAMPLING, jax.random.key(0)).to_numpy()


def _assert_same_batch(got, expected, atol=0.0):
    assert got.tensors.keys() == expected.tensors.keys()
    for key, value in expected.tensors.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=0, atol=atol, err_msg=key)
    assert got.meta.keys() == expected.meta.keys()
    for key, value in expected.meta.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_assembled_batch_is_the_jax_engines_output(jax_run):
    """The jax engine's responses, fed back as vLLM outputs, assemble into the same tensors."""
    _, prompts, expected = jax_run
    masks = expected["response_mask"].astype(bool)
    rows = zip(expected["responses"], expected["rollout_log_probs"], masks, strict=True)
    outputs = [_fake_output(i, t[m].tolist(), lp[m].tolist()) for i, (t, lp, m) in enumerate(rows)]
    tokens, log_probs = read_outputs(outputs, True)
    repeated = prompts.repeat(2, interleave=True)
    got = assemble_batch(repeated, tokens, log_probs, response_length=8, pad_token_id=0)
    _assert_same_batch(got.to_numpy(), expected)
    np.testing.assert_array_equal(got["uid"], ["p0", "p0", "p1", "p1"])


def test_assemble_batch_and_prompt_checks_name_the_problem():
    prompts = _prompts([[0, 5, 6]], [[0, 1, 1]])
    with pytest.raises(ValueError, match="2 responses for 1 prompt rows"):
        assemble_batch(prompts, [[1], [2]], None, response_length=4, pad_token_id=0)
    with pytest.raises(ValueError, match="5 tokens, over response_length=4"):
        assemble_batch(prompts, [[1] * 5], None, response_length=4, pad_token_id=0)
    sampling = SamplingParams(max_new_tokens=4, pad_token_id=0)
    right_padded = _prompts([[5, 6, 0]], [[1, 1, 0]])
    with pytest.raises(ValueError, match=r"prompt rows \[0\] end with padding"):
        check_prompts(right_padded, sampling, response_length=4, pad_token_id=0)
    with pytest.raises(ValueError, match="exceeds the rollout's response_length=3"):
        check_prompts(prompts, sampling, response_length=3, pad_token_id=0)
    with pytest.raises(KeyError, match="position_ids"):
        check_prompts(
            prompts.select(["input_ids", "attention_mask"]),
            sampling,
            response_length=4,
            pad_token_id=0,
        )


def test_load_hf_weights_reports_parameters_left_without_weights():
    """`load_hf_weights` runs on vLLM's worker; a torch module with vLLM's `load_weights`
    contract (copy what it is given, return the names it loaded) stands in for vLLM's model."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(2))
            self.b = torch.nn.Parameter(torch.zeros(3))

        def load_weights(self, weights):
            loaded = set()
            for name, tensor in weights:
                getattr(self, name).data.copy_(tensor)
                loaded.add(name)
            return loaded

    worker = type("Worker", (), {})()
    worker.model_runner = type("Runner", (), {})()
    worker.model_runner.model = Model()
    assert load_hf_weights(worker, iter([("a", torch.ones(2))])) == ["b"]
    assert torch.equal(worker.model_runner.model.a, torch.ones(2))
    assert load_hf_weights(worker, [("a", torch.ones(2)), ("b", torch.ones(3))]) == []


# -- the engine class around a stand-in for vLLM ---------------------------------------------
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


@pytest.fixture
def fake_vllm(monkeypatch):
    """`vllm` and `vllm.inputs` as modules holding the stand-ins, at a supported version."""
    import importlib.machinery
    import importlib.metadata
    import sys
    import types

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


def test_engine_syncs_sleeps_and_generates_like_the_jax_engine(fake_vllm, jax_run, tmp_path):
    from jrl.rollout.vllm_rollout import VllmRollout

    model, prompts, expected = jax_run
    save_pretrained(model, tmp_path)
    cfg = _rollout(dtype="float32", prompt_length=6, response_length=8)
    engine = VllmRollout(
        model, rollout_cfg=cfg, model_path=str(tmp_path), response_length=8, pad_token_id=0,
        eos_token_ids=1,
    )  # fmt: skip
    llm = engine.llm
    assert llm.kwargs == engine_kwargs(cfg, model_path=str(tmp_path))
    assert llm.calls == ["collective_rpc", "reset_prefix_cache", ("sleep", 1)]

    got = engine.generate(prompts, TINY_SAMPLING, jax.random.key(0)).to_numpy()
    _assert_same_batch(got, expected, atol=1e-5)
    assert llm.calls[3:] == [("wake_up", ("kv_cache", "weights")), "generate", ("sleep", 1)]

    scaled = jax.tree.map(lambda x: 1.5 * x if x.ndim == 2 else x, nnx.state(model))
    engine.update_weights(scaled)
    assert llm.calls[6:] == [("wake_up", ("weights",)), "collective_rpc", "reset_prefix_cache"]
    embed = llm.model.hf.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(embed, 1.5 * np.asarray(model.model.embed_tokens.embedding[...]))
    again = engine.generate(prompts, TINY_SAMPLING, jax.random.key(0)).to_numpy()
    assert llm.calls[9:] == [("wake_up", ("kv_cache",)), "generate", ("sleep", 1)]
    assert not np.allclose(again["rollout_log_probs"], got["rollout_log_probs"])


# -- real vLLM ----------------------------------------------------------------------------------
def _vllm_and_gpu() -> str | None:
    """Why the real-engine test cannot run here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU for vLLM"
    return None


@pytest.mark.skipif(_vllm_and_gpu() is not None, reason=str(_vllm_and_gpu()))
def test_vllm_generates_with_synced_weights_and_follows_a_weight_change(tmp_path):
    from jrl.rollout.vllm_rollout import VllmRollout

    hf_family_model("llama").save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path)
    cfg = _rollout(
        dtype="float32",
        gpu_memory_utilization=0.2,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        prompt_length=12,
        response_length=8,
        calculate_log_probs=True,
    )
    engine = VllmRollout(
        model, rollout_cfg=cfg, model_path=str(tmp_path), response_length=8, pad_token_id=0,
        eos_token_ids=None,
    )  # fmt: skip
    ids, mask, _ = _batch_arrays()
    prompts = _prompts(ids, mask)
    greedy = SamplingParams(max_new_tokens=8, do_sample=False, calculate_log_probs=True)
    first = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    assert first["responses"].shape == (3, 8) and first["response_mask"].all()

    # vLLM's log-probs of its own tokens are the JAX model's: the dummy weights were replaced
    full = (first["input_ids"], first["attention_mask"], first["position_ids"])
    logits = jit_call(model, full)[:, 11:-1]
    expected = np.take_along_axis(jax.nn.log_softmax(logits), first["responses"][..., None], -1)
    np.testing.assert_allclose(first["rollout_log_probs"], expected[..., 0], atol=2e-3)

    state = jax.tree.map(lambda x: 1.5 * x if x.ndim == 2 else x, nnx.state(model))
    engine.update_weights(state)
    second = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    assert not np.array_equal(second["rollout_log_probs"], first["rollout_log_probs"])
