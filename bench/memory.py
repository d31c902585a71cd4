"""Device memory of one training forward + backward under jrl's memory options.

One batch with heavy padding (prompts left-padded and responses right-padded to about half of
their room, so about half the tokens are padding) goes through the policy's
`jrl.trainer.roles.log_probs.response_log_probs` with `--logprob-impl` (default `auto`; `naive`
materialises the [tokens, vocab] logits, `chunked` does not); the loss is minus the mean log-prob
of the response tokens and the gradient is taken over every parameter (`bench/actor_memory.py`
measures the whole actor update instead). Variants:

- remat `none` / `full` / `dots` on the padded rows (`enable_gradient_checkpointing`; `dots` keeps
  the matmul outputs), the first being the baseline; `full` with activation offload;
- packed rows (`use_remove_padding`) with remat `none` and `full`.

Two measures, neither of which runs anything (the parameters are abstract, so large shapes only
need to compile):

- XLA's compiled memory analysis (`jax.jit(f).lower(...).compile().memory_analysis()`):
  `temp_bytes` (activations and scratch), `argument_bytes`, `output_bytes`, `peak_bytes` (their
  sum less aliased buffers), `host_temp_bytes` (offloaded activations), `temp_ratio` (against
  the baseline). XLA:CPU schedules the recomputed layers early, next to their first forward
  pass, so on a CPU remat barely changes `temp_bytes`.
- `residual_bytes`: what the forward pass keeps for the backward pass (parameters included), the
  quantity remat and packing control whatever the scheduler does.

    python bench/memory.py --shape tiny
    python bench/memory.py --shape qwen2.5-0.5b     # batch 16 x (512 + 512) tokens, bf16
    python bench/memory.py --shape qwen2.5-0.5b --batch 4 --logprob-impl naive

The tiny shape uses eager attention; qwen2.5-0.5b asks for flash_attention_2 (cuDNN on a GPU,
Pallas splash on a TPU, XLA's dot_product_attention elsewhere).

Prints one JSON line per variant; `packed_rows` is the row count of the packed buffer (null for
padded rows). On a CPU the offload variant warns and measures plain remat.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jrl.models import CausalLM, ModelConfig  # noqa: E402
from jrl.models.decoder import set_memory_options  # noqa: E402
from jrl.trainer.roles.log_probs import response_log_probs  # noqa: E402
from jrl.trainer.update.packing import PackLayout, with_packing  # noqa: E402
from jrl_kernels import IMPLEMENTATIONS  # noqa: E402

# Hugging Face config.json content of each shape, with its batch, prompt and response lengths and
# compute dtype.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "batch": 8,
        "prompt": 96,
        "response": 32,
        "dtype": "fp32",
        "config": {
            "model_type": "qwen2",
            "vocab_size": 1024,
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
            "max_position_embeddings": 2048,
        },
    },
    "qwen2.5-0.5b": {
        "batch": 16,
        "prompt": 512,
        "response": 512,
        "dtype": "bf16",
        "config": {
            "model_type": "qwen2",
            "vocab_size": 151936,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
            "max_position_embeddings": 32768,
            "attn_implementation": "flash_attention_2",
        },
    },
}
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
# (remat policy, activation offload, packed rows) of each variant; the first is the baseline.
VARIANTS = (
    ("none", False, False),
    ("full", False, False),
    ("dots", False, False),
    ("full", True, False),
    ("none", False, True),
    ("full", False, True),
)


def padded_batch(batch: int, prompt: int, response: int, vocab: int) -> dict[str, np.ndarray]:
    """Random tokens: prompts left-padded and responses right-padded, each filling a quarter to
    three quarters of its room (fixed seed)."""
    rng = np.random.default_rng(0)
    prompt_len = rng.integers(prompt // 4, 3 * prompt // 4 + 1, batch)
    response_len = rng.integers(max(response // 4, 1), 3 * response // 4 + 1, batch)
    slots = np.arange(prompt + response)
    mask = (slots >= prompt - prompt_len[:, None]) & (slots < prompt + response_len[:, None])
    mask = mask.astype(np.int32)
    ids = rng.integers(0, vocab, mask.shape, dtype=np.int32) * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32),
        "responses": ids[:, prompt:],
        "response_mask": mask[:, prompt:],
    }


def training_loss(
    config: ModelConfig,
    dtype: Any,
    remat: str,
    offload: bool,
    packing: PackLayout | None,
    logprob_impl: str = "auto",
) -> tuple[Callable[[Any, dict[str, Any]], jax.Array], Any]:
    """(loss(params, tensors), abstract fp32 parameters) of a causal LM computing in `dtype`: minus
    the mean log-prob of the response tokens (`response_log_probs` with `logprob_impl`), on
    packed rows when `packing` is given."""
    model = nnx.eval_shape(
        lambda: CausalLM(config, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    )
    set_memory_options(model, remat_policy=remat, activation_offload=offload)
    graphdef, params = nnx.split(model)

    def loss(params: Any, tensors: dict[str, Any]) -> jax.Array:
        model = nnx.merge(graphdef, params)
        log_prob, _ = response_log_probs(
            model, tensors, 1.0, packing, impl=logprob_impl, calculate_entropy=False
        )
        mask = tensors["response_mask"]
        return -jnp.sum(log_prob * mask) / jnp.maximum(jnp.sum(mask), 1)

    return loss, params


def compiled_memory(loss: Callable[..., jax.Array], params: Any, tensors: Any) -> dict[str, int]:
    """XLA's memory statistics of the compiled value_and_grad of `loss`."""
    return memory_bytes(jax.jit(jax.value_and_grad(loss)).lower(params, tensors).compile())


