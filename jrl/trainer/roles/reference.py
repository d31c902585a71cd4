"""The reference policy: the frozen initial actor, for the KL loss and the in-reward KL.

Without LoRA the weights are loaded again, onto a mesh with ``ref.ulysses_sequence_parallel_size``
on the `sequence` axis, and ``ref.fsdp_config.param_offload`` keeps them in host memory between
log-prob passes. With LoRA (``model.lora_rank`` > 0) it is the actor's base model with the adapters
off: its parameters are the very arrays the actor keeps frozen (no second copy; the actor's
``param_offload`` governs them, and the actor's mesh is used).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl.batch import Batch
from jrl.models.lora import remove_adapters
from jrl.parallel import ON_DEVICE, Offload, param_shardings, place, shard_params
from jrl.runspec.models import ModelSettings
from jrl.runspec.roles import ReferenceSettings
from jrl.trainer.roles.actor import Actor
from jrl.trainer.roles.log_probs import LogProbForward
from jrl.trainer.roles.specs import (
    ForwardSpec,
    check_heads,
    load_model,
    param_offload,
    role_mesh_of,
)


@dataclasses.dataclass(frozen=True)
class ReferenceSpec:
    """The reference's settings on its mesh: its model (None with LoRA: the actor's base), how
    its log-prob pass splits a batch, at which temperature and by which kernel."""

    model: ModelSettings | None
    forward: ForwardSpec
    temperature: float
    impl: str

    @classmethod
    def of(cls, settings: ReferenceSettings, mesh: Mesh) -> ReferenceSpec:
        """The spec of the reference's `settings` on its `mesh`."""
        forward = ForwardSpec.of(settings.log_probs, mesh)
        return cls(settings.model, forward, settings.temperature, settings.log_prob_impl)


class Reference:
    """Frozen policy parameters on a mesh that compute response log-probs."""

    def __init__(
        self,
        spec: ReferenceSpec,
        mesh: Mesh,
        graphdef: Any,
        params: Any,
        shardings: Any,
        offload: Offload = ON_DEVICE,
    ):
        self.spec = spec
        self.mesh = mesh
        self._stored = offload.store(params, shardings)
        self._shardings = shardings
        self.log_probs = LogProbForward(graphdef, shardings, mesh, spec.forward, spec)

    @classmethod
    def create(
        cls, settings: ReferenceSettings, mesh: Mesh, actor: Actor, *, abstract: bool = False
    ) -> Reference:
        """The reference of `settings`: loaded on `mesh`'s devices, or with LoRA `actor`'s base
        (shapes only with `abstract`)."""
        if settings.model is None:
            return cls.from_actor(settings, actor)
        mesh = role_mesh_of(settings.mesh, mesh)
        spec = ReferenceSpec.of(settings, mesh)
        model = load_model(settings.model, mesh, abstract=abstract)
        check_heads(model, mesh, settings.mesh.key)
        graphdef, params = nnx.split(model)
        params, shardings = shard_params(params, mesh)
        offload = param_offload(settings.offload, mesh)
        return cls(spec, mesh, graphdef, params, shardings, offload)

    @classmethod
    def from_actor(cls, settings: ReferenceSettings, actor: Actor) -> Reference:
        """With LoRA: `actor`'s frozen base model without its adapters, on the actor's mesh
        (`jrl.runspec.validate` made sure the reference asks for the same sequence parallelism)."""
        mesh = actor.mesh
        spec = ReferenceSpec.of(settings, mesh)
        base = remove_adapters(nnx.merge(actor.learner.graphdef, actor.params))
        graphdef, params = nnx.split(base)
        return cls(spec, mesh, graphdef, params, param_shardings(params, mesh))

    @property
    def stored(self) -> Any:
        """The frozen parameters where they live between passes (host memory when offloaded)."""
        return self._stored

    @property
    def params(self) -> Any:
        """The frozen parameters in device memory (moved from host memory for the call when
        offloaded)."""
        return place(self._stored, self._shardings)

    def compute_log_prob(self, batch: Batch) -> tuple[np.ndarray, None]:
        """Log-probs [B, R] of the batch's responses (no entropy)."""
        return self.log_probs(self.params, batch, calculate_entropy=False)
