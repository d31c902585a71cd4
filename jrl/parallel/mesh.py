"""The SPMD mesh and how parameters and batches are laid out on it.

Mesh axes are ``('data', 'fsdp', 'tensor', 'sequence')``. Parameters are laid out from their
logical axes by `jrl.parallel.sharding` (over ``fsdp`` and ``tensor`` in training). Batches are
split over ``('data', 'fsdp')`` along their row dimension (replicated over ``tensor``). With a
``sequence`` axis of more than one device (verl's ``ulysses_sequence_parallel_size``) each batch
shard's sequences are split over it too: a model traced under such a mesh (`on_mesh`) keeps
activations ``[B, S, ...]`` with S over ``sequence`` and runs attention on whole sequences with
its heads split over ``sequence`` (`jrl.models.attention.ulysses_attention`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from jrl.parallel.distributed import put_global

MESH_AXES = ("data", "fsdp", "tensor", "sequence")
SEQUENCE_AXIS = "sequence"


def make_mesh(
    num_devices: int,
    fsdp_size: int = -1,
    sequence_parallel: int = 1,
    tensor_parallel: int = 1,
    devices: Sequence[Any] | None = None,
    fsdp_key: str = "actor_rollout_ref.actor.fsdp_config.fsdp_size",
    expert_parallel: int = 1,
) -> Mesh:
    """A mesh over the first `num_devices` of `devices` (default `jax.devices()`; a TPU slice's
    devices to compile for it from another host); `fsdp_size=-1` takes all devices left over
    after `expert_parallel` (the ``data`` axis, which splits a mixture of experts' experts;
    `fsdp_key` names its config key in errors)."""
    available = list(jax.devices() if devices is None else devices)
    if num_devices > len(available):
        raise ValueError(
            f"trainer.nnodes * trainer.n_gpus_per_node = {num_devices} devices requested, but JAX "
            f"sees {len(available)} ({available[0].platform}); lower trainer.n_gpus_per_node"
        )
    model_parallel = sequence_parallel * tensor_parallel
    if num_devices % model_parallel:
        raise ValueError(
            f"{num_devices} devices cannot hold sequence parallel {sequence_parallel} x "
            f"tensor parallel {tensor_parallel}"
        )
    rest = num_devices // model_parallel
    if expert_parallel < 1 or rest % expert_parallel:
        raise ValueError(
            f"expert_parallel_size={expert_parallel} must divide the {rest} devices left after "
            "sequence/tensor parallelism"
        )
    fsdp = rest // expert_parallel if fsdp_size in (-1, None) else fsdp_size
    if fsdp <= 0 or rest % fsdp:
        raise ValueError(
            f"{fsdp_key}={fsdp_size} must divide the "
            f"{rest} devices left after sequence/tensor parallelism (or be -1)"
        )
    if expert_parallel > 1 and rest // fsdp != expert_parallel:
        raise ValueError(
            f"{fsdp_key}={fsdp_size} leaves {rest // fsdp} devices on the data axis, which "
            f"splits the experts, but expert_parallel_size is {expert_parallel}: set "
            f"{fsdp_key}={rest // expert_parallel} (or -1)"
        )
    shape = (rest // fsdp, fsdp, tensor_parallel, sequence_parallel)
    devices = np.asarray(available[:num_devices]).reshape(shape)
    return Mesh(devices, MESH_AXES)


def split_devices(
    devices: Sequence[Any], trainer_per_node: int, rollout_per_node: int
) -> tuple[list[Any], list[Any]]:
    """(the trainer's devices, the rollout's): of each process's devices in id order, the first
    `trainer_per_node` and the next `rollout_per_node`."""
    hosts: dict[int, list[Any]] = {}
    for device in sorted(devices, key=lambda d: (d.process_index, d.id)):
        hosts.setdefault(device.process_index, []).append(device)
    trainer: list[Any] = []
    rollout: list[Any] = []
    for local in hosts.values():
        trainer += local[:trainer_per_node]
        rollout += local[trainer_per_node : trainer_per_node + rollout_per_node]
    return trainer, rollout


def batch_axes() -> tuple[str, str]:
    """Mesh axes that split the batch rows."""
    return ("data", "fsdp")


def data_parallel_size(mesh: Mesh | AbstractMesh) -> int:
    """How many ways the batch rows are split (verl's DP size: devices // sequence parallel)."""
    return math.prod(mesh.shape[axis] for axis in batch_axes())


def sequence_parallel_size(mesh: Mesh | AbstractMesh) -> int:
    """How many devices split each sequence (the size of the `sequence` axis)."""
    return dict(mesh.shape).get(SEQUENCE_AXIS, 1)


def role_mesh(
    mesh: Mesh,
    sequence_parallel: int,
    fsdp_size: int,
    key: str,
    tensor_parallel: int | None = None,
    expert_parallel: int = 1,
) -> Mesh:
    """`mesh` when its axes already have the role's sizes (`sequence_parallel` on `sequence`,
    `tensor_parallel` on `tensor` (None: keep `mesh`'s) and `fsdp_size` on `fsdp`, -1: every
    device left), else a mesh over the same devices with those sizes, as verl's workers each
    build their own device mesh; `key` names the role's config section for errors.
    `expert_parallel` devices on ``data`` split a mixture of experts' experts."""
    tensor = mesh.shape["tensor"] if tensor_parallel is None else tensor_parallel
    rest = mesh.size // max(1, sequence_parallel * tensor)
    wanted = {
        SEQUENCE_AXIS: sequence_parallel,
        "tensor": tensor,
        "fsdp": rest // max(1, expert_parallel) if fsdp_size in (-1, None) else fsdp_size,
    }
    if all(dict(mesh.shape).get(axis, 1) == size for axis, size in wanted.items()):
        return mesh
    try:
        return make_mesh(
            mesh.size,
            fsdp_size=fsdp_size,
            sequence_parallel=sequence_parallel,
            tensor_parallel=tensor,
            devices=list(mesh.devices.flat),
            fsdp_key="fsdp_config.fsdp_size",
            expert_parallel=expert_parallel,
        )
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from err


def on_mesh(fn: Callable[..., Any], mesh: Mesh) -> Callable[..., Any]:
    """`fn` called (and so traced, when it is jitted) with `mesh` as the ambient mesh
    (`jax.set_mesh`), which is what turns on sequence parallelism inside the model."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(mesh):
            return fn(*args, **kwargs)

    return run


def sequence_mesh() -> AbstractMesh | None:
    """The ambient mesh (see `on_mesh`) when its `sequence` axis splits sequences, else None
    (no ambient mesh, one device on the axis, or inside a `shard_map` over it)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or sequence_parallel_size(mesh) == 1 or SEQUENCE_AXIS in mesh.manual_axes:
        return None
    return mesh


def row_axes(mesh: Mesh | AbstractMesh, rows: int) -> tuple[str, str] | None:
    """The batch axes for `rows` rows on `mesh`, or None (rows replicated) when they do not
    split evenly."""
    return batch_axes() if rows % data_parallel_size(mesh) == 0 else None


def constrain_activations(x: jax.Array) -> jax.Array:
    """Constrains activations [B, S, ...] to rows split over the ambient mesh's batch axes and,
    under sequence parallelism, S over `sequence`, so that FSDP gathers weights rather than the
    batch (the partitioner may otherwise all-gather a layer's activations over the whole batch).
    Unchanged without an ambient mesh (see `on_mesh`) or inside a `shard_map` over those axes.
    Inside `jax.jit`."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or set(mesh.manual_axes) & {*batch_axes(), SEQUENCE_AXIS}:
        return x
    rows = row_axes(mesh, x.shape[0]) if data_parallel_size(mesh) > 1 else None
    sequence = SEQUENCE_AXIS if sequence_parallel_size(mesh) > 1 else None
    if rows is None and sequence is None:
        return x
    spec = PartitionSpec(rows, sequence, *[None] * (x.ndim - 2))
    return jax.lax.with_sharding_constraint(x, spec)


def replicated(mesh: Mesh) -> NamedSharding:
    """A sharding that keeps a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int, row_axis: int = 0) -> NamedSharding:
    """Rows (dimension `row_axis`) split over ('data', 'fsdp'); other dimensions whole."""
    spec = [None] * ndim
    spec[row_axis] = batch_axes()
    return NamedSharding(mesh, PartitionSpec(*spec))


def shard_batch(tensors: dict[str, Any], mesh: Mesh, row_axis: int = 0) -> dict[str, jax.Array]:
    """Place host arrays with their rows split over the batch axes."""
    return {
        k: put_global(v, batch_sharding(mesh, np.ndim(v), row_axis)) for k, v in tensors.items()
    }
