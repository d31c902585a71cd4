"""A mixture of experts' weights in the real vLLM (its CPU build): a tiny random Qwen3-MoE (4
experts, 2 per token; head_dim 64 for vLLM's CPU attention) written without weights, so every
weight vLLM computes with comes from jrl's sync (per-expert HF tensors, which vLLM fuses into one
parameter per layer). Greedy rows equal jrl's JAX sampler's and log-probs the trainer's, after
the first sync and after an update of the experts alone. Skipped where vllm is not installed or
vLLM's platform is not the CPU."""

import gc

import jax
import numpy as np
import pytest
from flax import nnx
from real_vllm import (
    LOG_PROB_TOLERANCE,
    R,
    greedy_sampling,
    tiny_vllm_engine,
    trainer_log_probs,
    vllm_prompts,
    why_no_real_vllm,
)

from jrl.models import init_random
from jrl.models.config import Experts, ModelConfig
from jrl.rollout import JaxRollout

pytestmark = pytest.mark.skipif(why_no_real_vllm() is not None, reason=str(why_no_real_vllm()))

MODEL = ModelConfig(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
    num_kv_heads=1, head_dim=64, max_position_embeddings=128, rms_norm_eps=1e-6,
    rope_theta=1e4, tie_word_embeddings=True, model_type="qwen3_moe", attention_bias=False,
    eos_token_id=1, pad_token_id=0, bos_token_id=None,
    experts=Experts(num_experts=4, experts_per_token=2, intermediate_size=64, norm_topk_prob=True),
)  # fmt: skip


@pytest.fixture(scope="module")
def model():
    """`MODEL` with its weights 5 times their initial scale (greedy rows that vary)."""
    model = init_random(MODEL, seed=5)
    nnx.update(model, jax.tree.map(lambda x: 5 * x if x.ndim >= 2 else x, nnx.state(model)))
    return model


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    """jrl's vllm engine of `model` (its folder without weights), on the host's devices."""
    built = tiny_vllm_engine(model, tmp_path_factory.mktemp("tiny_moe_vllm"))
    assert type(built).__name__ == "VllmRollout"
    yield built
    del built
    gc.collect()


def _jax_greedy(model):
    engine = JaxRollout(model, response_length=R, pad_token_id=0, eos_token_ids=())
    sampling = greedy_sampling(calculate_log_probs=True)
    return engine.generate(vllm_prompts(MODEL.vocab_size), sampling, jax.random.key(0)).to_numpy()


def _generate(engine):
    sampling = greedy_sampling(calculate_log_probs=True)
    return engine.generate(vllm_prompts(MODEL.vocab_size), sampling, jax.random.key(0)).to_numpy()


def test_the_experts_reach_vllm_at_start_and_after_an_update(engine, model):
    out = _generate(engine)
    np.testing.assert_array_equal(out["responses"], _jax_greedy(model)["responses"])
    got, expected = out["rollout_log_probs"], trainer_log_probs(model, out)
    np.testing.assert_allclose(got, expected, rtol=0, atol=LOG_PROB_TOLERANCE)

    # Only the experts change: vLLM follows them, and the old weights bring its rows back.
    state = nnx.state(model)
    moved = nnx.map_state(lambda path, x: 1.5 * x if "experts" in map(str, path) else x, state)
    engine.update_weights(moved)
    changed = _generate(engine)
    assert not np.array_equal(changed["responses"], out["responses"])
    expected = _jax_greedy(nnx.merge(nnx.graphdef(model), moved))
    np.testing.assert_array_equal(changed["responses"], expected["responses"])
    engine.update_weights(state)
    np.testing.assert_array_equal(_generate(engine)["responses"], out["responses"])
