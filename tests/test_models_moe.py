"""Mixture-of-experts families (Qwen3-MoE, Mixtral) against transformers (torch, CPU, fp32), and
the experts' two implementations (grouped matmul, every expert) against each other."""

import dataclasses
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import assert_close, checkpoint_cache, jit_call, left_padded_inputs
from reference import SHAPE, assert_export_roundtrip, randomise, torch_logits

from jrl.models import CausalLM, from_pretrained
from jrl.models.moe import dense_experts, load_balancing_loss, ragged_experts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Tiny configs over SHAPE's attention: several expert counts, 1, 2 and 8 experts per token, with
# and without renormalised top-k weights, Qwen3-MoE's dense layers between sparse ones.
MOE_CONFIGS = {
    "qwen3_moe-8x2-norm-dense1": (
        "Qwen3MoeConfig",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
             mlp_only_layers=[1], head_dim=32),
    ),
    "qwen3_moe-16x8": (
        "Qwen3MoeConfig",
        dict(num_experts=16, num_experts_per_tok=8, moe_intermediate_size=16, head_dim=16),
    ),
    "qwen3_moe-4x1-step2": (
        "Qwen3MoeConfig",
        dict(num_experts=4, num_experts_per_tok=1, moe_intermediate_size=48, decoder_sparse_step=2),
    ),
    "mixtral-4x2": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-8x1": (
        "MixtralConfig",
        dict(num_local_experts=8, num_experts_per_tok=1, intermediate_size=24),
    ),
}  # fmt: skip


def hf_moe_model(name):
    """A randomised 3-layer transformers model of `MOE_CONFIGS[name]`, eager attention."""
    cls_name, extra = MOE_CONFIGS[name]
    cfg = getattr(transformers, cls_name)(**{**SHAPE, "num_hidden_layers": 3, **extra})
    cfg._attn_implementation = "eager"
    return randomise(transformers.AutoModelForCausalLM.from_config(cfg))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """name -> (HF folder, torch model), each built once."""
    return checkpoint_cache(tmp_path_factory, hf_moe_model)


@pytest.fixture(scope="module")
def batch():
    """Three rows of 12 tokens with 0, 2 and 9 tokens of left padding."""
    return left_padded_inputs((0, 2, 9), 12, SHAPE["vocab_size"], seed=1)


def _with(model, **changes):
    """`model`'s weights under a config with `changes` (e.g. another moe_implementation)."""
    config = dataclasses.replace(model.config, **changes)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, nnx.state(model))


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_logits_match_transformers_with_both_expert_paths(name, checkpoint, batch):
    path, hf_model = checkpoint(name)
    model = from_pretrained(path)
    reference = torch_logits(hf_model, batch)
    assert model.config.experts is not None
    assert_close(jit_call(model, batch), reference, batch[1])
    dense = _with(model, moe_implementation="dense")
    assert_close(jit_call(dense, batch), reference, batch[1])


def test_configs_are_read_as_transformers_reads_them(checkpoint):
    qwen = from_pretrained(checkpoint("qwen3_moe-8x2-norm-dense1")[0])
    experts = qwen.config.experts
    assert (experts.num_experts, experts.experts_per_token, experts.intermediate_size) == (8, 2, 32)
    assert experts.norm_topk_prob and experts.dense_layers == (1,)
    assert hasattr(qwen.model.layers[1], "mlp") and qwen.model.layers[1].ffn_name == "mlp"
    assert qwen.model.layers[0].mlp.experts.gate_proj.shape == (8, SHAPE["hidden_size"], 32)
    stepped = from_pretrained(checkpoint("qwen3_moe-4x1-step2")[0]).config
    assert stepped.experts.dense_layers == (0, 2)  # (i + 1) % decoder_sparse_step != 0
    mixtral = from_pretrained(checkpoint("mixtral-4x2")[0])
    assert mixtral.model.layers[0].ffn_name == "block_sparse_moe"
    assert mixtral.model.layers[0].block_sparse_moe.experts.w2.shape == (4, 128, 64)


@pytest.mark.parametrize("name", ["qwen3_moe-8x2-norm-dense1", "mixtral-4x2"])
def test_save_pretrained_roundtrip_in_transformers(name, checkpoint, batch, tmp_path):
    assert_export_roundtrip(*checkpoint(name), batch, tmp_path)


