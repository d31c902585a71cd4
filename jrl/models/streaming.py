"""Streaming Hugging Face tensors into a model's parameters, one tensor at a time.

A tensor is read in blocks of rows (an eighth of it, within 1..16 MiB; the file is mapped for one
block at a time), transposed and cast into a host buffer that holds one device's shard (the whole
tensor without a mesh), copied to that device and dropped (a CPU device adopts the buffer instead).
Host memory therefore stays within about one tensor (one shard of it on a mesh) above the model
itself, and never holds the whole checkpoint.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jrl.models.weights import hf_name, hf_names, is_expert_stack
from jrl.parallel.sharding import param_shardings

MIN_BLOCK_BYTES, MAX_BLOCK_BYTES = 1024**2, 16 * 1024**2
# Linear kernels are [in, out] here and [out, in] in HF files (see jrl.models.weights).
_TRANSPOSED_LEAF = "kernel"


class ArraySource(Protocol):
    """A tensor in HF layout that can be read region by region (a numpy array is one)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray: ...


def row_blocks(
    shape: tuple[int, ...], itemsize: int, start: int = 0, stop: int | None = None
) -> Iterator[slice]:
    """Slices of dimension 0 covering rows start..stop of an array of `shape`, each about an eighth
    of the array, within `MIN_BLOCK_BYTES`..`MAX_BLOCK_BYTES` (and at least one row)."""
    stop = shape[0] if stop is None else stop
    row_bytes = max(1, math.prod(shape[1:]) * itemsize)
    block_bytes = min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, row_bytes * shape[0] // 8))
    rows = max(1, block_bytes // row_bytes)
    for first in range(start, stop, rows):
        yield slice(first, min(first + rows, stop))


def _host_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array; from `MIN_BLOCK_BYTES` up, in its own page-aligned anonymous memory
    map, which is handed back to the OS as soon as it is freed (malloc may keep freed large blocks,
    which then add up across tensors) and which a CPU device can adopt without a copy."""
    count = math.prod(shape)
    if count * dtype.itemsize < MIN_BLOCK_BYTES:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, count * dtype.itemsize), dtype, count).reshape(shape)


def read_region(
    source: ArraySource, index: tuple[slice, ...], transposed: bool, dtype: np.dtype
) -> np.ndarray:
    """The region `index` (in parameter layout) of an HF-layout tensor, in parameter layout and
    `dtype`, read block by block into one new buffer."""
    hf_index = index[::-1] if transposed else index
    if not hf_index:
        return np.asarray(source[()], dtype)
    bounds = [s.indices(n)[:2] for s, n in zip(hf_index, source.shape, strict=True)]
    sizes = [stop - start for start, stop in bounds]
    out = _host_buffer(tuple(sizes[::-1] if transposed else sizes), dtype)
    start, stop = bounds[0]
    for rows in row_blocks(source.shape, source.dtype.itemsize, start, stop):
        block = source[(rows, *hf_index[1:])]
        local = slice(rows.start - start, rows.stop - start)
        if transposed:
            out[..., local] = block.T
        else:
            out[local] = block
    return out


def _place(
    source: ArraySource,
    transposed: bool,
    shape: tuple[int, ...],
    dtype: np.dtype,
    sharding: NamedSharding | None,
) -> jax.Array:
    """One parameter on the default device, or laid out by `sharding` shard by shard.

    Each copy to a device is waited for, so that one host buffer at most is alive at a time.
    """
    if sharding is None:
        whole = tuple(slice(0, n) for n in shape)
        return jax.device_put(read_region(source, whole, transposed, dtype)).block_until_ready()
    devices_of: dict[tuple[tuple[int, int], ...], list[Any]] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        devices_of.setdefault(bounds, []).append(device)
    shards = {}
    for bounds, devices in devices_of.items():
        host = read_region(source, tuple(slice(*b) for b in bounds), transposed, dtype)
        placed = jax.block_until_ready([jax.device_put(host, device) for device in devices])
        shards.update(zip(devices, placed, strict=True))
    ordered = [shards[device] for device in sharding.addressable_devices_indices_map(shape)]
    return jax.make_array_from_single_device_arrays(shape, sharding, ordered)


class StackedExperts:
    """E HF tensors [out, in] (one per expert) read as one [E, in, out] parameter."""

    def __init__(self, sources: list[ArraySource]):
        self.sources = sources
        out, inner = sources[0].shape
        self.shape = (len(sources), inner, out)
        self.dtype = np.dtype(sources[0].dtype)

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        experts, inner, out = index
        picked = range(*experts.indices(len(self.sources)))
        return np.stack([np.asarray(self.sources[e][out, inner]).T for e in picked])


def _load_leaf(
    path: tuple[Any, ...],
    expected: jax.ShapeDtypeStruct,
    tensors: Mapping[str, ArraySource],
    where: str,
    sharding: NamedSharding | None,
) -> jax.Array:
    shape = tuple(expected.shape)
    if is_expert_stack(path):
        names = hf_names(path, shape)
        for name in names:
            if tuple(tensors[name].shape) != shape[1:][::-1]:
                raise ValueError(
                    f"{where}: tensor {name} has shape {tuple(tensors[name].shape)}, but "
                    f"config.json implies {shape[1:][::-1]}"
                )
        stacked = StackedExperts([tensors[name] for name in names])
        return _place(stacked, False, shape, np.dtype(expected.dtype), sharding)
    name = hf_name(path)
    transposed = path[-1] == _TRANSPOSED_LEAF
    hf_shape = shape[::-1] if transposed else shape
    source = tensors[name]
    if tuple(source.shape) != hf_shape:
        raise ValueError(
            f"{where}: tensor {name} has shape {tuple(source.shape)}, but config.json implies "
            f"{hf_shape}"
        )
    return _place(source, transposed, shape, np.dtype(expected.dtype), sharding)


def stream_params(
    abstract_model: nnx.Module,
    tensors: Mapping[str, ArraySource],
    where: str,
    mesh: Mesh | None = None,
) -> nnx.Module:
    """Fills an abstract model (from `nnx.eval_shape`) with HF-layout tensors, one at a time.

    Each parameter is cast to its dtype in the abstract model and placed on the default device, or
    as `param_shardings(state, mesh)` lays it out when a mesh is given. Raises KeyError naming
    every missing tensor and ValueError on a shape mismatch; `where` names the checkpoint in
    messages.
    """
    graphdef, state = nnx.split(abstract_model)
    leaves = list(nnx.to_flat_state(state))
    needed = [name for path, var in leaves for name in hf_names(path, var.get_value().shape)]
    missing = [name for name in needed if name not in tensors]
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        )
        raise KeyError(
            f"{where}: the checkpoint lacks {len(missing)} tensor(s) the model needs: {shown}. "
            "Check that config.json matches the weights (e.g. tie_word_embeddings, attention_bias)."
        )
    placed = nnx.to_flat_state(state if mesh is None else param_shardings(state, mesh))
    shardings = {path: None if mesh is None else var.get_value() for path, var in placed}
    filled = [
        (path, var.replace(_load_leaf(path, var.get_value(), tensors, where, shardings[path])))
        for path, var in leaves
    ]
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
