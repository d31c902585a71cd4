"""Device mesh construction, sharding helpers, host offload and multi-process runs.

Names are imported on first use (`jrl.lazy`): one helper comes without the others' modules.
"""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "agreed_minimum": "jrl.parallel.distributed",
        "allgather_objects": "jrl.parallel.distributed",
        "any_process": "jrl.parallel.distributed",
        "barrier": "jrl.parallel.distributed",
        "gather_batch": "jrl.parallel.distributed",
        "host_array": "jrl.parallel.distributed",
        "host_batch": "jrl.parallel.distributed",
        "is_primary": "jrl.parallel.distributed",
        "put_global": "jrl.parallel.distributed",
        "score_per_process": "jrl.parallel.distributed",
        "MESH_AXES": "jrl.parallel.mesh",
        "SEQUENCE_AXIS": "jrl.parallel.mesh",
        "batch_axes": "jrl.parallel.mesh",
        "batch_sharding": "jrl.parallel.mesh",
        "data_parallel_size": "jrl.parallel.mesh",
        "make_mesh": "jrl.parallel.mesh",
        "on_mesh": "jrl.parallel.mesh",
        "replicated": "jrl.parallel.mesh",
        "role_mesh": "jrl.parallel.mesh",
        "sequence_parallel_size": "jrl.parallel.mesh",
        "shard_batch": "jrl.parallel.mesh",
        "ON_DEVICE": "jrl.parallel.offload",
        "Offload": "jrl.parallel.offload",
        "memory_bytes": "jrl.parallel.offload",
        "ROLLOUT_RULES": "jrl.parallel.sharding",
        "ROLLOUT_EXPERT_RULES": "jrl.parallel.sharding",
        "TRAINING_RULES": "jrl.parallel.sharding",
        "Rules": "jrl.parallel.sharding",
        "is_abstract": "jrl.parallel.sharding",
        "logical_axes": "jrl.parallel.sharding",
        "param_shardings": "jrl.parallel.sharding",
        "place": "jrl.parallel.sharding",
        "shard_params": "jrl.parallel.sharding",
    },
)
