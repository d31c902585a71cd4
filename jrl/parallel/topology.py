"""TPU slices by name, as devices the real TPU compiler can target from any host.

A slice is named as JAX writes it (``v5p:4x4x4``), as a Cloud TPU accelerator type
(``v5p-128``, ``v5litepod-16``, ``v6e-64``) or ``local`` (this machine's devices). A TPU name
needs libtpu (``pip install "jax[tpu]"``) but no TPU: `jax.experimental.topologies` describes
the slice's chips, all hosts included, and `jax.jit(...).lower(...).compile()` on them runs
the TPU compiler (Mosaic for Pallas kernels) here.

Chip figures (`CHIPS`) are the usable HBM the TPU compiler reports when a program does not fit,
and the peak dense bf16 FLOP/s, HBM bandwidth and inter-chip interconnect (ICI) bandwidth per
chip from Google Cloud's TPU system architecture pages (v5e, v5p, v6e); they feed estimates only.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip: usable HBM bytes, peak bf16 FLOP/s, HBM bytes/s and the bytes/s it
    can send over its ICI links at once (half the bidirectional figure the pages give)."""

    generation: str
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    ici_send_bandwidth: float


CHIPS = {
    "v5e": Chip("v5e", int(15.75 * GIB), 197e12, 819e9, 400e9 / 2),
    "v5p": Chip("v5p", int(95.74 * GIB), 459e12, 2765e9, 1200e9 / 2),
    "v6e": Chip("v6e", int(31.25 * GIB), 918e12, 1640e9, 800e9 / 2),
}
PEAK_SOURCE = "Google Cloud TPU system architecture pages (v5e, v5p, v6e), dense bf16 per chip"
ICI_SOURCE = (
    "Google Cloud TPU system architecture pages: half the bidirectional ICI bandwidth per chip"
)
# The grids JAX's topology names accept, by chip count (2D for v5e/v6e, 3D for v5p).
_GRIDS_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_GRIDS_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
}
# Cloud accelerator-type prefixes -> (generation, TensorCores per chip in the type's count).
_CLOUD_TYPES = {"v5litepod": ("v5e", 1), "v5e": ("v5e", 1), "v6e": ("v6e", 1), "v5p": ("v5p", 2)}
_EXAMPLES = "v5p:4x4x4, v5e:2x2, v5p-128, v5litepod-16, v6e-64 or local"


@dataclasses.dataclass(frozen=True)
class Slice:
    """The devices of a slice (`chips` of them, possibly of several hosts) and its chip."""

    name: str
    topology: str
    devices: tuple[Any, ...]
    chip: Chip | None

    @property
    def chips(self) -> int:
        return len(self.devices)

    @property
    def hosts(self) -> int:
        return len({d.process_index for d in self.devices})

    @property
    def hbm_bytes(self) -> int | None:
        """Memory per chip: the TPU's usable HBM, a local device's reported limit, or None
        (e.g. CPU devices, which report none)."""
        if self.chip is not None:
            return self.chip.hbm_bytes
        try:
            stats = self.devices[0].memory_stats()
        except Exception:  # a backend without memory statistics
            stats = None
        return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _bad(name: str, why: str) -> ValueError:
    return ValueError(f"--topology={name!r}: {why}; use a name such as {_EXAMPLES}")


def _grids(generation: str) -> dict[int, str]:
    return _GRIDS_3D if generation == "v5p" else _GRIDS_2D


def _grid_chips(grid: str) -> int:
    count = 1
    for part in grid.split("x"):
        count *= int(part)
    return count


def parse_topology(name: str) -> tuple[str, str, int]:
    """(generation, JAX topology name, chips used) of a TPU slice name. One chip (``v5e:1x1``,
    ``v5litepod-1``) is the first chip of the smallest grid (JAX has no 1x1 name)."""
    text = name.strip().lower()
    jax_form = re.fullmatch(r"(v5e|v5p|v6e):(\d+(?:x\d+){1,2})", text)
    if jax_form:
        generation, grid = jax_form.groups()
        chips = _grid_chips(grid)
        grids = _grids(generation)
        if grids.get(chips) != grid and chips != 1:
            known = ", ".join(grids.values())
            raise _bad(name, f"{generation} has no {grid} grid (known: {known})")
        return generation, f"{generation}:{grids[max(chips, 4)]}", chips
    cloud = re.fullmatch(r"(v5litepod|v5e|v5p|v6e)-(\d+)", text)
    if not cloud:
        raise _bad(name, "not a TPU slice name")
    generation, cores_per_chip = _CLOUD_TYPES[cloud.group(1)]
    count = int(cloud.group(2))
    if count % cores_per_chip:
        raise _bad(name, f"{generation} types count {cores_per_chip} TensorCores per chip")
    chips = count // cores_per_chip
    grids = _grids(generation)
    if chips not in grids and chips != 1:
        sizes = ", ".join(f"{cloud.group(1)}-{c * cores_per_chip}" for c in grids)
        raise _bad(name, f"{generation} slices come as {sizes}")
    return generation, f"{generation}:{grids[max(chips, 4)]}", chips


def open_slice(name: str) -> Slice:
    """The devices of slice `name` (see the module docstring); errors say what to install."""
    if name.strip().lower() == "local":
        devices = tuple(jax.devices())
        return Slice("local", "local", devices, None)
    generation, topology, chips = parse_topology(name)
    # Describing a slice only compiles; several such processes may share libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as err:  # libtpu missing or unable to describe the slice
        raise RuntimeError(
            f"--topology={name!r} needs libtpu to compile for a TPU (pip install 'jax[tpu]'; "
            f"no TPU is needed): {type(err).__name__}: {str(err).strip().splitlines()[0]}"
        ) from err
    return Slice(name, topology, tuple(desc.devices[:chips]), CHIPS[generation])


def libtpu_missing() -> str | None:
    """Why TPU slices cannot be described here (libtpu not importable), or None."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return "libtpu is not installed (pip install 'jax[tpu]')"
    return None
