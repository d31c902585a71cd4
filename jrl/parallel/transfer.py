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

With fewer target devices (a divisor of the source's), the source's devices form a grid of
copies x shards (`MeshTransfer.staging`): each array is first laid out on it inside the source's
devices (split on one dimension, repeated over the copies), and the first copy sends.

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
COPIES_AXIS, SHARD_AXIS = "copies", "shard"  # a staging grid's axes (fewer targets)


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
    """Moves arrays laid out on `source` (a mesh) to the `target` devices: as many, where they
    keep the source's layout (the `mirror` mesh has the source's axes), or a divisor of them,
    where they arrive split on one dimension over the ``shard`` axis (`mirror`: one axis).

    With fewer target devices, the source's devices form a ``(copies, shard)`` grid (`staging`)
    and each array is first laid out on it, split over ``shard`` and repeated over ``copies``,
    inside the source's devices; the first row of copies sends. Each host then sends from the
    trainer devices it holds, as the grid takes every ``copies``-th device as a sender."""

    def __init__(self, source: Mesh, target: Sequence[jax.Device]):
        if set(target) & set(source.devices.flat):
            raise ValueError("the rollout's and the trainer's devices must be disjoint")
        if not target or source.size % len(target):
            raise ValueError(
                f"the rollout's {len(target)} devices must divide the trainer's {source.size}: "
                "each rollout device receives its shard from one trainer device"
            )
        self.source = source
        targets = np.asarray(target)
        if len(target) == source.size:
            self.staging: Mesh | None = None
            senders = source.devices
            self.mirror = Mesh(targets.reshape(source.devices.shape), source.axis_names)
        else:
            copies = source.size // len(target)
            grid = np.asarray(list(source.devices.flat)).reshape(len(target), copies).T
            self.staging = Mesh(grid, (COPIES_AXIS, SHARD_AXIS))
            senders = grid[0]
            self.mirror = Mesh(targets, (SHARD_AXIS,))
        self.union = Mesh(
            np.stack([senders, self.mirror.devices]), (ROLE_AXIS, *self.mirror.axis_names)
        )
        self._senders = set(np.asarray(senders).flat)
        self._targets = set(self.mirror.devices.flat)
        self._programs: dict[tuple[PartitionSpec, ...], Any] = {}

    def move(self, arrays: Sequence[jax.Array], dtypes: Sequence[Any] | None = None) -> list[Any]:
        """`arrays` (each on `source`) on the mirror mesh, cast to `dtypes` (default: their
        own) before they move; one program for all of them."""
        dtypes = [a.dtype for a in arrays] if dtypes is None else list(dtypes)
        specs = tuple(self._spec(a) for a in arrays)
        if self.staging is not None:
            arrays = [
                jax.device_put(a, NamedSharding(self.staging, s))
                for a, s in zip(arrays, specs, strict=True)
            ]
        stacked = [self._stack(a, d, s) for a, d, s in zip(arrays, dtypes, specs, strict=True)]
        moved = self._program(specs)(*stacked)
        return [self._unstack(m, a.shape, s) for m, a, s in zip(moved, arrays, specs, strict=True)]

    def lower(self, structs: Sequence[jax.ShapeDtypeStruct]) -> Any:
        """The move of arrays shaped as `structs` (on `source`), lowered (for `jrl.compile`;
        with `staging`, without the layout on it that comes first)."""
        specs = tuple(self._spec(s) for s in structs)
        stacked = [
            jax.ShapeDtypeStruct(
                (2, *s.shape), s.dtype, sharding=NamedSharding(self.union, _stacked(spec))
            )
            for s, spec in zip(structs, specs, strict=True)
        ]
        return self._program(specs).lower(*stacked)

    @property
    def senders(self) -> int:
        """The source devices that send (all of them, or one row of `staging`)."""
        return len(self._senders)

    def sent_bytes(self, arrays: Sequence[Any], dtypes: Sequence[Any]) -> int:
        """Bytes that cross from the source devices to the target devices: every sending
        device's shard, in the dtype it moves in."""
        total = 0
        for array, dtype in zip(arrays, dtypes, strict=True):
            stacked = NamedSharding(self.union, _stacked(self._spec(array)))
            block = stacked.shard_shape((2, *array.shape))
            total += math.prod(block) * jnp.dtype(dtype).itemsize * self.senders
        return total

    def _spec(self, array: Any) -> PartitionSpec:
        """How `array` moves: its own layout (as many devices), else split over ``shard`` on
        its first dimension that divides (repeated where none does)."""
        if self.staging is not None:
            shard = self.mirror.size
            dim = next((d for d, size in enumerate(array.shape) if size % shard == 0), None)
            if dim is None:
                return PartitionSpec()
            return PartitionSpec(*([None] * dim), SHARD_AXIS)
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
        """[2, ...] over the union mesh: this process's sending shards at role 0, zeros at
        role 1."""
        sharding = NamedSharding(self.union, _stacked(spec))
        shape = (2, *array.shape)
        own = {s.device: s.data for s in array.addressable_shards if s.device in self._senders}
        block = sharding.shard_shape(shape)
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
