"""Mapping between the model's parameters and Hugging Face tensor names and layouts.

Module attributes carry the HF names (`model.layers.0.self_attn.q_proj`, `lm_head`, `score`), so a
parameter path maps to its HF name by joining the path and renaming the leaf. Linear kernels are
stored [in, out] here and [out, in] in HF files, so they are transposed on the way in and out.
A mixture of experts' stacked weights (`jrl.models.moe.ExpertStack`, [E, in, out] at
``...experts.<name>``) are E HF tensors ``...experts.{e}.<name>.weight`` of [out, in] each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jrl.models.config import ModelConfig
from jrl.models.layers import Linear, LoRAParam

# The parameters of the base model: everything but LoRA adapters.
BASE_PARAMS = nnx.All(nnx.Param, nnx.Not(LoRAParam))
_LEAF_NAMES = {"kernel": "weight", "embedding": "weight", "scale": "weight", "bias": "bias"}


class TensorSpec(NamedTuple):
    """One HF tensor to write: its name, shape, dtype and a function that produces it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    load: Callable[[], np.ndarray]


def hf_name(path: tuple[Any, ...]) -> str:
    """HF tensor name of a parameter path, e.g. ('lm_head', 'kernel') -> 'lm_head.weight'."""
    return ".".join(str(p) for p in path[:-1]) + "." + _LEAF_NAMES[path[-1]]


def is_expert_stack(path: tuple[Any, ...]) -> bool:
    """Whether the parameter at `path` stacks the experts' weights of one kind."""
    return len(path) > 1 and path[-2] == "experts" and path[-1] not in _LEAF_NAMES


def hf_names(path: tuple[Any, ...], shape: tuple[int, ...]) -> list[str]:
    """The HF tensor names of a parameter of `shape`: its own, or one per expert."""
    if not is_expert_stack(path):
        return [hf_name(path)]
    prefix = ".".join(str(p) for p in path[:-1])
    return [f"{prefix}.{expert}.{path[-1]}.weight" for expert in range(shape[0])]


def hf_parts(path: tuple[Any, ...], array: Any) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor in HF layout) of the parameter at `path`: one, or one per expert."""
    if not is_expert_stack(path):
        yield hf_name(path), to_hf_layout(path, array)
        return
    for expert, name in enumerate(hf_names(path, array.shape)):
        yield name, array[expert].T


def to_hf_layout(path: tuple[Any, ...], array: Any) -> Any:
    """The parameter at `path` in HF layout: kernels transposed to [out, in], the rest as is."""
    return array.T if path[-1] == "kernel" else array


def _hf_shape(path: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[::-1]) if path[-1] == "kernel" else tuple(shape)


def base_parameters(
    model: nnx.Module, *, merge_lora: bool = True
) -> Iterator[tuple[tuple[Any, ...], Any, Callable[[], Any]]]:
    """(path, stored value, fetch) of each base parameter (no LoRA adapters); `fetch()` gives its
    value with the layer's adapter merged in when it has one and `merge_lora` (W + A @ B *
    alpha / rank, computed on its device), the stored value otherwise."""
    adapted = {
        path: module
        for path, module in nnx.iter_modules(model)
        if merge_lora and isinstance(module, Linear) and module.has_adapter
    }
    for path, var in nnx.to_flat_state(nnx.state(model, BASE_PARAMS)):
        value = var.get_value()
        layer = adapted.get(path[:-1]) if path[-1] == "kernel" else None
        fetch = layer.merged_kernel if layer is not None else (lambda value=value: value)
        yield path, value, fetch


def hf_tensor_specs(model: nnx.Module) -> list[TensorSpec]:
    """The model's parameters as HF tensors (fetched to host only when `load` is called).

    A layer with a LoRA adapter is written as one plain kernel, W + A @ B * alpha / rank, merged
    on its device when fetched.
    """
    specs = []
    for path, value, fetch in base_parameters(model):
        if is_expert_stack(path):  # one tensor per expert, sliced on its device
            names, shape = hf_names(path, value.shape), tuple(value.shape[1:][::-1])
            specs += [
                TensorSpec(
                    name,
                    shape,
                    np.dtype(value.dtype),
                    lambda e=e, fetch=fetch: np.asarray(jax.device_get(fetch()[e])).T,
                )
                for e, name in enumerate(names)
            ]
            continue
        specs.append(
            TensorSpec(
                hf_name(path),
                _hf_shape(path, value.shape),
                np.dtype(value.dtype),
                lambda path=path, fetch=fetch: np.asarray(
                    to_hf_layout(path, jax.device_get(fetch()))
                ),
            )
        )
    return specs


def initial_score_head(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """HF-layout tensors of a fresh value head: weight [1, D] ~ N(0, initializer_range), bias 0."""
    key = jax.random.key(seed)
    weight = config.initializer_range * jax.random.normal(key, (1, config.hidden_size), jnp.float32)
    return {"score.weight": np.asarray(weight), "score.bias": np.zeros((1,), np.float32)}
