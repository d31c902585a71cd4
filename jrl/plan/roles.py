"""Every role of a run built as shapes on a slice's devices: the trainer's own roles (`Actor`,
`Reference`, `Critic`, the JAX rollout engine) from the same config, with shapes in place of
weights, so that their programs can be compiled for a slice this host cannot run. A split run
(``hybrid_engine=False``) builds the trainer's roles on the trainer's chips of each host and the
rollout on the rollout's (`split_devices`), with the `MeshTransfer` of its weight sync.

Only the model's config.json is read (and its tokenizer, for the pad and EOS ids, when the
folder has one): no weights and no data files.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from jax.sharding import Mesh

from jrl.data.tokenizer import load_tokenizer
from jrl.parallel import make_mesh
from jrl.parallel.mesh import split_devices
from jrl.parallel.topology import Slice
from jrl.parallel.transfer import MeshTransfer
from jrl.rollout.build import build_rollout, sampling_params
from jrl.rollout.engines import FALLBACK
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.sampling import SamplingParams
from jrl.runspec.spec import RunSpec, resolve_run
from jrl.trainer.roles.actor import Actor
from jrl.trainer.roles.critic import Critic
from jrl.trainer.roles.reference import Reference


@dataclasses.dataclass
class Roles:
    """The run's roles as shapes on `mesh` (the trainer's devices), with the rollout's sampling;
    a split run's `transfer` (the actor's mesh to the rollout's devices) and sync bucket bytes."""

    mesh: Mesh
    actor: Actor
    ref: Reference | None
    critic: Critic | None
    rollout: JaxRollout
    sampling: SamplingParams
    notes: list[str]
    transfer: MeshTransfer | None = None
    bucket_bytes: int = 0


def _token_ids(path: str, model_config: Any) -> Any:
    """The pad and EOS ids of the tokenizer at `path` when there is one, else the model
    config's (pad falls back to EOS, then 0)."""
    try:
        return load_tokenizer(path)
    except Exception:  # no tokenizer files: the ids come from config.json
        eos = model_config.eos_token_id
        first = eos[0] if isinstance(eos, (list, tuple)) else eos
        pad = model_config.pad_token_id if model_config.pad_token_id is not None else first
        return types.SimpleNamespace(eos_token_id=first, pad_token_id=pad or 0)


def _devices(run: RunSpec, where: Slice, notes: list[str]) -> tuple[list[Any], list[Any] | None]:
    """(the trainer's devices, the rollout's or None when colocated) of the slice `where`."""
    if run.placement is None:
        if run.mesh.devices != where.chips:
            notes.append(
                f"trainer.nnodes * trainer.n_gpus_per_node = {run.mesh.devices}, planned for the "
                f"slice's {where.chips} chips instead"
            )
        return list(where.devices), None
    per_node = run.mesh.devices_per_node
    trainer, rollout = split_devices(
        where.devices, per_node, run.placement.rollout_devices_per_node
    )
    if len(trainer) != run.mesh.devices:
        notes.append(
            f"trainer.nnodes * trainer.n_gpus_per_node = {run.mesh.devices}, planned for "
            f"{per_node} trainer chips on each of the slice's {where.hosts} hosts instead"
        )
    return trainer, rollout


def build_roles(config: Any, where: Slice) -> Roles:
    """The roles of the PPO-family `config` on the slice `where`, as shapes. The rollout is the
    JAX engine whatever ``rollout.name`` says (vLLM does not run on TPU; noted)."""
    notes: list[str] = []
    run = resolve_run(config)
    trainer_devices, rollout_devices = _devices(run, where, notes)
    mesh = make_mesh(
        len(trainer_devices),
        fsdp_size=run.mesh.fsdp_size,
        sequence_parallel=run.mesh.sequence_parallel,
        tensor_parallel=run.mesh.tensor_parallel,
        devices=trainer_devices,
        expert_parallel=run.mesh.expert_parallel,
    )
    total = int(run.cadence.total_training_steps or 1)
    actor = Actor.create(run.actor, run.algorithm, mesh, total, abstract=True)
    ref = None if run.ref is None else Reference.create(run.ref, mesh, actor, abstract=True)
    critic = None if run.critic is None else Critic.create(run.critic, mesh, total, abstract=True)
    spec = run.rollout
    if spec.engine != FALLBACK:
        notes.append(f"rollout.name={spec.engine}: planned with jrl's JAX sampler")
    model_config = actor.learner.model().config
    tokenizer = _token_ids(run.data.tokenizer.path, model_config)
    transfer, rollout_mesh = None, actor.mesh
    if rollout_devices is not None:  # as `split_rollout` builds it on the rollout's devices
        transfer = MeshTransfer(actor.mesh, rollout_devices)
        rollout_mesh = make_mesh(len(rollout_devices), devices=rollout_devices)
    rollout = build_rollout(
        spec,
        actor.learner.graphdef,
        actor.params,
        rollout_mesh,
        tokenizer,
        engine_name=FALLBACK,
        lora=actor.spec.model.lora,
    )
    sampling = sampling_params(spec.sampling, rollout)
    bucket_bytes = 0 if run.placement is None else run.placement.bucket_bytes
    return Roles(mesh, actor, ref, critic, rollout, sampling, notes, transfer, bucket_bytes)
