"""The critic role: a value model (HF token-classification layout) and its clipped value loss.

It runs on a mesh with ``critic.ulysses_sequence_parallel_size`` devices on the `sequence` axis,
and ``critic.model.fsdp_config.param_offload`` / ``optimizer_offload`` keep its states in host
memory between uses.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl import algos
from jrl.batch import Batch
from jrl.parallel import batch_sharding, on_mesh
from jrl.runspec.models import ModelSettings
from jrl.runspec.roles import CriticSettings
from jrl.trainer.roles.specs import ForwardSpec, TrainSpec, load_learner, role_mesh_of
from jrl.trainer.update.learner import Learner
from jrl.trainer.update.packing import PackLayout, response_window

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")
UPDATE_KEYS = (*FORWARD_KEYS, "values", "returns")


def response_values(
    model: Any, tensors: dict[str, jax.Array], packing: PackLayout | None = None
) -> jax.Array:
    """Values [B, R] of the response tokens (positions ``-R-1 .. -2``), zero where masked; with
    `packing` the model runs on packed rows (see `jrl.trainer.update.packing`)."""
    width = tensors["response_mask"].shape[1]
    return response_window(model, tensors, width, packing) * tensors["response_mask"]


@dataclasses.dataclass(frozen=True)
class CriticLoss:
    """Clipped value loss of one micro-batch, already divided by the mini-batch normaliser
    (``critic.cliprange_value``, aggregated by ``critic.loss_agg_mode``). Frozen and hashable:
    the key of the learner's compiled update."""

    cliprange_value: float
    loss_agg_mode: str

    def __call__(self, model, micro, norm, packing=None):
        mask = micro["response_mask"]
        vpreds = response_values(model, micro, packing)
        terms = algos.value_loss_terms(
            vpreds, micro["returns"], micro["values"], cliprange_value=self.cliprange_value
        )
        numerator = algos.agg_loss_terms(terms.loss_mat, mask, self.loss_agg_mode)[0]
        vf_loss = numerator / norm[self.loss_agg_mode]
        metrics = {"critic/vf_loss": vf_loss}
        for name, mat in terms.metrics.items():
            metrics[name] = jnp.sum(mat * mask) / norm["tokens"]
        metrics["critic/vpred_mean"] = jnp.sum(vpreds * mask) / norm["tokens"]
        return vf_loss, metrics


@dataclasses.dataclass(frozen=True)
class CriticSpec:
    """The critic's settings on its mesh: its value model, how its forward pass and its update
    split a batch, its loss and learning-rate schedule."""

    model: ModelSettings
    forward: ForwardSpec
    train: TrainSpec
    loss: CriticLoss

    @classmethod
    def of(cls, settings: CriticSettings, mesh: Mesh, total: int) -> CriticSpec:
        """The spec of the critic's `settings` on its `mesh` (`total` training steps)."""
        return cls(
            model=settings.model,
            forward=ForwardSpec.of(settings.values, mesh),
            train=TrainSpec.of(settings.update, mesh, total),
            loss=CriticLoss(settings.cliprange_value, settings.loss_agg_mode),
        )


class Critic:
    """Value model on the mesh: computes values and runs verl's critic update."""

    def __init__(self, spec: CriticSpec, mesh: Mesh, learner: Learner):
        self.spec = spec
        self.mesh = mesh
        self.learner = learner
        rows = batch_sharding(mesh, 1)  # rows split, for tensors of any rank
        # The values pass as compiled; run (and lower) it under the mesh (`on_mesh`).
        self.jitted = jax.jit(
            self._forward_fn,
            static_argnums=2,
            in_shardings=(learner.param_shardings, rows),
            out_shardings=rows,
        )
        self._forward = on_mesh(self.jitted, mesh)

    @classmethod
    def create(
        cls,
        settings: CriticSettings,
        mesh: Mesh,
        total_training_steps: int,
        *,
        abstract: bool = False,
    ) -> Critic:
        """The critic of `settings` on `mesh`'s devices, with its optimizer (shapes only with
        `abstract`)."""
        mesh = role_mesh_of(settings.mesh, mesh)
        spec = CriticSpec.of(settings, mesh, total_training_steps)
        key = settings.mesh.key
        learner = load_learner(
            spec.model,
            spec.train.optimizer,
            mesh,
            settings.offload,
            key,
            spec.model.trainable,
            abstract,
        )
        return cls(spec, mesh, learner)

    @property
    def forward(self) -> Any:
        """How the values pass splits a batch (its `ForwardSpec`)."""
        return self.spec.forward

    def _forward_fn(self, params, tensors, packing):
        return response_values(nnx.merge(self.learner.graphdef, params), tensors, packing)

    def compute_values(self, batch: Batch) -> np.ndarray:
        """Values [B, R] for the batch's responses."""
        tensors = {k: np.asarray(batch.tensors[k]) for k in FORWARD_KEYS}
        forward = functools.partial(self._forward, self.learner.params)
        return self.spec.forward.run(forward, tensors, self.mesh)

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """ppo_epochs x mini-batches of the clipped value loss, with gradient accumulation."""
        spec = self.spec
        tensors = {k: np.asarray(batch.tensors[k]) for k in UPDATE_KEYS}
        lr = spec.train.schedule(step - 1)
        history = self.learner.train(
            spec.loss,
            tensors,
            spec.train.plan,
            lr=lr,
            shuffle_seed=spec.train.shuffle_seed(step),
        )
        out = {k: float(np.mean(v)) for k, v in history.items() if k.startswith("critic/")}
        out["critic/grad_norm"] = float(np.mean(history["grad_norm"]))
        out["critic/lr"] = float(lr)
        return out
