"""The rollout's mesh and parameter layout: data-parallel replicas of a tensor-parallel model.

The rollout mesh reuses the trainer's devices as (data = devices / tp, fsdp = 1, tensor = tp,
sequence = 1). Parameters are replicated over `data` and split over `tensor` Megatron style:
attention heads and MLP columns on the way in, the matching rows on the way out, the vocabulary
of the embedding and LM head. A dimension that does not divide evenly stays whole.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jrl.parallel import MESH_AXES, batch_axes

_CONFIG_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
# (module name, parameter name) -> which dimension is split over 'tensor'.
_SPLIT_DIM = {
    ("q_proj", "kernel"): 1,
    ("k_proj", "kernel"): 1,
    ("v_proj", "kernel"): 1,
    ("q_proj", "bias"): 0,
    ("k_proj", "bias"): 0,
    ("v_proj", "bias"): 0,
    ("gate_proj", "kernel"): 1,
    ("up_proj", "kernel"): 1,
    ("o_proj", "kernel"): 0,
    ("down_proj", "kernel"): 0,
    ("embed_tokens", "embedding"): 0,
    ("lm_head", "kernel"): 1,
}


def rollout_mesh(mesh: Mesh | None, tensor_parallel: int) -> Mesh:
    """The devices of `mesh` (the default device when None) as data x tensor replicas."""
    devices = np.asarray([jax.devices()[0]] if mesh is None else mesh.devices).reshape(-1)
    if tensor_parallel < 1 or devices.size % tensor_parallel:
        raise ValueError(
            f"{_CONFIG_KEY}={tensor_parallel} must be a positive divisor of the {devices.size} "
            f"device(s) the rollout runs on; set it to 1 or to a divisor of {devices.size}"
        )
    shape = (devices.size // tensor_parallel, 1, tensor_parallel, 1)
    return Mesh(devices.reshape(shape), MESH_AXES)


def _split_dim(path: tuple[Any, ...], shape: tuple[int, ...], tensor_parallel: int) -> int | None:
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    dim = next(
        (_SPLIT_DIM[key] for key in zip(names, names[1:], strict=False) if key in _SPLIT_DIM),
        None,
    )
    if dim is None or dim >= len(shape) or shape[dim] % tensor_parallel:
        return None
    return dim


def cache_sharding(mesh: Mesh, num_kv_heads: int) -> NamedSharding:
    """KV cache [slots, layers, tokens, kv_heads, head_dim]: slots over the replicas, heads over
    `tensor` (when they divide evenly)."""
    heads = "tensor" if num_kv_heads % mesh.shape["tensor"] == 0 else None
    return NamedSharding(mesh, PartitionSpec(batch_axes(), None, None, heads))


def param_shardings(state: Any, mesh: Mesh) -> Any:
    """Tensor-parallel shardings for every array of a model's parameter pytree on `mesh`."""
    tensor_parallel = mesh.shape["tensor"]

    def sharding(path: tuple[Any, ...], leaf: Any) -> NamedSharding:
        spec: list[Any] = [None] * np.ndim(leaf)
        dim = _split_dim(path, tuple(np.shape(leaf)), tensor_parallel)
        if dim is not None and tensor_parallel > 1:
            spec[dim] = "tensor"
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree_util.tree_map_with_path(sharding, state)
