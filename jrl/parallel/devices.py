"""The backend a run asks for (``trainer.device``) against the one JAX runs on."""

from __future__ import annotations

import jax

from jrl_kernels.platform import PLATFORMS as BACKENDS
from jrl_kernels.platform import mesh_platform

__all__ = ["BACKENDS", "check_device", "mesh_platform"]


def check_device(wanted: str) -> None:
    """`wanted` (``trainer.device``) must name the backend JAX runs on."""
    backend = jax.default_backend()
    if BACKENDS.get(wanted) != backend:
        raise ValueError(
            f"trainer.device={wanted!r} but JAX runs on {backend!r}; set trainer.device="
            f"{'cuda' if backend == 'gpu' else backend} "
            "(or install the matching extra, e.g. jrl[cuda])"
        )
