"""The `Rollout` protocol: the JAX engine satisfies it, `build_rollout` builds one from the config
(the same tokens as an engine built by hand) and an object missing a member is not one. The vLLM
engine's conformance is tested against the real vLLM (`test_vllm_cpu.py`)."""

import dataclasses
import types

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import randomise_adapters, tiny_llama

from jrl.batch import Batch
from jrl.config import default_config, resolve
from jrl.models import LoraSettings, apply_lora, init_random
from jrl.models.lora import remove_adapters
from jrl.parallel import make_mesh
from jrl.rollout import (
    EngineLimits,
    JaxRollout,
    Rollout,
    build_rollout,
    sampling_params,
)
from jrl.runspec.rollout import rollout_spec

P, R, PAD = 6, 4, 0
TOKENIZER = types.SimpleNamespace(eos_token_id=2, pad_token_id=PAD)  # what build_rollout reads
ADAPTERS = LoraSettings(rank=4, alpha=8.0)  # the actor's LoRA adapters


def _config():
    """The default config for a tiny jax rollout, two-way tensor parallel."""
    config = resolve(default_config())
    config.data.max_response_length = R
    rollout = config.actor_rollout_ref.rollout
    rollout.update({"name": "jax", "dtype": "float32", "tensor_model_parallel_size": 2})
    rollout.response_length = R  # resolved: it no longer follows data.max_response_length
    rollout.update(
        {"max_num_seqs": 4, "max_num_batched_tokens": 2 * P, "calculate_log_probs": True}
    )
    return config


def _actor():
    """A tiny actor with LoRA adapters that change its outputs."""
    config = tiny_llama(pad_token_id=PAD, initializer_range=0.5)
    model = apply_lora(init_random(config, seed=0), ADAPTERS)
    randomise_adapters(model)
    return model


def _prompts() -> Batch:
    mask = np.asarray([[0, 0, 1, 1, 1, 1], [1] * P, [0, 0, 0, 0, 0, 1]], np.int32)
    ids = np.where(mask, np.random.default_rng(0).integers(3, 64, mask.shape), PAD)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": positions})


def test_the_jax_engine_built_from_the_config_is_a_rollout():
    config, model, mesh = _config(), _actor(), make_mesh(8)
    graphdef, params = nnx.split(model)
    spec = rollout_spec(config)
    engine = build_rollout(spec, graphdef, params, mesh, TOKENIZER, lora=ADAPTERS)
    assert isinstance(engine, Rollout) and isinstance(engine, JaxRollout)
    assert (engine.response_length, engine.pad_token_id, engine.eos_token_ids) == (R, PAD, (1, 2))
    assert engine.mesh.shape["tensor"] == 2 and engine.stats == {}

    sampling = sampling_params(spec.sampling, engine)
    tokens = {"max_new_tokens": R, "eos_token_ids": (1, 2), "pad_token_id": PAD}
    assert spec.sampling.max_new_tokens == R and spec.sampling.calculate_log_probs
    assert sampling == dataclasses.replace(spec.sampling, **tokens)
    assert not sampling.greedy and sampling_params(spec.validation, engine).greedy

    def run(rollout):
        return rollout.generate(_prompts(), sampling, jax.random.key(0)).to_numpy()

    by_hand = JaxRollout(
        model,
        response_length=R,
        pad_token_id=PAD,
        eos_token_ids=(1, 2),
        mesh=mesh,
        tensor_parallel_size=2,
        limits=EngineLimits(max_num_seqs=4, max_num_batched_tokens=2 * P),  # the config's
    )
    got, expected = run(engine), run(by_hand)
    np.testing.assert_array_equal(got["responses"], expected["responses"])
    np.testing.assert_allclose(got["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5)
    assert set(engine.stats) == {
        "rollout/prompt_bucket",
        "rollout/slots",
        "rollout/prefill_rows",
        "rollout/shared_prefill",
        "rollout/prefill_tokens",
        "rollout/decode_steps",
    }
    assert all(isinstance(v, float) for v in engine.stats.values())
    assert engine.stats["rollout/prompt_bucket"] == P  # the longest prompt fills the width

    # The adapters are part of the rollout's model: without them the log-probs differ.
    base = JaxRollout(
        remove_adapters(model), response_length=R, pad_token_id=PAD, eos_token_ids=(1, 2)
    )
    assert not np.allclose(run(base)["rollout_log_probs"], got["rollout_log_probs"], atol=1e-3)


class _Complete:
    """Every member of the protocol, doing nothing."""

    response_length, pad_token_id, eos_token_ids, stats = 4, 0, (1,), {}

    def generate(self, prompts, sampling, key):
        return prompts

    def update_weights(self, params):
        pass

    def release(self):
        pass

    def resume(self):
        pass


@pytest.mark.parametrize("missing", [k for k in vars(_Complete) if not k.startswith("_")])
def test_an_object_missing_a_member_is_not_a_rollout(missing):
    assert isinstance(_Complete(), Rollout)
    members = {k: v for k, v in vars(_Complete).items() if k != missing}
    assert not isinstance(type("Broken", (), members)(), Rollout)
