"""Device memory of the whole actor update with and without ``use_fused_kernels``.

The update is the trainer's own: `jrl.trainer.update.learner.build_update` around
`jrl.trainer.roles.actor.ActorLoss` (clipped PPO objective, KL loss to the reference, AdamW step,
gradient clipping) for the ``configs/gsm8k_grpo.py`` card, with the role's log-prob
implementation taken from the config exactly as the RunSpec takes it
(`jrl.runspec.roles.log_prob_impl`):

- ``use_fused_kernels=False`` (the baseline): ``naive``, the [tokens, vocab] logits materialised;
- ``use_fused_kernels=True``, ``impl_backend=torch``: ``chunked`` (XLA loop over vocabulary chunks);
- ``use_fused_kernels=True``, ``impl_backend=triton``: ``auto``, the Pallas kernel of a TPU or GPU
  (on a CPU, or with several devices, it resolves to ``chunked`` and is not compiled twice).

The parameters, optimizer state and batch are abstract, so nothing runs: XLA's compiled memory
analysis of one update (a mini-batch of `--micro-batches` micro-batches of the card's
``ppo_micro_batch_size_per_gpu`` sequences of ``max_prompt_length + max_response_length``
tokens) on one device. Works on a CPU too, where it measures what the compiler plans.

    python bench/actor_memory.py                       # Qwen2.5-0.5B shape, the card's sizes
    python bench/actor_memory.py --shape tiny

Prints one JSON line per implementation with `temp_bytes` (activations and scratch),
`argument_bytes`, `output_bytes`, `peak_bytes` (their sum less donated buffers), the same as
`peak_gb`, `host_temp_bytes` (offloaded activations, as `bench/memory.py` reports them),
`peak_ratio` / `temp_ratio` against the baseline and `saved_gb` (baseline peak less this one).
XLA:CPU's plan for the rest of the step is far larger than a GPU's (it computes bf16 in float32
and keeps attention scores), so on a CPU `saved_gb` is the figure that speaks, not the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from bench.memory import SHAPES, memory_bytes, padded_batch  # noqa: E402
from jrl.models import CausalLM, ModelConfig  # noqa: E402
from jrl.models.decoder import set_memory_options  # noqa: E402
from jrl.optim.optimizers import make_optimizer  # noqa: E402
from jrl.parallel import make_mesh, param_shardings  # noqa: E402
from jrl.runspec import load_config  # noqa: E402
from jrl.runspec.roles import ActorSettings  # noqa: E402
from jrl.runspec.spec import resolve_run  # noqa: E402
from jrl.trainer.roles.actor import ActorLoss  # noqa: E402
from jrl.trainer.update.learner import Learner, build_update, normalisers  # noqa: E402
from jrl_kernels import resolve_impl  # noqa: E402

CARD = str(ROOT / "configs" / "gsm8k_grpo.py")
FUSED = "actor_rollout_ref.model.use_fused_kernels"
BACKEND = "actor_rollout_ref.model.fused_kernel_options.impl_backend"
# Config overrides of each variant; the first is the baseline.
VARIANTS = (
    ("use_fused_kernels=False", [f"{FUSED}=False"]),
    ("use_fused_kernels=True impl_backend=torch", [f"{FUSED}=True", f"{BACKEND}=torch"]),
    ("use_fused_kernels=True impl_backend=triton", [f"{FUSED}=True", f"{BACKEND}=triton"]),
)
GIB = 1024**3


def abstract_state(actor: ActorSettings, model_config: ModelConfig) -> Learner:
    """The `actor`'s `Learner` on one device with abstract parameters and optimizer state."""
    spec = actor.model
    model = nnx.eval_shape(
        lambda: CausalLM(
            model_config, dtype=spec.dtype, param_dtype=spec.param_dtype, rngs=nnx.Rngs(0)
        )
    )
    set_memory_options(model, **spec.memory_options())
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(actor.update.optimizer)
    opt_state = jax.eval_shape(tx.init, trainable)
    mesh = make_mesh(1)
    shardings = [param_shardings(tree, mesh) for tree in (trainable, frozen, opt_state)]
    return Learner(graphdef, trainable, frozen, opt_state, tx, mesh, *shardings)


