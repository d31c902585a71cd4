"""The model's parameters as Hugging Face tensors in memory, for an engine that loads HF weights.

`hf_arrays` gives each parameter under its HF name and in HF layout as a JAX array on one device
(LoRA merged, cast to the engine's dtype); `torch_tensors` hands those arrays to torch through
DLPack, sharing device memory, so nothing passes through the host; `hf_torch_tensors` does both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from jrl.models.weights import base_parameters, hf_parts

if TYPE_CHECKING:
    import torch


def _first_device(array: jax.Array) -> jax.Device:
    return min(array.devices(), key=lambda d: d.id)


def hf_arrays(
    model: nnx.Module,
    *,
    device: jax.Device | None = None,
    dtype: Any = None,
    merge_lora: bool = True,
) -> Iterator[tuple[str, jax.Array]]:
    """(HF name, array) for each base parameter, computed one at a time as it is asked for.

    A kernel with a LoRA adapter comes merged (W + A @ B * alpha / rank) when `merge_lora`, as
    it is stored otherwise (the base weight, for an engine that applies the adapters apart).
    Floating values are cast to `dtype` (kept as they are when None) where they live, then
    gathered whole onto `device` (default: the lowest-numbered device holding the parameter) and
    put in HF layout there (stacked experts: one tensor per expert): device-to-device copies
    only. An array that would still be the parameter's own buffer (same dtype, device and
    layout) is copied, so that a consumer holding it never reads memory that the next update
    donates.
    """
    for path, _, fetch in base_parameters(model, merge_lora=merge_lora):
        parameter = value = fetch()
        if dtype is not None and jnp.issubdtype(value.dtype, jnp.floating):
            value = value.astype(dtype)
        value = jax.device_put(value, device or _first_device(value))
        for name, part in hf_parts(path, value):
            yield name, jnp.copy(part) if _same_buffer(part, parameter) else part


def _same_buffer(a: jax.Array, b: jax.Array) -> bool:
    """Whether `a` is `b` or sits in the memory of one of `b`'s shards."""
    if a is b:
        return True
    pointers = {shard.data.unsafe_buffer_pointer() for shard in b.addressable_shards}
    return a.addressable_shards[0].data.unsafe_buffer_pointer() in pointers


def torch_tensors(named: Iterable[tuple[str, jax.Array]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, array) as (name, torch tensor) sharing the array's memory through DLPack.

    The consumer may copy a tensor asynchronously on torch's current stream; before letting go
    of a tensor (and so of the JAX buffer under it) this waits for that stream, so JAX never
    reuses memory that a pending copy still reads.
    """
    import torch

    previous = None
    for name, array in named:
        tensor = torch.from_dlpack(array)
        _wait_for_torch(previous)
        previous = tensor
        yield name, tensor
    _wait_for_torch(previous)


def hf_torch_tensors(
    model: nnx.Module,
    *,
    device: jax.Device | None = None,
    dtype: Any = None,
    merge_lora: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """`torch_tensors(hf_arrays(model, ...))`: the model as HF-named torch tensors on `device`,
    what an engine's HF weight loader takes."""
    return torch_tensors(hf_arrays(model, device=device, dtype=dtype, merge_lora=merge_lora))


def _wait_for_torch(tensor: torch.Tensor | None) -> None:
    if tensor is not None and tensor.is_cuda:
        import torch

        torch.cuda.current_stream(tensor.device).synchronize()
