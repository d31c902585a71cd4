"""The actor's weights to a rollout on other devices, bucket by bucket (`MeshTransfer`).

Each bucket (at most ``update_weights_bucket_megabytes`` of weights, as the rollout holds them)
moves in one program over both meshes, is laid out as the rollout lays it out (on the rollout's
devices only) and replaces those weights in the engine at once, so neither side holds more than
one bucket beyond its own weights.
"""

from __future__ import annotations

import time
from typing import Protocol

import jax
from flax import nnx

from jrl.parallel.transfer import MeshTransfer, weight_buckets


class BucketedEngine(Protocol):
    """What a sync needs from the engine: its weights' names, their current values (dtype and
    layout) and a way to replace some of them."""

    @property
    def state(self) -> nnx.State: ...

    def weight_paths(self) -> list[str]: ...

    def replace_weights(self, leaves: dict[str, jax.Array]) -> None: ...


class WeightSync:
    """Syncs a trainer's parameters (laid out on `transfer.source`) into `engine` (on the
    transfer's target devices), `bucket_bytes` at a time (<= 0: all at once)."""

    def __init__(self, transfer: MeshTransfer, engine: BucketedEngine, bucket_bytes: int):
        self.transfer, self.engine, self.bucket_bytes = transfer, engine, bucket_bytes
        self.version = 0  # the trainer's version the engine holds

    def __call__(self, params: nnx.State, version: int) -> dict[str, float]:
        """Moves `params` (the trainer's `version`) into the engine; its metrics: bytes sent,
        buckets, seconds."""
        start = time.perf_counter()
        names = self.engine.weight_paths()
        sources = jax.tree.leaves(params)
        if len(sources) != len(names):
            raise ValueError(
                f"weight sync: the trainer has {len(sources)} parameters, the rollout {len(names)}"
            )
        targets = jax.tree.leaves(self.engine.state)
        dtypes = [t.dtype for t in targets]
        groups = weight_buckets(targets, self.bucket_bytes)
        for group in groups:
            moved = self.transfer.move([sources[i] for i in group], [dtypes[i] for i in group])
            self.engine.replace_weights(
                {names[i]: array for i, array in zip(group, moved, strict=True)}
            )
        jax.block_until_ready(self.engine.state)
        self.version = version
        return {
            "sync/bytes": float(self.transfer.sent_bytes(sources, dtypes)),
            "sync/buckets": float(len(groups)),
            "sync/seconds": time.perf_counter() - start,
        }
