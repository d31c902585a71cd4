"""Decoder models and weight I/O against transformers (torch, CPU, fp32)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import assert_close, jit_call, left_padded_inputs, prefill_then_decode
from reference import SHAPE, randomise, torch_logits
from safetensors.numpy import load_file, save_file

import jrl.models.decoder as decoder_module
import jrl.models.dtypes as dtypes_module
from jrl.models import (
    CausalLM,
    ModelConfig,
    ValueModel,
    from_pretrained,
    gguf_to_hf_folder,
    init_random,
    save_pretrained,
)
from jrl.models.kv_layout import HEADS_MAJOR, TOKENS_MAJOR, TOKENS_MINOR
from jrl.models.layers import dense

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_llama():
    cfg = transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False, rope_theta=5e5)
    return randomise(transformers.LlamaForCausalLM(cfg))


def _hf_qwen2(cls_name="Qwen2ForCausalLM", **extra):
    cfg = transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True, rope_theta=1e4, **extra)
    return randomise(getattr(transformers, cls_name)(cfg))


@pytest.fixture(scope="module")
def batch():
    """Three rows with 0, 3 and 7 tokens of left padding."""
    return left_padded_inputs((0, 3, 7), 10, SHAPE["vocab_size"], seed=0)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    model = _hf_llama()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@pytest.fixture(scope="module")
def qwen2_sharded_dir(tmp_path_factory):
    model = _hf_qwen2()
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path, safe_serialization=True, max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").exists()
    return path, model


@pytest.mark.parametrize("which", ["llama_dir", "qwen2_sharded_dir"])
def test_logits_match_transformers_with_left_padding(which, request, batch):
    path, hf_model = request.getfixturevalue(which)
    model = from_pretrained(path)
    assert isinstance(model, CausalLM)
    assert (model.lm_head is None) == (which == "qwen2_sharded_dir")
    assert_close(jit_call(model, batch), torch_logits(hf_model, batch), batch[1])


@pytest.mark.parametrize("head_dim, platform", [(16, "cpu"), (16, "gpu"), (128, "gpu")])
def test_forward_cached_prefill_then_decode_matches_full_forward(
    head_dim, platform, tmp_path, batch, monkeypatch
):
    """Every cache layout: tokens-major for head_dim 16 on a GPU (its rule, here on the CPU),
    heads-major for head_dim 128 there, keys tokens-minor and values heads-major on a CPU."""
    monkeypatch.setattr(decoder_module, "mesh_platform", lambda: platform)
    cfg = transformers.LlamaConfig(**SHAPE, head_dim=head_dim, tie_word_embeddings=False)
    hf_model = randomise(transformers.LlamaForCausalLM(cfg))
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path)
    ids, mask, _ = batch
    max_len = 12
    logits, cache = prefill_then_decode(model, batch, prompt=6, max_len=max_len)
    assert_close(logits, torch_logits(hf_model, batch), mask)
    layout = model.config.kv_layout(platform)
    expected = {"cpu": (TOKENS_MINOR, HEADS_MAJOR), "gpu": (TOKENS_MAJOR, TOKENS_MAJOR)}[platform]
    assert layout.orders == (expected if head_dim == 16 else (HEADS_MAJOR, HEADS_MAJOR))
    per_layer = platform == "cpu"  # a buffer per layer on a CPU, else one [layers, ...]
    for order, part in zip(layout.orders, cache, strict=True):
        layers = part if per_layer else tuple(part[0])
        assert len(part) == (2 if per_layer else 1) and len(layers) == 2
        for layer in layers:
            assert layer.shape == order.shape(3, max_len, 2, head_dim)
            unused = np.asarray(order.take(layer))[:, ids.shape[1] :]
            assert not unused.any()  # unused slots stay empty


def test_save_pretrained_loads_in_transformers(llama_dir, batch, tmp_path):
    path, hf_model = llama_dir
    model = from_pretrained(path)
    out = tmp_path / "export"
    out.mkdir()
    (out / "stale.txt").write_text("replaced atomically")
    save_pretrained(model, out)
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp folders left
    assert ModelConfig.from_hf(json.loads((out / "config.json").read_text())) == model.config
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert_close(torch_logits(reloaded, batch), torch_logits(hf_model, batch), batch[1], rel=1e-6)


def test_save_pretrained_shards_and_keeps_bf16(qwen2_sharded_dir, tmp_path):
    model = from_pretrained(qwen2_sharded_dir[0], param_dtype=jnp.bfloat16)
    save_pretrained(model, tmp_path / "bf16", max_shard_bytes=30_000)
    index = json.loads((tmp_path / "bf16" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and "lm_head.weight" not in index["weight_map"]
    tensors = {k: v for f in files for k, v in load_file(tmp_path / "bf16" / f).items()}
    assert {str(t.dtype) for t in tensors.values()} == {"bfloat16"}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = from_pretrained(tmp_path / "bf16", param_dtype=jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(again.lm_head_kernel()), np.asarray(model.lm_head_kernel())
    )


def test_value_model_from_causal_lm_checkpoint(qwen2_sharded_dir, batch):
    path = qwen2_sharded_dir[0]
    critic = from_pretrained(path, kind="value", seed=3)
    assert isinstance(critic, ValueModel)
    weight = np.asarray(critic.score.kernel[...])
    assert weight.shape == (64, 1) and 0.005 < weight.std() < 0.05  # N(0, 0.02)
    assert not np.asarray(critic.score.bias[...]).any()
    again = from_pretrained(path, kind="value", seed=3)
    np.testing.assert_array_equal(np.asarray(again.score.kernel[...]), weight)
    hidden = np.asarray(from_pretrained(path).hidden(*(jnp.asarray(a) for a in batch)))
    values = np.asarray(critic(*(jnp.asarray(a) for a in batch)))
    assert values.shape == (3, 10) and values.dtype == np.float32
    assert_close(values, (hidden @ weight)[..., 0], batch[1], rel=1e-5)


def test_value_model_token_classification_roundtrip(batch, tmp_path):
    hf_model = _hf_qwen2("Qwen2ForTokenClassification", num_labels=1)
    hf_model.save_pretrained(tmp_path / "tc", safe_serialization=True)
    critic = from_pretrained(tmp_path / "tc", kind="value")
    ref = torch_logits(hf_model, batch)[..., 0]
    assert_close(jit_call(critic, batch), ref, batch[1])
    save_pretrained(critic, tmp_path / "export")
    cls = transformers.AutoModelForTokenClassification
    reloaded = cls.from_pretrained(tmp_path / "export").eval()
    assert reloaded.config.num_labels == 1
    assert_close(torch_logits(reloaded, batch)[..., 0], ref, batch[1], rel=1e-6)


def test_bf16_compute_keeps_float32_logits_and_cache_dtype(llama_dir, batch):
    exact = jit_call(from_pretrained(llama_dir[0]), batch)
    model = from_pretrained(llama_dir[0], dtype=jnp.bfloat16)
    assert model.model.embed_tokens.embedding.dtype == jnp.float32  # storage stays fp32
    logits = jit_call(model, batch)
    assert logits.dtype == np.float32
    assert_close(logits, exact, batch[1], rel=5e-2)
    cache = model.init_cache(3, 10)
    # On a CPU the cache holds its bfloat16 values in float32 (`KVLayout.float32_storage`).
    assert {x.dtype for x in (*cache.k, *cache.v)} == {jnp.dtype(jnp.float32)}
    ids, mask, pos = (jnp.asarray(a) for a in batch)
    hidden, cache, _ = jax.jit(CausalLM.forward_cached)(model, ids, pos, cache, 0, mask)
    assert_close(np.asarray(model.logits(hidden)), exact, batch[1], rel=5e-2)
    for x in (*cache.k, *cache.v):  # bfloat16 values, exactly
        np.testing.assert_array_equal(x, x.astype(jnp.bfloat16).astype(jnp.float32))


def test_bf16_linear_on_cpu_accumulates_in_float32_and_rounds_once(monkeypatch):
    """On a CPU a bf16 layer asks for the float32 product and rounds it once (XLA:CPU runs that
    on AMX; a bf16-output dot ran 6x slower); the bias is added in bf16 afterwards."""
    layer = dense(
        64,
        32,
        (None, None),
        use_bias=True,
        std=0.5,
        dtype=jnp.bfloat16,
        param_dtype=jnp.float32,
        rngs=nnx.Rngs(0),
    )
    layer.bias[...] = jax.random.normal(jax.random.key(1), (32,))
    x = jax.random.normal(jax.random.key(2), (4, 64)).astype(jnp.bfloat16)
    text = jax.jit(lambda x: layer(x)).lower(x).as_text()
    products = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len(products) == 1 and products[0].endswith("-> tensor<4x32xf32>")
    y = np.asarray(layer(x).astype(jnp.float32))
    kernel = np.asarray(layer.kernel[...].astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    exact = np.asarray(x.astype(jnp.float32), np.float64) @ kernel
    rounded = jnp.asarray(exact, jnp.float32).astype(jnp.bfloat16) + layer.bias[...].astype(
        jnp.bfloat16
    )
    np.testing.assert_allclose(y, np.asarray(rounded.astype(jnp.float32)), rtol=2**-7, atol=2**-7)
    # Traced for a TPU (or GPU), the product stays bf16: a float32 result would make the
    # backward pass multiply in float32 there.
    monkeypatch.setattr(dtypes_module, "mesh_platform", lambda: "tpu")
    text = jax.jit(lambda x: layer(x)).lower(x).as_text()
    products = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len(products) == 1 and products[0].endswith("-> tensor<4x32xbf16>")


def test_init_random_and_config_roundtrip():
    cfg = ModelConfig.from_hf(_hf_qwen2().config.to_dict())
    assert cfg.attention_bias and cfg.tie_word_embeddings and cfg.head_dim == 16
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg
    model = init_random(cfg, kind="value", seed=1)
    assert isinstance(model, ValueModel) and model.model.embed_tokens.embedding.shape == (128, 64)
    with pytest.raises(ValueError, match="unknown model kind"):
        init_random(cfg, kind="classifier")


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"model_type": "gpt2"}, ValueError, "model_type 'gpt2' is not supported"),
        ({"rope_scaling": {"rope_type": "dynamic"}}, ValueError, "rope_type 'dynamic'"),
        ({"vocab_size": 100}, ValueError, r"lm_head.weight has shape \(128, 64\).*\(100, 64\)"),
        ({"attention_bias": True}, KeyError, "self_attn.q_proj.bias"),
    ],
)
def test_clear_errors_on_bad_config(llama_dir, tmp_path, change, error, match):
    src = llama_dir[0]
    (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    hf = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(error, match=match):
        from_pretrained(tmp_path)


def test_clear_errors_on_missing_files_and_tensors(llama_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
    src = llama_dir[0]
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path)
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"], tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(KeyError, match=r"2 tensor.*lm_head.weight.*layers.1.mlp.up_proj.weight"):
        from_pretrained(tmp_path)


def _llama_cpp_permute(w, heads):
    """llama.cpp's q/k row order: per head, the two rotary halves interleaved pairwise."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _write_gguf(hf_model, path):
    """Writes an F32 llama GGUF of `hf_model` the way llama.cpp's converter lays it out."""
    gguf = pytest.importorskip("gguf")
    c = hf_model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    parts = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, tensor in hf_model.state_dict().items():
        array = tensor.numpy()
        stem, leaf = name.rsplit(".", 1)
        if stem.startswith("model.layers."):
            layer, part = stem[len("model.layers.") :].split(".", 1)
            gguf_name = f"blk.{layer}.{parts[part]}.{leaf}"
            if part == "self_attn.q_proj":
                array = _llama_cpp_permute(array, c.num_attention_heads)
            if part == "self_attn.k_proj":
                array = _llama_cpp_permute(array, c.num_key_value_heads)
        else:
            gguf_name = f"{names[stem]}.{leaf}"
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_import_unpermutes_rope(llama_dir, batch, tmp_path):
    _write_gguf(llama_dir[1], tmp_path / "tiny.gguf")
    model = from_pretrained(tmp_path / "tiny.gguf")
    assert not model.config.tie_word_embeddings and model.config.rope_theta == 5e5
    assert_close(jit_call(model, batch), torch_logits(llama_dir[1], batch), batch[1], rel=1e-6)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(tmp_path):
    from jrl.assets import smollm2_gguf_path

    gguf_path = smollm2_gguf_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, local_files_only=True
    ).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )
    folder = gguf_to_hf_folder(gguf_path, tmp_path / "smollm2")
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    messages = [{"role": "user", "content": "What is 12 + 30? Answer briefly."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text).input_ids
    assert ids == ref_tok(text).input_ids and tok.eos_token_id == tok.pad_token_id == 2
    batch = (np.asarray([ids]), np.ones((1, len(ids)), np.int32), np.arange(len(ids))[None])
    ref = torch_logits(reference, batch)
    assert_close(jit_call(from_pretrained(gguf_path), batch), ref, batch[1], rel=1e-3)
    assert_close(jit_call(from_pretrained(folder), batch), ref, batch[1], rel=1e-3)
    exported = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert_close(torch_logits(exported.eval(), batch), ref, batch[1], rel=1e-3)
