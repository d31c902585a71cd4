"""Decoder families (Llama 3.1 RoPE, Qwen2 sliding, Qwen3, Mistral, Gemma 2, Gemma 3) against
transformers (torch, CPU, fp32), and the attention implementations against each other."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (
    assert_close,
    checkpoint_cache,
    jit_call,
    left_padded_inputs,
    prefill_then_decode,
)
from reference import (
    FAMILIES,
    LLAMA3_ROPE,
    SHAPE,
    assert_export_roundtrip,
    hf_family_model,
    torch_logits,
)

from jrl.models import CausalLM, ModelConfig, from_pretrained
from jrl.models.attention import Visibility, _flash_kernel, attention, splash_attention
from jrl.models.config import RopeScaling
from jrl.models.layers import rope_frequencies

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """name -> (HF folder, torch model), each built once."""
    return checkpoint_cache(tmp_path_factory, hf_family_model)


@pytest.fixture(scope="module")
def batch():
    """Three rows of 12 tokens with 0, 2 and 9 tokens of left padding."""
    return left_padded_inputs((0, 2, 9), 12, SHAPE["vocab_size"], seed=1)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers_with_left_padding(name, checkpoint, batch):
    path, hf_model = checkpoint(name)
    model = from_pretrained(path)
    assert model.config.model_type == name
    assert_close(jit_call(model, batch), torch_logits(hf_model, batch), batch[1])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_save_pretrained_roundtrip_in_transformers(name, checkpoint, batch, tmp_path):
    assert_export_roundtrip(*checkpoint(name), batch, tmp_path)


def test_family_configs_are_read_as_transformers_reads_them(checkpoint):
    llama = from_pretrained(checkpoint("llama")[0]).config
    assert llama.rope_scaling == RopeScaling("llama3", 4.0, 1.0, 4.0, 16)
    qwen2 = from_pretrained(checkpoint("qwen2")[0]).config
    assert qwen2.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    assert qwen2.attention_bias and not qwen2.output_bias
    qwen3 = from_pretrained(checkpoint("qwen3")[0])
    assert qwen3.config.head_dim == 32 and qwen3.config.output_bias
    assert qwen3.model.layers[0].self_attn.q_norm.scale.shape == (32,)
    gemma2 = from_pretrained(checkpoint("gemma2")[0]).config
    assert gemma2.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert gemma2.hidden_act == "gelu_pytorch_tanh" and gemma2.attention_scale == 24**-0.5
    gemma3 = from_pretrained(checkpoint("gemma3_text")[0]).config
    assert gemma3.layer_rope(0) == (100.0, None)
    assert gemma3.layer_rope(1) == (1e6, RopeScaling("linear", 2.0))
    assert gemma3.final_logit_softcapping is None and gemma3.tie_word_embeddings
    legacy = {  # the pre-transformers-5 way of writing the same Gemma 3 config
        k: v for k, v in gemma3.to_hf().items() if k not in ("layer_types", "rope_parameters")
    }
    legacy["sliding_window_pattern"] = 2
    assert ModelConfig.from_hf(legacy) == gemma3


@pytest.mark.parametrize("name", ["mistral", "gemma3_text"])
def test_forward_cached_keeps_the_sliding_window(name, checkpoint, batch):
    model = from_pretrained(checkpoint(name)[0])
    logits, _ = prefill_then_decode(model, batch, prompt=5, max_len=14)
    ref = torch_logits(checkpoint(name)[1], batch)
    assert_close(logits, ref, batch[1])


def test_bf16_compute_stays_close_to_fp32(checkpoint, batch):
    path, hf_model = checkpoint("gemma2")
    logits = jit_call(from_pretrained(path, dtype=jnp.bfloat16), batch)
    assert logits.dtype == np.float32
    assert_close(logits, torch_logits(hf_model, batch), batch[1], rel=5e-2)


def test_sdpa_model_matches_eager_model(checkpoint, batch):
    path, hf_model = checkpoint("gemma3_text")
    eager = from_pretrained(path)
    config = dataclasses.replace(eager.config, attn_implementation="sdpa")
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))
    sdpa = nnx.merge(graphdef, nnx.state(eager))
    assert sdpa.model.layers[0].self_attn.implementation == "sdpa"
    assert_close(jit_call(sdpa, batch), torch_logits(hf_model, batch), batch[1])


def _qkv(t, s, seed=0):
    """Random q [2, t, 4, 16] and k, v [2, s, 2, 16] (GQA with two query heads per kv head)."""
    rng = np.random.RandomState(seed)
    q = rng.normal(size=(2, t, 4, 16)).astype(np.float32)
    return q, *(rng.normal(size=(2, s, 2, 16)).astype(np.float32) for _ in range(2))


def _left_padded(length, pads=(0, 3)):
    return np.arange(length)[None, :] >= np.asarray(pads)[:, None]


@functools.partial(
    jax.jit, static_argnames=("self_attention", "scale", "window", "softcap", "impl")
)
def _attend(q, k, v, kv_valid, q_slots, *, self_attention, impl, **kw):
    """`attention` under jit (warnings about the kernel choice come at the first trace)."""
    visibility = Visibility(kv_valid, q_slots, self_attention)
    return attention(q, k, v, visibility, implementation=impl, **kw)


@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_equals_eager_with_padding_gqa_window_and_cache(window):
    q, k, v = _qkv(7, 7)
    full = (_left_padded(7), np.arange(7))
    kw = dict(scale=0.3, window=window, self_attention=True)
    np.testing.assert_allclose(
        _attend(q, k, v, *full, impl="sdpa", **kw),
        _attend(q, k, v, *full, impl="eager", **kw),
        atol=1e-5,
    )
    q1, kw["self_attention"] = q[:, :1], False
    decode = (_left_padded(7) & (np.arange(7) != 5), np.array([6]))
    out = _attend(q1, k, v, *decode, impl="sdpa", **kw)
    np.testing.assert_allclose(out, _attend(q1, k, v, *decode, impl="eager", **kw), atol=1e-5)
    # Masked keys must not matter: poison them and the row's output stays the same.
    poisoned = v.copy()
    poisoned[:, 5], poisoned[1, :3] = 1e4, -1e4
    if window:
        poisoned[:, :4] = 1e4
    np.testing.assert_allclose(_attend(q1, k, poisoned, *decode, impl="sdpa", **kw), out, atol=1e-5)


@pytest.mark.parametrize(
    ("first", "window", "softcap", "seen"),
    [
        (0, None, None, {128, 256, 300}),
        (0, 50, 2.0, {128, 256, 300}),
        (100, None, None, {228, 300}),
    ],
)
def test_eager_causal_blocks_skip_unseen_columns_and_equal_the_whole_product(
    first, window, softcap, seen
):
    """Queries in blocks of `CAUSAL_BLOCK` over the columns up to each block's last query: the
    same output as one product over every column, with fewer columns in the blocks' products."""
    columns = 300
    q, k, v = _qkv(columns - first, columns)
    valid = _left_padded(columns, pads=(0, 37))
    slots = first + np.arange(columns - first)
    kw = dict(scale=0.3, window=window, softcap=softcap, implementation="eager")

    def attend(q, k, v, first_query_slot):
        visibility = Visibility(valid, slots, first == 0, first_query_slot=first_query_slot)
        return attention(q, k, v, visibility, **kw)

    blocked = functools.partial(attend, first_query_slot=first)
    whole = functools.partial(attend, first_query_slot=None)
    np.testing.assert_allclose(jax.jit(blocked)(q, k, v), jax.jit(whole)(q, k, v), atol=1e-6)
    key_lengths = {
        eq.invars[1].aval.shape[1]
        for eq in jax.make_jaxpr(blocked)(q, k, v).jaxpr.eqns
        if eq.primitive.name == "dot_general" and eq.invars[1].aval.ndim == 4
    }
    assert key_lengths == seen


