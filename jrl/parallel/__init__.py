"""Device mesh construction and sharding helpers."""

from jrl.parallel.mesh import (
    MESH_AXES,
    batch_axes,
    batch_sharding,
    make_mesh,
    param_sharding,
    param_shardings,
    replicated,
    shard_batch,
    shard_params,
)

__all__ = [
    "MESH_AXES",
    "batch_axes",
    "batch_sharding",
    "make_mesh",
    "param_sharding",
    "param_shardings",
    "replicated",
    "shard_batch",
    "shard_params",
]
