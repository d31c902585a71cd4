"""The backend a run asks for (``trainer.device``) against the one JAX runs on."""

from __future__ import annotations

from typing import Any

import jax

BACKENDS = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}


def check_device(config: Any) -> None:
    """`trainer.device` must name the backend JAX runs on."""
    wanted = str(config.trainer.device)
    backend = jax.default_backend()
    if BACKENDS.get(wanted) != backend:
        raise ValueError(
            f"trainer.device={wanted!r} but JAX runs on {backend!r}; set trainer.device="
            f"{'cuda' if backend == 'gpu' else backend} "
            "(or install the matching extra, e.g. jrl[cuda])"
        )


def mesh_platform() -> str:
    """The platform the code being traced will run on: that of the ambient mesh's devices
    (`jax.set_mesh`; e.g. 'tpu' when compiling for a TPU slice from a CPU host), else JAX's
    default backend. Kernels and attention are chosen by it, never by the host alone."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        device = getattr(mesh, "abstract_device", None)
        if device is not None:
            return BACKENDS.get(device.platform, device.platform)
    return jax.default_backend()