@pytest.mark.parametrize("experts_per_token", [1, 2, 8])
def test_grouped_matmul_equals_every_expert_with_gradients(experts_per_token):
    """The ragged path (tokens sorted by expert, `jax.lax.ragged_dot`) against the reference
    (every expert on every token), values and gradients, where some experts get no token."""
    rng = np.random.default_rng(experts_per_token)
    count, hidden, width, tokens = 8, 16, 12, 10
    x = jnp.asarray(rng.normal(size=(tokens, hidden)), jnp.float32)
    weights = [
        jnp.asarray(rng.normal(size=shape) * 0.3, jnp.float32)
        for shape in ((count, hidden, width), (count, hidden, width), (count, width, hidden))
    ]
    logits = jnp.asarray(rng.normal(size=(tokens, count)), jnp.float32)
    logits = logits.at[:, -2:].add(-100.0)  # the last two experts: never chosen with k < 7
    gate, chosen = jax.lax.top_k(jax.nn.softmax(logits), experts_per_token)

    def loss(path, x, weights, gate):
        return (path(x, gate, chosen, tuple(weights), jax.nn.silu) ** 2).sum()

    ragged = jax.value_and_grad(lambda *a: loss(ragged_experts, *a), argnums=(0, 1, 2))
    dense = jax.value_and_grad(lambda *a: loss(dense_experts, *a), argnums=(0, 1, 2))
    (ours, our_grads), (ref, ref_grads) = ragged(x, weights, gate), dense(x, weights, gate)
    np.testing.assert_allclose(ours, ref, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(our_grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen3_moe-8x2-norm-dense1", "mixtral-4x2"])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_load_balancing_loss_matches_transformers(name, remat, checkpoint, batch):
    """The router load a training forward records gives transformers' aux_loss over the real
    tokens (padding excluded), also through rematerialised layers."""
    path, hf_model = checkpoint(name)
    model = _with(from_pretrained(path), remat_policy=remat)
    ids, mask, positions = batch
    model.hidden(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions))
    ours = load_balancing_loss(model)
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(np.asarray(ids, np.int64)),
            attention_mask=torch.tensor(np.asarray(mask, np.int64)),
            position_ids=torch.tensor(np.asarray(positions, np.int64)),
            output_router_logits=True,
        )
    np.testing.assert_allclose(float(ours), float(out.aux_loss), rtol=1e-5)
    assert load_balancing_loss(model) is None  # popped: the next forward records afresh


def _model_cards() -> dict:
    """bench/model_shapes.py's published config.json fields, by model."""
    path = Path(__file__).resolve().parents[1] / "bench" / "model_shapes.py"
    spec = importlib.util.spec_from_file_location("model_shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SHAPES


MODEL_CARDS = _model_cards()
# The published config.json of two model cards (bench/model_shapes.py), shrunk to test size:
# everything else (expert count, experts per token, their normalisation, RoPE base, norm epsilon,
# tied embeddings) is the card's.
SHRUNK = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
)  # fmt: skip
CARD_SIZES = {"intermediate_size": 48, "moe_intermediate_size": 16}


@pytest.mark.parametrize("card", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_model_cards_configs_shrunk_match_transformers(card, batch, tmp_path):
    dropped = ("architectures", "torch_dtype")  # tested in float32
    published = {k: v for k, v in MODEL_CARDS[card].items() if k not in dropped}
    fields = {**published, **SHRUNK, **{k: v for k, v in CARD_SIZES.items() if k in published}}
    config = transformers.AutoConfig.for_model(**fields)
    config._attn_implementation = "eager"
    hf_model = randomise(transformers.AutoModelForCausalLM.from_config(config))
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path)
    experts = model.config.experts
    assert experts.num_experts == published.get("num_experts", published.get("num_local_experts"))
    assert experts.experts_per_token == published["num_experts_per_tok"]
    ids, mask, positions = batch
    ids = np.minimum(ids, SHRUNK["vocab_size"] - 1)
    small = (ids, mask, positions)
    assert_close(jit_call(model, small), torch_logits(hf_model, small), mask)
