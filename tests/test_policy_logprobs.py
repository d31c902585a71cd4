"""The trainer's response log-probs: positions [-R-1:-1], temperature, Gemma's final soft-cap;
and verl's `override_config` applied when loading."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import GEMMA2_ONLY, TINY_GEMMA2_HF

from jrl.models import ModelConfig, from_pretrained, init_random, save_pretrained
from jrl.trainer.roles.log_probs import response_log_probs

# The shared dimensions of the tiny models below (Gemma 2's own keys left out).
BASE = {k: v for k, v in TINY_GEMMA2_HF.items() if k not in GEMMA2_ONLY}


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
    # verl's FSDP form: config values at the top level, a section merged into its value
    top = from_pretrained(
        tmp_path / "m",
        override_config={
            "rope_theta": 5000.0,
            "attention_dropout": 0.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "model_config": {"rms_norm_eps": 1e-4},
        },
    )
    assert (top.config.rope_theta, top.config.rms_norm_eps) == (5000.0, 1e-4)
    assert (top.config.rope_scaling.rope_type, top.config.rope_scaling.factor) == ("linear", 2.0)
    for dropout in ({"model_config": {"attention_dropout": 0.1}}, {"attention_dropout": 0.1}):
        with pytest.raises(ValueError, match="dropout is not supported"):
            from_pretrained(tmp_path / "m", override_config=dropout)


# --- use_fused_kernels: which implementation each role runs ----------------------------------

PPO_CARD = "configs/gsm8k_ppo.py:tiny"


@pytest.mark.parametrize(
    ("overrides", "actor", "ref"),
    [
        ([], "naive", "naive"),
        (["actor_rollout_ref.model.use_fused_kernels=True"], "chunked", "chunked"),
        (
            [
                "actor_rollout_ref.model.use_fused_kernels=True",
                "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
            ],
            "auto",
            "auto",
        ),
        (
            [
                "actor_rollout_ref.model.use_fused_kernels=True",
                "actor_rollout_ref.actor.use_fused_kernels=False",
            ],
            "naive",
            "chunked",
        ),
    ],
    ids=["default", "torch", "triton", "actor-off"],
)
def test_logprob_impl_follows_use_fused_kernels(overrides, actor, ref):
    from jrl.runspec import load_config
    from jrl.runspec.roles import log_prob_impl

    config, _ = load_config([f"--config={PPO_CARD}", *overrides])
    arr = config.actor_rollout_ref
    assert (log_prob_impl(arr, "actor"), log_prob_impl(arr, "ref")) == (actor, ref)


def test_unknown_impl_backend_is_a_config_error():
    from jrl.config import ConfigError
    from jrl.runspec import load_config

    overrides = [
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=cuda",
    ]
    with pytest.raises(ConfigError, match=r"impl_backend='cuda' is not supported.*triton, torch"):
        load_config([f"--config={PPO_CARD}", *overrides])


@pytest.fixture
def logprob_calls(monkeypatch):
    """Every (impl, entropy wanted) the policy roles pass to the real kernel entry point."""
    from jrl.trainer.roles import log_probs

    calls = []
    real = log_probs.response_scores

    def recording(*args, impl="naive", calculate_entropy=True, **kwargs):
        calls.append((impl, calculate_entropy))
        return real(*args, impl=impl, calculate_entropy=calculate_entropy, **kwargs)

    monkeypatch.setattr(log_probs, "response_scores", recording)
    return calls


def test_fused_kernels_drive_actor_and_reference(tmp_path, logprob_calls):
    """One PPO step (actor with KL loss, so a reference, and an entropy bonus) without and with
    ``use_fused_kernels``: each role traces the implementation the config names, entropy only
    where it is used, and the step's metrics agree."""
    from tests.helpers import one_tiny_ppo_step

    common = [
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
    ]
    plain = one_tiny_ppo_step(tmp_path / "plain", *common)
    traced_plain = set(logprob_calls)
    logprob_calls.clear()
    fused = one_tiny_ppo_step(
        tmp_path / "fused", *common, "actor_rollout_ref.model.use_fused_kernels=True"
    )
    # actor: log-prob with entropy (actor/entropy), update with entropy (entropy_coeff);
    # reference: log-prob only
    assert traced_plain == {("naive", True), ("naive", False)}
    assert set(logprob_calls) == {("chunked", True), ("chunked", False)}
    for key in ("actor/entropy", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert fused[key] == pytest.approx(plain[key], rel=1e-3, abs=1e-6), key