def memory_bytes(compiled: Any) -> dict[str, int]:
    """A compiled program's memory analysis: temp, argument and output bytes, their peak (less
    aliased, i.e. donated, buffers) and host temp bytes (offloaded activations)."""
    stats = compiled.memory_analysis()
    out = {
        "temp_bytes": stats.temp_size_in_bytes,
        "argument_bytes": stats.argument_size_in_bytes,
        "output_bytes": stats.output_size_in_bytes,
    }
    out["peak_bytes"] = sum(out.values()) - stats.alias_size_in_bytes
    out["host_temp_bytes"] = stats.host_temp_size_in_bytes
    return out


def residual_bytes(loss: Callable[..., jax.Array], params: Any, tensors: Any) -> int:
    """Bytes the forward pass keeps for the backward pass (parameters included), wherever the
    compiler schedules the recomputation."""
    residuals = jax.eval_shape(lambda p, t: jax.vjp(loss, p, t)[1], params, tensors)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(residuals))


def run(shape: str, batch: int | None = None, logprob_impl: str = "auto") -> list[dict[str, Any]]:
    """One record per variant of `VARIANTS` for the named shape."""
    spec = SHAPES[shape]
    batch = batch or spec["batch"]
    config = ModelConfig.from_hf(spec["config"])
    padded = padded_batch(batch, spec["prompt"], spec["response"], config.vocab_size)
    packed, layout = with_packing(padded, batch, None)
    records = []
    for remat, offload, use_packing in VARIANTS:
        tensors, packing = (packed, layout) if use_packing else (padded, None)
        loss, params = training_loss(
            config, DTYPES[spec["dtype"]], remat, offload, packing, logprob_impl
        )
        stats = compiled_memory(loss, params, tensors)
        stats["residual_bytes"] = residual_bytes(loss, params, tensors)
        records.append(
            {
                "bench": "memory",
                "shape": shape,
                "backend": jax.default_backend(),
                "batch": batch,
                "seq": spec["prompt"] + spec["response"],
                "dtype": spec["dtype"],
                "padding_fraction": round(1.0 - float(padded["attention_mask"].mean()), 4),
                "remat": remat,
                "offload": offload,
                "packed_rows": packing.rows if packing else None,
                "logprob_impl": logprob_impl,
                **stats,
            }
        )
    baseline = records[0]["temp_bytes"]
    for record in records:
        record["temp_ratio"] = round(record["temp_bytes"] / baseline, 4)
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--batch", type=int, help="sequences (default: the shape's)")
    parser.add_argument(
        "--logprob-impl",
        choices=IMPLEMENTATIONS,
        default="auto",
        help="jrl_kernels.logprob_entropy implementation (naive materialises the logits)",
    )
    args = parser.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")
    for record in run(args.shape, args.batch, args.logprob_impl):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
