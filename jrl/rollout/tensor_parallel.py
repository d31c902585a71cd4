"""The rollout's mesh and KV-cache layout: data-parallel replicas of a tensor-parallel model.

The rollout mesh reuses the trainer's devices as (data = devices / tp, fsdp = 1, tensor = tp,
sequence = 1). Parameters are replicated over `data` and split over `tensor` by
`jrl.parallel.ROLLOUT_RULES` (Megatron style, see `jrl.parallel.sharding`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jrl.models.config import ModelConfig
from jrl.models.kv_layout import AxisOrder, KVLayout
from jrl.parallel import MESH_AXES, batch_axes
from jrl_kernels.platform import platform_name

_CONFIG_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


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


def kv_layout(mesh: Mesh, config: ModelConfig) -> KVLayout:
    """The KV cache layout of `config`'s model on `mesh`'s devices (`config.kv_layout`)."""
    return config.kv_layout(platform_name(mesh.devices.flat[0].platform))


def cache_sharding(mesh: Mesh, config: ModelConfig) -> tuple[NamedSharding, NamedSharding]:
    """The (keys, values) buffers' shardings of `config`'s model on `mesh` (`kv_layout`): slots
    over the replicas, kv heads over `tensor` (when they divide evenly)."""
    split_heads = config.num_kv_heads % mesh.shape["tensor"] == 0
    layout = kv_layout(mesh, config)

    def sharding(order: AxisOrder) -> NamedSharding:
        spec: list[str | tuple[str, ...] | None] = [batch_axes(), None, None, None]
        if split_heads:
            spec[order.heads_axis] = "tensor"
        return NamedSharding(mesh, PartitionSpec(*(None,) * layout.layer_axes, *spec))

    return sharding(layout.keys), sharding(layout.values)
