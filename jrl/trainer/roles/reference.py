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
from jrl.trainer.roles.actor import Actor
from jrl.trainer.roles.log_probs import LogProbForward, logprob_impl
from jrl.trainer.roles.specs import (
    LOG_PROB_KEYS,
    ForwardSpec,
    ModelSpec,
    check_heads,
    role_mesh_of,
    shares_prompts,
)

REF = "actor_rollout_ref.ref"


@dataclasses.dataclass(frozen=True)
class ReferenceSpec:
    """The reference's settings, resolved once from the config: its model (None with LoRA: the
    actor's base), how its log-prob pass splits a batch, at which temperature and by which
    kernel, and whether its parameters live in host memory between passes."""

    model: ModelSpec | None
    forward: ForwardSpec
    temperature: float
    impl: str
    param_offload: bool

    @classmethod
    def resolve(cls, config: Any, mesh: Mesh) -> ReferenceSpec:
        """The spec of ``actor_rollout_ref.ref`` on the reference's `mesh`."""
        arr = config.actor_rollout_ref
        fsdp = reference_fsdp(config)
        model = ModelSpec.resolve(arr.model, fsdp)
        return cls(
            model=None if model.lora is not None else model,
            forward=ForwardSpec.resolve(
                arr.ref,
                REF,
                mesh,
                bool(arr.model.use_remove_padding),
                LOG_PROB_KEYS,
                share_prompts=shares_prompts(arr.model, mesh, int(arr.rollout.n)),
            ),
            temperature=float(arr.rollout.temperature),
            impl=logprob_impl(arr, "ref"),
            param_offload=bool(fsdp.get("param_offload", False)),
        )


def reference_fsdp(config: Any) -> Any:
    """The reference's ``fsdp_config`` (the actor's when the ref section has none)."""
    arr = config.actor_rollout_ref
    return arr.ref.get("fsdp_config") or arr.actor.fsdp_config


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
    def from_config(
        cls, config: Any, mesh: Mesh, actor: Actor, *, abstract: bool = False
    ) -> Reference:
        """The reference of `config`: loaded on `mesh`'s devices, or with LoRA `actor`'s base
        (shapes only with `abstract`)."""
        if actor.spec.model.lora is not None:
            return cls.from_actor(config, actor)
        mesh = role_mesh_of(config.actor_rollout_ref.ref, REF, mesh, reference_fsdp(config))
        spec = ReferenceSpec.resolve(config, mesh)
        model = spec.model.load(mesh, abstract=abstract)
        check_heads(model, mesh, REF)
        graphdef, params = nnx.split(model)
        params, shardings = shard_params(params, mesh)
        key = f"{REF}.fsdp_config.param_offload"
        offload = Offload.configure(spec.param_offload, key, mesh.local_devices)
        return cls(spec, mesh, graphdef, params, shardings, offload)

    @classmethod
    def from_actor(cls, config: Any, actor: Actor) -> Reference:
        """With LoRA: `actor`'s frozen base model without its adapters, on the actor's mesh
        (`jrl.runspec.validate` made sure the reference asks for the same sequence parallelism)."""
        mesh = actor.mesh
        spec = ReferenceSpec.resolve(config, mesh)
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
