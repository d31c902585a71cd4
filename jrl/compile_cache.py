"""JAX's persistent compilation cache, on by default under jrl's cache folder.

A second run of the same experiment then loads its compiled programs instead of compiling them
again. ``JRL_COMPILATION_CACHE`` picks another folder, or ``off`` turns the cache off.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from jrl.assets import cache_dir

ENV = "JRL_COMPILATION_CACHE"


def enable_compilation_cache() -> Path | None:
    """Points JAX's persistent cache at ``$JRL_COMPILATION_CACHE`` (default
    ``<jrl cache>/jax_compilation``) and caches every program; returns the folder, or None when
    the variable is ``off``."""
    setting = os.environ.get(ENV, "")
    if setting.lower() in ("off", "0", "false", "none"):
        return None
    folder = Path(setting).expanduser() if setting else cache_dir() / "jax_compilation"
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
