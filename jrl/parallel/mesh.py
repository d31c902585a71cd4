"""The SPMD mesh and how parameters and batches are laid out on it.

Mesh axes are ``('data', 'fsdp', 'tensor', 'sequence')``. Parameters are FSDP-sharded: each array is
split over ``fsdp`` along its largest dimension that divides evenly, and replicated otherwise.
Batches are split over ``('data', 'fsdp')`` along their row dimension.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "sequence")


def make_mesh(
    num_devices: int, fsdp_size: int = -1, sequence_parallel: int = 1, tensor_parallel: int = 1
) -> Mesh:
    """A mesh over the first `num_devices` devices; `fsdp_size=-1` takes all devices left over."""
    available = jax.devices()
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
    fsdp = rest if fsdp_size in (-1, None) else fsdp_size
    if fsdp <= 0 or rest % fsdp:
        raise ValueError(
            f"actor_rollout_ref.actor.fsdp_config.fsdp_size={fsdp_size} must divide the "
            f"{rest} devices left after sequence/tensor parallelism (or be -1)"
        )
    shape = (rest // fsdp, fsdp, tensor_parallel, sequence_parallel)
    devices = np.asarray(available[:num_devices]).reshape(shape)
    return Mesh(devices, MESH_AXES)


def batch_axes() -> tuple[str, str]:
    """Mesh axes that split the batch rows."""
    return ("data", "fsdp")


def replicated(mesh: Mesh) -> NamedSharding:
    """A sharding that keeps a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int, row_axis: int = 0) -> NamedSharding:
    """Rows (dimension `row_axis`) split over ('data', 'fsdp'); other dimensions whole."""
    spec = [None] * ndim
    spec[row_axis] = batch_axes()
    return NamedSharding(mesh, PartitionSpec(*spec))


def param_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """FSDP layout of one parameter: its largest evenly divisible dimension split over 'fsdp'."""
    fsdp = mesh.shape["fsdp"]
    spec: list[Any] = [None] * len(shape)
    if fsdp > 1:
        candidates = [d for d in range(len(shape)) if shape[d] % fsdp == 0]
        if candidates:
            spec[max(candidates, key=lambda d: shape[d])] = "fsdp"
    return NamedSharding(mesh, PartitionSpec(*spec))


def param_shardings(tree: Any, mesh: Mesh) -> Any:
    """FSDP shardings for every array (or shape struct) of a parameter or optimizer-state pytree."""
    return jax.tree.map(lambda x: param_sharding(mesh, tuple(np.shape(x))), tree)


def shard_params(tree: Any, mesh: Mesh) -> tuple[Any, Any]:
    """Place a pytree of parameters FSDP-sharded; returns (placed, shardings)."""
    shardings = param_shardings(tree, mesh)
    return jax.device_put(tree, shardings), shardings


def shard_batch(tensors: dict[str, Any], mesh: Mesh, row_axis: int = 0) -> dict[str, jax.Array]:
    """Place host arrays with their rows split over the batch axes."""
    return {
        k: jax.device_put(v, batch_sharding(mesh, np.ndim(v), row_axis)) for k, v in tensors.items()
    }
