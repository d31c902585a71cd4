"""The platform traced code will run on, decided by the ambient mesh's devices."""

from __future__ import annotations

import jax

# JAX's platform names, with CUDA as "gpu".
PLATFORMS = {"cuda": "gpu", "gpu": "gpu", "cpu": "cpu", "tpu": "tpu"}


def platform_name(name: str) -> str:
    """JAX's name for a device platform ('cuda' -> 'gpu'); unknown names pass through."""
    return PLATFORMS.get(name, name)


def mesh_platform() -> str:
    """The platform of the ambient mesh's devices (`jax.set_mesh`, or a `shard_map` body; e.g.
    'tpu' when compiling for a TPU slice from a CPU host), else JAX's default backend. Kernels
    and attention are chosen by it, never by the host alone."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        device = getattr(mesh, "abstract_device", None)
        if device is not None:
            return platform_name(device.platform)
    return jax.default_backend()
