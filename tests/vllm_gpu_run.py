"""The vllm engine on a GPU shared with JAX, run by `test_vllm_rollout.py` in a process of its own
(JAX_PLATFORMS=cuda, XLA_PYTHON_CLIENT_PREALLOCATE=false; the test session itself is CPU-only):
the export hands vLLM CUDA tensors through DLPack, the stream hand-off and the memory checks run,
vLLM's log-probs of its tokens are the JAX model's, sleep frees memory, and a weight change
reaches vLLM. ``python tests/vllm_gpu_run.py FOLDER`` prints "ok" at the end."""

import sys
from pathlib import Path

import jax
import numpy as np
from fake_vllm import prompt_batch
from flax import nnx
from helpers import jit_call, left_padded_inputs, tiny_rollout_spec
from reference import SHAPE, hf_family_model

from jrl.models import from_pretrained
from jrl.models.hf_export import hf_torch_tensors
from jrl.rollout import SamplingParams
from jrl.rollout.vllm_rollout import VllmRollout


def main(folder: Path) -> None:
    assert jax.devices()[0].platform == "gpu", jax.devices()
    hf_family_model("qwen2").save_pretrained(folder, safe_serialization=True)
    model = from_pretrained(folder)
    on_gpu = [t.device.type for _, t in hf_torch_tensors(model, device=jax.devices()[0])]
    assert set(on_gpu) == {"cuda"}, set(on_gpu)
    spec = tiny_rollout_spec(
        str(folder), dtype="float32", gpu_memory_utilization=0.2, max_num_seqs=8,
        max_num_batched_tokens=256, prompt_length=12, response_length=8, calculate_log_probs=True,
    )  # fmt: skip
    engine = VllmRollout.from_spec(model, spec, pad_token_id=0, eos_token_ids=None)
    assert engine._freed_bytes > 0, "sleep freed no GPU memory"
    ids, mask, _ = left_padded_inputs((0, 2, 9), 12, SHAPE["vocab_size"], seed=2, low=2)
    prompts = prompt_batch(ids, mask)
    greedy = SamplingParams(max_new_tokens=8, do_sample=False, calculate_log_probs=True)
    first = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    full = (first["input_ids"], first["attention_mask"], first["position_ids"])
    logits = np.asarray(jit_call(model, full))[:, 11:-1]
    expected = np.take_along_axis(jax.nn.log_softmax(logits), first["responses"][..., None], -1)
    np.testing.assert_allclose(first["rollout_log_probs"], expected[..., 0], atol=2e-3)
    engine.update_weights(jax.tree.map(lambda x: 1.5 * x if x.ndim == 2 else x, nnx.state(model)))
    second = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    assert not np.array_equal(second["rollout_log_probs"], first["rollout_log_probs"])
    print("ok")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
