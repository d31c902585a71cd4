"""jnp dtypes by the names configs give them (``fsdp_config.dtype``, ``rollout.dtype``, ...)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

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
