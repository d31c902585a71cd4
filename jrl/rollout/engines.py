"""The one registry of rollout engines: every name ``rollout.name`` may take, as a descriptor of
how jrl serves it (no JAX here, so the resolver and the notice ask it without building engines).

An engine of jrl's own (`Engine.builder`, imported only when an engine is built) generates where
it can serve the run's host (`Engine.cannot_serve`); elsewhere, and for the names of verl's
engines that jrl does not have (``sglang``, ``hf``: verl's Hugging Face ``generate()``
rollout), jrl's JAX sampler (`FALLBACK`) generates with the same sampling keys, announced in one
line. The keys only an engine reads (`Engine.only_keys`) have no effect where it does not
generate (`jrl.runspec.effects`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from jrl.rollout import vllm_platform
from jrl.rollout.spec import RolloutSpec
from jrl.rollout.vllm_args import VLLM_PASS_THROUGH, VLLM_TEMPERATURES, engine_sizes

FALLBACK = "jax"


def _importable(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


@dataclasses.dataclass(frozen=True)
class Host:
    """Where a run generates: the devices' platform (cpu, gpu, tpu), how many of the run's devices
    this process holds, how many processes run, which packages are installed, and the device type
    of vLLM's own platform (asked only when vLLM could otherwise serve)."""

    platform: str
    local_devices: int = 1
    processes: int = 1
    installed: Callable[[str], bool] = _importable
    vllm_device: Callable[[], str] = vllm_platform.vllm_device


def _serves_anywhere(spec: RolloutSpec, host: Host) -> str | None:
    return None


# The platforms of JAX's devices that jrl's vllm engine shares, with the device type vLLM's own
# platform must have there (vLLM's ROCm platform is 'cuda' too).
_VLLM_DEVICE = {"cpu": "cpu", "gpu": "cuda"}


def _vllm_limits(spec: RolloutSpec, host: Host) -> str | None:
    """Why the in-process vLLM engine cannot serve: it runs beside JAX on the CPU or on one GPU
    (not a TPU), in one process, as one engine (tensor, data and pipeline parallel sizes 1), and
    where vLLM's own platform is those devices'. XLA's host devices (e.g. 8 forced ones) are one
    CPU, which vLLM serves whole: a CPU mesh of any size is served, its weights gathered."""
    wanted = _VLLM_DEVICE.get(host.platform)
    if wanted is None:
        return f"jrl's vllm engine runs on a CPU or a GPU, not on {host.platform}"
    if host.processes > 1:
        return f"the vllm engine runs in one process ({host.processes} processes here)"
    if host.platform == "gpu" and host.local_devices > 1:
        return f"the vllm engine serves one GPU in one process ({host.local_devices} devices here)"
    for key, size in engine_sizes(spec).items():
        if size != 1:
            return f"{key}={size} needs several vLLM engine processes"
    try:
        device = host.vllm_device()
    except RuntimeError as error:
        libtpu = "tpu" in str(error)
        hint = "; vLLM takes an installed libtpu (jax[tpu]) for a TPU" if libtpu else ""
        return f"vLLM cannot tell its platform here ({error}{hint})"
    if device != wanted:
        return f"the installed vLLM runs on {device or 'no platform'}, the run on {host.platform}"
    return None


@dataclasses.dataclass(frozen=True)
class Engine:
    """One value of ``rollout.name``.

    `builder` is ``"module:name"`` of what builds jrl's engine (a `jrl.rollout.Rollout`), called
    as ``builder(model, spec, *, pad_token_id, eos_token_ids, mesh)``; None where jrl has none
    and the JAX sampler serves the name. `package` must be installed for it to run, and `limits`
    says why it cannot serve a run on a host (None: it can). `only_keys` are the keys of the
    rollout section that only this engine reads (``*`` matches any part), named by the notice
    where another engine generates, with `label` as the engine's name there. `temperatures` is
    the range (low, high) of non-zero sampling temperatures the engine honours (None: any).
    """

    name: str
    label: str
    builder: str | None = None
    package: str | None = None
    limits: Callable[[RolloutSpec, Host], str | None] = _serves_anywhere
    only_keys: tuple[str, ...] = ()
    temperatures: tuple[float, float] | None = None

    def cannot_serve(self, spec: RolloutSpec, host: Host) -> str | None:
        """Why this engine cannot generate for `spec` on `host` (None when it can)."""
        if self.builder is None:
            return f"jrl has no {self.label} engine"
        if self.package is not None and not host.installed(self.package):
            return f"{self.package} is not installed"
        return self.limits(spec, host)

    def build(self) -> Callable[..., Any]:
        """What builds jrl's engine of this name (its module imported now)."""
        if self.builder is None:
            raise ValueError(
                f"rollout.name={self.name} has no engine of its own: jrl's JAX sampler serves it "
                "(serving picks the engine that generates)"
            )
        module, _, path = self.builder.partition(":")
        return functools.reduce(getattr, path.split("."), importlib.import_module(module))


ENGINES = {
    engine.name: engine
    for engine in (
        Engine("jax", "jrl's JAX sampler", "jrl.rollout.jax_rollout:JaxRollout.from_spec"),
        Engine(
            "vllm",
            "vLLM",
            "jrl.rollout.vllm_rollout:VllmRollout.from_spec",
            package="vllm",
            limits=_vllm_limits,
            only_keys=(
                *(key for key in VLLM_PASS_THROUGH if key != "logprobs_mode"),
                "enforce_eager",
                "load_format",
                "layered_summon",
                "cudagraph_capture_sizes",
                "max_model_len",
                "data_parallel_size",
                "pipeline_model_parallel_size",
                "engine_kwargs.vllm.*",
            ),
            temperatures=VLLM_TEMPERATURES,
        ),
        Engine(
            "sglang",
            "sglang",
            only_keys=("over_sample_rate", "multi_stage_wake_up", "engine_kwargs.sglang.*"),
        ),
        Engine("hf", "Hugging Face generate()"),
    )
}


def engine(name: str) -> Engine:
    """The descriptor of ``rollout.name=name``; an unknown name lists the known ones."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(
            f"rollout.name={name!r} is unknown; choose one of {', '.join(ENGINES)}"
        ) from None


def serving(spec: RolloutSpec, host: Host) -> tuple[str, str | None]:
    """(the engine that generates for `spec` on `host`, why the named one cannot, or None)."""
    why = engine(spec.engine).cannot_serve(spec, host)
    return (FALLBACK, why) if why else (spec.engine, None)
