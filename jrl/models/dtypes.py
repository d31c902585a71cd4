"""jnp dtypes by the names configs give them (``fsdp_config.dtype``, ``rollout.dtype``, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

from jrl.parallel.devices import mesh_platform

if TYPE_CHECKING:
    from jrl.models.kv_layout import KVLayout

DTYPES = {
    "float32": jnp.float32,
    "fp32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
}


def parse_dtype(name: str) -> Any:
    """The jnp dtype of a config string such as 'bfloat16' or 'fp32'."""
    try:
        return DTYPES[str(name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def product_dtype() -> Any:
    """The result dtype to ask of a matrix product of 16-bit operands: float32 on a CPU, else
    None (the operands' dtype). Either way the product accumulates in float32 and rounds once;
    XLA:CPU runs it on the matrix units (AMX) only when the float32 result is asked for (bf16
    [128, 576] @ [576, 1536]: 1384 against 221 GFLOP/s). Elsewhere a float32 result would make
    the backward pass multiply in float32."""
    return jnp.float32 if mesh_platform() == "cpu" else None


def cache_dtype(layout: KVLayout, dtype: Any) -> jnp.dtype:
    """The KV cache buffers' dtype for values computed in `dtype`: float32 for a 16-bit float
    where `layout.float32_storage` (the same values, held wider), else `dtype`."""
    dtype = jnp.dtype(dtype)
    half = dtype.itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
    return jnp.dtype(jnp.float32) if layout.float32_storage and half else dtype
