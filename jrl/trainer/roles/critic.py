"""The critic role: a value model (HF token-classification layout) and its clipped value loss.

It runs on a mesh with ``critic.ulysses_sequence_parallel_size`` devices on the `sequence` axis,
and ``critic.model.fsdp_config.param_offload`` / ``optimizer_offload`` keep its states in host
memory between uses.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl import algos
from jrl.batch import Batch
from jrl.parallel import batch_sharding, data_parallel_size, on_mesh, sequence_parallel_size
from jrl.trainer.roles.policy import (
    check_heads,
    forward_split,
    load_model,
    offloads,
    sequence_mesh_of,
    shuffle_seed,
    update_split,
)
from jrl.trainer.update.batching import forward_pass
from jrl.trainer.update.learner import TrainState
from jrl.trainer.update.optim import lr_multiplier, make_optimizer
from jrl.trainer.update.packing import PackLayout, response_window

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")


def response_values(
    model: Any, tensors: dict[str, jax.Array], packing: PackLayout | None = None
) -> jax.Array:
    """Values [B, R] of the response tokens (positions ``-R-1 .. -2``), zero where masked; with
    `packing` the model runs on packed rows (see `jrl.trainer.update.packing`)."""
    width = tensors["response_mask"].shape[1]
    return response_window(model, tensors, width, packing) * tensors["response_mask"]


def critic_loss(model, micro, norm, *, cfg, packing=None):
    """Clipped value loss of one micro-batch, already divided by the mini-batch normaliser."""
    mask = micro["response_mask"]
    vpreds = response_values(model, micro, packing)
    terms = algos.value_loss_terms(
        vpreds, micro["returns"], micro["values"], cliprange_value=cfg.cliprange_value
    )
    numerator = algos.agg_loss_terms(terms.loss_mat, mask, cfg.loss_agg_mode)[0]
    vf_loss = numerator / norm[cfg.loss_agg_mode]
    metrics = {"critic/vf_loss": vf_loss}
    for name, mat in terms.metrics.items():
        metrics[name] = jnp.sum(mat * mask) / norm["tokens"]
    metrics["critic/vpred_mean"] = jnp.sum(vpreds * mask) / norm["tokens"]
    return vf_loss, metrics


class Critic:
    """Value model on the mesh: computes values and runs verl's critic update."""

    def __init__(self, config: Any, mesh: Mesh, total_training_steps: int):
        critic = config.critic
        self.config = config
        self.total_training_steps = total_training_steps
        fsdp = critic.model.get("fsdp_config") or config.actor_rollout_ref.actor.fsdp_config
        mesh = sequence_mesh_of(critic, "critic", mesh, fsdp)
        self.mesh = mesh
        model = load_model(critic.model, fsdp, mesh, kind="value")
        check_heads(model, mesh, "critic")
        self.state = TrainState.create(
            model,
            make_optimizer(critic.optim),
            mesh,
            **offloads(fsdp, "critic.model.fsdp_config", mesh),
        )
        self.world = data_parallel_size(mesh)
        self.remove_padding = bool(critic.model.use_remove_padding)
        self.forward_rows, self.forward_budget = forward_split(
            critic,
            "critic",
            self.world,
            self.remove_padding,
            flag_key="use_dynamic_bsz",
            limit_key="forward_max_token_len_per_gpu",
            micro_key="forward_micro_batch_size",
            sequence_parallel=sequence_parallel_size(mesh),
        )
        rows = batch_sharding(mesh, 1)  # rows split, for tensors of any rank
        forward = jax.jit(
            self._forward_fn,
            static_argnums=2,
            in_shardings=(self.state.param_shardings, rows),
            out_shardings=rows,
        )
        self._forward = on_mesh(forward, mesh)

    def _forward_fn(self, params, tensors, packing):
        return response_values(nnx.merge(self.state.graphdef, params), tensors, packing)

    def compute_values(self, batch: Batch) -> np.ndarray:
        """Values [B, R] for the batch's responses."""
        tensors = {k: np.asarray(batch.tensors[k]) for k in FORWARD_KEYS}
        return forward_pass(
            functools.partial(self._forward, self.state.params),
            tensors,
            self.mesh,
            rows=self.forward_rows,
            remove_padding=self.remove_padding,
            budget=self.forward_budget,
        )

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """ppo_epochs x mini-batches of the clipped value loss, with gradient accumulation."""
        critic = self.config.critic
        n = self.config.actor_rollout_ref.rollout.n
        mini_rows = critic.ppo_mini_batch_size * n
        tensors = {k: np.asarray(batch.tensors[k]) for k in (*FORWARD_KEYS, "values", "returns")}
        lr = critic.optim.lr * lr_multiplier(critic.optim, step - 1, self.total_training_steps)
        history = self.state.train(
            functools.partial(critic_loss, cfg=critic),
            tensors,
            variant="critic",
            grad_clip=critic.grad_clip,
            mini_rows=mini_rows,
            epochs=critic.ppo_epochs,
            lr=lr,
            shuffle_seed=shuffle_seed(critic, step),
            **update_split(critic, "critic", self.world, self.mesh, self.remove_padding),
        )
        out = {k: float(np.mean(v)) for k, v in history.items() if k.startswith("critic/")}
        out["critic/grad_norm"] = float(np.mean(history["grad_norm"]))
        out["critic/lr"] = float(lr)
        return out
