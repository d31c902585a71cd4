"""Arrays moved between two disjoint sets of devices by one program over both.

The trainer's mesh and the rollout's are sub-meshes of the same slice (``hybrid_engine=False``).
`jax.device_put` cannot move an array between disjoint meshes whose devices belong to several
processes, so `MeshTransfer` runs the move as a program of its own over the union of both:

- the union mesh is ``('role', *source axes)`` with the source devices at role 0 and as many
  target devices, in the same arrangement, at role 1 (the `mirror` mesh);
- each process stacks, per device it owns, the source shard (role 0) or a zero buffer of the
  same shape (role 1) into one [2, ...] array laid out ``P('role', *spec)``: no copy between
  devices, only buffers this process already holds;
- a `shard_map` over the union mesh `ppermute`s role 0's shards to role 1: each shard goes to
  the target device at the same place in the mesh, and nothing is gathered;
- the target's shards, unstacked, form the array on the `mirror` mesh with the source's layout.

Moves go bucket by bucket (`buckets`, at most ``update_weights_bucket_megabytes`` per program), so
the extra memory on either side is one bucket's. Floating matrices can be cast to the target's
dtype before they move (`dtypes`), which halves the bytes for a bfloat16 rollout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

ROLE_AXIS = "role"


def buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices of `sizes` (bytes) grouped so that each group holds at most
    `bucket_bytes` (a larger item goes alone); `bucket_bytes` <= 0: one group."""
    if bucket_bytes <= 0:
        return [list(range(len(sizes)))] if sizes else []
    groups: list[list[int]] = []
    total = 0
    for index, size in enumerate(sizes):
        if groups and total + size <= bucket_bytes:
            groups[-1].append(index)
            total += size
        else:
            groups.append([index])
            total = size
    return groups


def leaf_bytes(leaf: Any) -> int:
    """Bytes of an array or shape struct, whole (not per device)."""
    return math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize


def weight_buckets(targets: Sequence[Any], bucket_bytes: int) -> list[list[int]]:
    """`buckets` of a weight sync: `targets` are the weights as the receiver holds them (arrays
    or shape structs, in the order they move), each bucket at most `bucket_bytes` of them."""
    return buckets([leaf_bytes(t) for t in targets], bucket_bytes)


class MeshTransfer:
    """Moves arrays laid out on `source` (a mesh) to as many `target` devices (same count),
    where they keep the source's layout on the `mirror` mesh."""

    def __init__(self, source: Mesh, target: Sequence[jax.Device]):
        if len(target) != source.size:
            raise ValueError(
                f"the rollout's {len(target)} devices must equal the trainer's {source.size}: "
                "each trainer device sends its shard to one rollout device"
            )
        if set(target) & set(source.devices.flat):
            raise ValueError("the rollout's and the trainer's devices must be disjoint")
        self.source = source
        self.mirror = Mesh(np.asarray(target).reshape(source.devices.shape), source.axis_names)
        self.union = Mesh(
            np.stack([source.devices, self.mirror.devices]), (ROLE_AXIS, *source.axis_names)
        )
        self._targets = set(self.mirror.devices.flat)
        self._programs: dict[tuple[PartitionSpec, ...], Any] = {}

    def move(self, arrays: Sequence[jax.Array], dtypes: Sequence[Any] | None = None) -> list[Any]:
        """`arrays` (each on `source`) on the mirror mesh, cast to `dtypes` (default: their
        own) before they move; one program for all of them."""
        dtypes = [a.dtype for a in arrays] if dtypes is None else list(dtypes)
        specs = tuple(self._spec(a) for a in arrays)
        stacked = [self._stack(a, d, s) for a, d, s in zip(arrays, dtypes, specs, strict=True)]
        moved = self._program(specs)(*stacked)
        return [self._unstack(m, a.shape, s) for m, a, s in zip(moved, arrays, specs, strict=True)]

    def lower(self, structs: Sequence[jax.ShapeDtypeStruct]) -> Any:
        """The move of arrays shaped as `structs` (on `source`), lowered (for `jrl.compile`)."""
        specs = tuple(self._spec(s) for s in structs)
        stacked = [
            jax.ShapeDtypeStruct(
                (2, *s.shape), s.dtype, sharding=NamedSharding(self.union, _stacked(spec))
            )
            for s, spec in zip(structs, specs, strict=True)
        ]
        return self._program(specs).lower(*stacked)

    def _spec(self, array: Any) -> PartitionSpec:
        sharding = array.sharding
        if not isinstance(sharding, NamedSharding) or sharding.mesh.devices.tolist() != (
            self.source.devices.tolist()
        ):
            raise ValueError(f"array {array.shape} is not laid out on the transfer's source mesh")
        return sharding.spec

    def _program(self, specs: tuple[PartitionSpec, ...]) -> Any:
        if specs not in self._programs:
            self._programs[specs] = self._build(specs)
        return self._programs[specs]

    def _build(self, specs: tuple[PartitionSpec, ...]) -> Any:
        stacked = tuple(_stacked(spec) for spec in specs)

        def send(*shards: jax.Array) -> tuple[jax.Array, ...]:
            return tuple(jax.lax.ppermute(x, ROLE_AXIS, [(0, 1)]) for x in shards)

        moved = jax.shard_map(send, mesh=self.union, in_specs=stacked, out_specs=stacked)
        shardings = tuple(NamedSharding(self.union, spec) for spec in stacked)
        return jax.jit(
            moved,
            in_shardings=shardings,
            out_shardings=shardings,
            donate_argnums=tuple(range(len(specs))),
        )

    def _stack(self, array: jax.Array, dtype: Any, spec: PartitionSpec) -> jax.Array:
        """[2, ...] over the union mesh: this process's source shards at role 0, zeros at
        role 1."""
        sharding = NamedSharding(self.union, _stacked(spec))
        shape = (2, *array.shape)
        own = {shard.device: shard.data for shard in array.addressable_shards}
        block = (1, *array.sharding.shard_shape(array.shape))
        pieces = []
        for device in sharding.addressable_devices_indices_map(shape):
            if device in own:
                pieces.append(own[device][None].astype(dtype))
            else:
                pieces.append(jnp.zeros(block, dtype, device=device))
        return jax.make_array_from_single_device_arrays(shape, sharding, pieces)

    def _unstack(self, moved: jax.Array, shape: tuple[int, ...], spec: PartitionSpec) -> Any:
        pieces = [s.data[0] for s in moved.addressable_shards if s.device in self._targets]
        return jax.make_array_from_single_device_arrays(
            shape, NamedSharding(self.mirror, spec), pieces
        )


def _stacked(spec: PartitionSpec) -> PartitionSpec:
    return PartitionSpec(ROLE_AXIS, *spec)


def sent_bytes(arrays: Sequence[Any], dtypes: Sequence[Any]) -> int:
    """Bytes that cross from the source devices to the target devices: every source device's
    shard, in the dtype it moves in."""
    total = 0
    for array, dtype in zip(arrays, dtypes, strict=True):
        shard = array.sharding.shard_shape(array.shape)
        devices = len(array.sharding.device_set)
        total += int(np.prod(shard)) * jnp.dtype(dtype).itemsize * devices
    return total