def _float64_attention(q, k, v, allowed, scale, softcap=None):
    """Softmax attention in float64: q [B, T, H, D], k and v [B, S, K, D] (query head h uses
    kv head h // (H / K)), allowed [B, T, S] bool -> [B, T, H, D]."""
    group = q.shape[2] // k.shape[2]
    keys, values = (np.repeat(x.astype(np.float64), group, axis=2) for x in (k, v))
    scores = scale * np.einsum("bthd,bshd->bhts", q.astype(np.float64), keys)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(allowed[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", probs, values)


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize(
    ("dtype", "atol", "products"), [(np.float32, 2e-6, 1), (jnp.bfloat16, 2e-2, 0)]
)
def test_a_decode_query_sums_its_products_on_cpu_and_matches_float64(
    softcap, dtype, atol, products
):
    """One query per row (a decode step) on CPU: the scores are q * k summed over the head
    dimension, and with 16-bit queries against a float32 cache (the CPU's bfloat16 cache) the
    output is probs * v summed over the keys too (a float32 query keeps that `dot_general`);
    either way equal to attention computed in float64."""
    q, k, v = _qkv(1, 9, seed=3)
    q = np.asarray(jnp.asarray(q, dtype))
    valid = _left_padded(9, pads=(0, 4))
    kw = dict(scale=0.3, softcap=softcap, self_attention=False, impl="eager")
    out = _attend(q, k, v, valid, np.array([8]), **kw)
    want = _float64_attention(q, k, v, valid[:, None], 0.3, softcap)
    assert out.dtype == dtype
    np.testing.assert_allclose(np.asarray(out, np.float64), want, atol=atol)
    jaxpr = jax.make_jaxpr(functools.partial(_attend, **kw))(q, k, v, valid, np.array([8]))
    eqns = jaxpr.eqns[0].params["jaxpr"].eqns
    assert sum(e.primitive.name == "dot_general" for e in eqns) == products


def test_a_bfloat16_prefill_multiplies_a_float32_cache_of_bfloat16_values_in_bfloat16():
    """Several bfloat16 queries against float32 keys and values holding bfloat16 values (the
    CPU's cache): both products take bfloat16 operands (XLA:CPU's matrix units), and the output
    equals attention computed in float64."""
    q, k, v = (np.asarray(jnp.asarray(x, jnp.bfloat16)) for x in _qkv(5, 9, seed=4))
    k, v = k.astype(np.float32), v.astype(np.float32)
    valid = _left_padded(9, pads=(0, 4))
    kw = dict(scale=0.3, self_attention=False, impl="eager")
    out = _attend(q, k, v, valid, np.arange(4, 9), **kw)
    causal = np.arange(9)[None, :] <= np.arange(4, 9)[:, None]
    want = _float64_attention(q, k, v, valid[:, None, :] & causal[None], 0.3)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, atol=3e-2)
    jaxpr = jax.make_jaxpr(functools.partial(_attend, **kw))(q, k, v, valid, np.arange(4, 9))
    dots = [e for e in jaxpr.eqns[0].params["jaxpr"].eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 2
    assert all(x.aval.dtype == jnp.bfloat16 for e in dots for x in e.invars)


@pytest.mark.parametrize("requested", ["sdpa", "flash_attention_2"])
def test_unsupported_choices_fall_back_with_a_warning(requested):
    q, k, v = _qkv(5, 5)
    args = (q, k, v, _left_padded(5), np.arange(5))
    kw = dict(scale=0.25, window=2, self_attention=True)
    ref = _attend(*args, impl="eager", softcap=1.5, **kw)
    with pytest.warns(UserWarning, match=f"attn_implementation='{requested}'.*'eager'"):
        out = _attend(*args, impl=requested, softcap=1.5, **kw)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    uncapped = _attend(*args, impl="eager", softcap=None, **kw)
    assert np.abs(np.asarray(ref - uncapped)).max() > 1e-3  # soft-capping is not a no-op


def test_flash_attention_2_on_cpu_runs_sdpa_with_a_warning():
    args = (*_qkv(5, 5), _left_padded(5), np.arange(5))
    kw = dict(scale=0.25, self_attention=True)
    with pytest.warns(UserWarning, match="backend is 'cpu'; using 'sdpa'"):
        out = _attend(*args, impl="flash_attention_2", **kw)
    np.testing.assert_allclose(out, _attend(*args, impl="eager", **kw), atol=1e-5)


@pytest.mark.parametrize(
    "backend, softcap, dtype, length, cached, kernel",
    [
        ("tpu", None, jnp.bfloat16, 256, False, "splash"),
        ("tpu", 2.0, jnp.float32, 128, False, "splash"),
        ("tpu", None, jnp.bfloat16, 100, False, "sdpa"),
        ("tpu", 2.0, jnp.bfloat16, 128, True, "eager"),
        ("gpu", None, jnp.bfloat16, 100, True, "cudnn"),
        ("gpu", None, jnp.float32, 128, False, "sdpa"),
        ("gpu", 2.0, jnp.bfloat16, 128, False, "eager"),
        ("cpu", None, jnp.bfloat16, 128, False, "sdpa"),
    ],
)
def test_flash_attention_2_kernel_choice_per_backend(
    backend, softcap, dtype, length, cached, kernel
):
    visibility = Visibility(
        np.ones((1, length), bool), np.arange(1 if cached else length), not cached
    )
    picked, reason = _flash_kernel(backend, softcap=softcap, dtype=dtype, visibility=visibility)
    assert picked == kernel
    assert (reason is None) == (kernel in ("splash", "cudnn"))


def test_splash_kernel_interpreted_matches_eager_with_gradients():
    t = 128
    q, k, v = _qkv(t, t, seed=3)
    valid = _left_padded(t, pads=(0, 37))
    kw = dict(scale=0.3, window=5, softcap=2.0)
    slots = np.arange(t)
    cotangent = np.random.RandomState(4).normal(size=q.shape).astype(np.float32)
    cotangent *= valid[..., None, None]  # the rows of padding differ by design; never used

    def splash(q, k, v):
        return splash_attention(q, k, v, valid, interpret=True, **kw)

    def eager(q, k, v):
        return attention(q, k, v, Visibility(valid, slots, self_attention=True), **kw)

    def out_and_grads(fn, q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out * valid[..., None, None], vjp(cotangent)

    ours = jax.jit(functools.partial(out_and_grads, splash))(q, k, v)
    ref = jax.jit(functools.partial(out_and_grads, eager))(q, k, v)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), ours, ref)


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, {"rope_type": "linear", "factor": 3.0}])
def test_rope_frequencies_match_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.LlamaConfig(**SHAPE, rope_theta=5e5, rope_scaling=dict(rope))
    expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf)
    ours = rope_frequencies(16, 5e5, RopeScaling.from_hf(rope, "rope_scaling", 64))
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling has rope_type 'yarn'",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
        ({"rope_scaling": {"rope_type": "linear"}}, "lacks 'factor'"),
        ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"model_type": "gemma3"}, "model_type 'gemma3' is not supported .*text model"),
        ({"attn_implementation": "flex_attention"}, "attn_implementation 'flex_attention'"),
        ({"layer_types": ["full_attention"]}, "layer_types must list 3 values"),
        ({"sliding_window": 0}, "sliding_window must be a positive integer"),
    ],
)
def test_unsupported_config_values_name_the_key(checkpoint, change, match):
    hf = json.loads((checkpoint("gemma2")[0] / "config.json").read_text())
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf({**hf, **change})


def test_attn_implementation_from_config_json_and_replace(checkpoint):
    hf = json.loads((checkpoint("mistral")[0] / "config.json").read_text())
    config = ModelConfig.from_hf({**hf, "_attn_implementation": "sdpa"})
    assert config.attn_implementation == "sdpa"
    assert "attn_implementation" not in config.to_hf()
    assert dataclasses.replace(config, attn_implementation="eager") == ModelConfig.from_hf(hf)
    with pytest.raises(ValueError, match="attn_implementation 'flash'"):
        dataclasses.replace(config, attn_implementation="flash")