def actor_minibatch(config: Any, vocab: int, micro_batches: int) -> dict[str, np.ndarray]:
    """One mini-batch [micro_batches, rows, ...] of everything the actor loss reads."""
    actor = config.actor_rollout_ref.actor
    rows = int(actor.ppo_micro_batch_size_per_gpu)
    prompt, response = int(config.data.max_prompt_length), int(config.data.max_response_length)
    tensors = padded_batch(rows * micro_batches, prompt, response, vocab)
    mask = tensors["response_mask"].astype(np.float32)
    rng = np.random.default_rng(1)
    tensors["old_log_probs"] = -rng.random(mask.shape, np.float32) * mask
    tensors["advantages"] = rng.standard_normal(mask.shape).astype(np.float32) * mask
    if actor.use_kl_loss:
        tensors["ref_log_prob"] = tensors["old_log_probs"]
    return {k: v.reshape(micro_batches, rows, *v.shape[1:]) for k, v in tensors.items()}


def update_memory(config: Any, model_config: ModelConfig, micro_batches: int) -> dict[str, Any]:
    """Compiled memory statistics of one actor update under `config` (its RunSpec's actor)."""
    run = resolve_run(config)
    state = abstract_state(run.actor, model_config)
    loss = ActorLoss.resolve(run.algorithm, run.actor.temperature, run.actor.log_prob_impl)
    minibatch = actor_minibatch(config, model_config.vocab_size, micro_batches)
    norm = normalisers(minibatch["response_mask"], run.actor.update.loss_scale_factor)
    update = build_update(state, loss, run.actor.update.grad_clip, minibatch)
    args = (state.trainable, state.frozen, state.opt_state, minibatch, norm, jnp.float32(1e-6))
    out = memory_bytes(update.lower(*args).compile())
    out["peak_gb"] = round(out["peak_bytes"] / GIB, 3)
    return out


def run(shape: str, micro_batches: int, overrides: list[str]) -> list[dict[str, Any]]:
    """One record per distinct implementation of `VARIANTS`."""
    spec = SHAPES[shape]
    model_config = ModelConfig.from_hf(spec["config"])
    records: list[dict[str, Any]] = []
    measured: dict[str, dict[str, Any]] = {}
    for name, variant in VARIANTS:
        config, _ = load_config([f"--config={CARD}", *overrides, *variant])
        impl = resolve_run(config).actor.log_prob_impl
        resolved = resolve_impl(impl)
        if resolved not in measured:
            measured[resolved] = update_memory(config, model_config, micro_batches)
        actor = config.actor_rollout_ref.actor
        records.append(
            {
                "bench": "actor_memory",
                "shape": shape,
                "backend": jax.default_backend(),
                "variant": name,
                "logprob_impl": impl,
                "resolved_impl": resolved,
                "micro_batches": micro_batches,
                "micro_rows": int(actor.ppo_micro_batch_size_per_gpu),
                "seq": int(config.data.max_prompt_length + config.data.max_response_length),
                "response_tokens_per_micro_batch": int(
                    actor.ppo_micro_batch_size_per_gpu * config.data.max_response_length
                ),
                "vocab": model_config.vocab_size,
                "remat": bool(config.actor_rollout_ref.model.enable_gradient_checkpointing),
                **measured[resolved],
            }
        )
    base = records[0]
    for record in records:
        record["peak_ratio"] = round(record["peak_bytes"] / base["peak_bytes"], 4)
        record["temp_ratio"] = round(record["temp_bytes"] / base["temp_bytes"], 4)
        record["saved_gb"] = round((base["peak_bytes"] - record["peak_bytes"]) / GIB, 3)
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--micro-batches", type=int, default=2, help="per mini-batch update")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="overrides of the card, e.g. actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    )
    args = parser.parse_args(argv)
    if args.micro_batches < 1:
        parser.error(f"--micro-batches must be at least 1, got {args.micro_batches}")
    for record in run(args.shape, args.micro_batches, args.overrides):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
