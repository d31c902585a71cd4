"""Every role of a run built as shapes on a slice's devices: the trainer's own roles (`Actor`,
`Reference`, `Critic`, the JAX rollout engine) from the same config, with shapes in place of
weights, so that their programs can be compiled for a slice this host cannot run.

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
from jrl.parallel.topology import Slice
from jrl.rollout.build import build_rollout, sampling_params
from jrl.rollout.engines import FALLBACK
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.sampling import SamplingParams
from jrl.runspec.spec import resolve_run
from jrl.trainer.roles.actor import Actor
from jrl.trainer.roles.critic import Critic
from jrl.trainer.roles.reference import Reference


@dataclasses.dataclass
class Roles:
    """The run's roles as shapes on `mesh` (the slice's devices), with the rollout's sampling."""

    mesh: Mesh
    actor: Actor
    ref: Reference | None
    critic: Critic | None
    rollout: JaxRollout
    sampling: SamplingParams
    notes: list[str]


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


def build_roles(config: Any, where: Slice) -> Roles:
    """The roles of the PPO-family `config` on the slice `where`, as shapes. The rollout is the
    JAX engine whatever ``rollout.name`` says (vLLM does not run on TPU; noted)."""
    notes: list[str] = []
    run = resolve_run(config)
    if run.mesh.devices != where.chips:
        notes.append(
            f"trainer.nnodes * trainer.n_gpus_per_node = {run.mesh.devices}, planned for the "
            f"slice's {where.chips} chips instead"
        )
    mesh = make_mesh(
        where.chips,
        fsdp_size=run.mesh.fsdp_size,
        sequence_parallel=run.mesh.sequence_parallel,
        tensor_parallel=run.mesh.tensor_parallel,
        devices=where.devices,
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
    rollout = build_rollout(
        spec,
        actor.learner.graphdef,
        actor.params,
        actor.mesh,
        tokenizer,
        engine_name=FALLBACK,
        lora=actor.spec.model.lora,
    )
    return Roles(mesh, actor, ref, critic, rollout, sampling_params(spec.sampling, rollout), notes)
