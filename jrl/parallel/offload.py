"""Host offload of a role's parameters or optimizer state (``param_offload``,
``optimizer_offload``).

An offloaded state lives in pinned host memory (a JAX memory kind) between uses and is moved to
device memory, with its own sharding, for each use. Where the backend has no host memory kind a
warning says so and the state stays in device memory.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from jrl.parallel.sharding import place

HOST_MEMORY = "pinned_host"
DEVICE_MEMORY = "device"


def host_memory_kind(devices: Iterable[Any]) -> str | None:
    """`HOST_MEMORY` when every one of `devices` can address it, else None."""
    kinds = [{memory.kind for memory in device.addressable_memories()} for device in devices]
    return HOST_MEMORY if kinds and all(HOST_MEMORY in k for k in kinds) else None


def memory_bytes(tree: Any) -> dict[str, int]:
    """Bytes that the arrays of `tree` (e.g. ``jax.live_arrays()``) hold per memory kind, summed
    over their devices (replicas count once per device)."""
    out: dict[str, int] = {}
    for x in jax.tree.leaves(tree):
        if not isinstance(x, jax.Array) or x.is_deleted():
            continue
        sharding = x.sharding
        per_device = math.prod(sharding.shard_shape(x.shape)) * x.dtype.itemsize
        kind = sharding.memory_kind or DEVICE_MEMORY
        out[kind] = out.get(kind, 0) + per_device * len(sharding.device_set)
    return out


@dataclasses.dataclass(frozen=True)
class Offload:
    """Where one state lives between uses: host memory of kind `memory_kind`, or device memory
    when it is None."""

    memory_kind: str | None = None

    @classmethod
    def configure(cls, enabled: bool, key: str, devices: Sequence[Any]) -> Offload:
        """The offload that config key `key` (e.g. ``critic.model.fsdp_config.param_offload``)
        asks for on `devices` (a mesh's local ones); warns and stays in device memory where
        the backend lacks host memory kinds."""
        if not enabled:
            return cls()
        kind = host_memory_kind(devices)
        if kind is None:
            platform = devices[0].platform
            warnings.warn(
                f"{key}=True: the {platform!r} backend has no {HOST_MEMORY!r} memory kind, so "
                "this state stays in device memory; set it to False to silence this warning",
                stacklevel=2,
            )
        return cls(kind)

    @property
    def enabled(self) -> bool:
        """Whether the state is kept in host memory between uses."""
        return self.memory_kind is not None

    def store(self, tree: Any, shardings: Any) -> Any:
        """`tree` (laid out by its device `shardings`) moved to host memory with the same layout;
        unchanged when not enabled."""
        if not self.enabled:
            return tree
        host = jax.tree.map(lambda s: s.with_memory_kind(self.memory_kind), shardings)
        return place(tree, host)

    def fetch(self, tree: Any, shardings: Any) -> Any:
        """`tree` in device memory with `shardings` (unchanged when not enabled)."""
        return place(tree, shardings) if self.enabled else tree


# No offload: the state stays in device memory.
ON_DEVICE = Offload()
