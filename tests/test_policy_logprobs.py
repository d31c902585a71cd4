"""The trainer's response log-probs: positions [-R-1:-1], temperature, Gemma's final soft-cap;
and verl's `override_config` applied when loading."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jrl.models import ModelConfig, from_pretrained, init_random, save_pretrained
from jrl.trainer.policy import response_log_probs

BASE = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize(
    "hf",
    [
        {**BASE, "model_type": "llama", "tie_word_embeddings": False},
        {
            **BASE,
            "model_type": "gemma2",
            "final_logit_softcapping": 2.0,
            "sliding_window": 4,
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 50.0,
        },
    ],
    ids=["llama", "gemma2-softcap"],
)
def test_response_log_probs_match_full_logits(hf):
    model = init_random(ModelConfig.from_hf(hf), seed=1)
    rng = np.random.default_rng(0)
    prompt, width, temperature = 6, 5, 0.7
    ids = rng.integers(1, hf["vocab_size"], size=(3, prompt + width)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :2] = 0  # left padding
    positions = np.clip(np.cumsum(mask, -1) - 1, 0, None).astype(np.int32)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "responses": ids[:, prompt:],
    }
    log_probs, entropy = response_log_probs(model, tensors, temperature)
    logits = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(positions))
    expected_all = jax.nn.log_softmax(logits[:, prompt - 1 : -1] / temperature, axis=-1)
    expected = np.take_along_axis(np.asarray(expected_all), ids[:, prompt:, None], -1)[..., 0]
    np.testing.assert_allclose(log_probs, expected, rtol=1e-5, atol=1e-5)
    probs = np.exp(np.asarray(expected_all))
    np.testing.assert_allclose(entropy, -(probs * np.asarray(expected_all)).sum(-1), atol=1e-4)


def test_override_config_applies_model_config_and_attention(tmp_path):
    config = ModelConfig.from_hf({**BASE, "model_type": "qwen2", "tie_word_embeddings": True})
    save_pretrained(init_random(config, seed=0), tmp_path / "m")
    model = from_pretrained(
        tmp_path / "m",
        override_config={"attn_implementation": "sdpa", "model_config": {"rms_norm_eps": 1e-3}},
    )
    assert model.config.attn_implementation == "sdpa"
    assert model.config.rms_norm_eps == 1e-3
    with pytest.raises(ValueError, match="dropout is not supported"):
        from_pretrained(
            tmp_path / "m", override_config={"model_config": {"attention_dropout": 0.1}}
        )
