"""One program compiled for the slice: its per-chip memory, the compiler's FLOPs and its
collectives, or, when the TPU compiler refuses it for want of HBM, the bytes it asked for."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import time
from collections.abc import Iterator
from typing import Any

import jax

from jrl.plan.programs import Program

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# The TPU compiler's out-of-memory messages: total used of the capacity, or the temporaries.
_USED = re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm")
_TEMPS = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\)")


@dataclasses.dataclass(frozen=True)
class CompiledProgram:
    """`program` compiled: per-chip bytes by kind (argument, output, temp, alias; their total
    `peak` = argument + output + temp - alias), the compiler's FLOPs (`cost_flops`: a loop body
    counted once, a Pallas kernel as 0), collective counts in its HLO and the compile seconds.
    When the compiler ran out of HBM, `error` says so and `peak` is the bytes it needed."""

    program: Program
    peak: int
    memory: dict[str, int]
    cost_flops: float | None
    collectives: dict[str, int]
    seconds: float
    error: str | None = None

    @property
    def out_of_memory(self) -> bool:
        return self.error is not None


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def needed_bytes(message: str, arguments: int) -> int | None:
    """The per-chip bytes an out-of-memory message says a program needs (its temporaries plus
    `arguments` when only those are named), or None when the message is not one."""
    used = _USED.search(message)
    if used:
        return _bytes(*used.groups()[:2])
    temps = _TEMPS.search(message)
    if temps:
        return _bytes(*temps.groups()) + arguments
    return None


def count_collectives(hlo: str) -> dict[str, int]:
    """How many of each collective op the optimized HLO text holds (async pairs once; an op's
    result type may be a tuple, which holds spaces)."""
    counts = {}
    for name in COLLECTIVES:
        found = len(re.findall(rf" {name}(?:-start)?\(", hlo))
        counts[name] = found
    return counts


# Compiled results by the hash of their lowered program: replanning with a knob that leaves a
# phase unchanged (e.g. remat for the rollout) compiles it once.
_RESULTS: dict[str, CompiledProgram] = {}


def compile_program(program: Program, target: str, local: bool = True) -> CompiledProgram:
    """Lowers and compiles `program` for the devices `target` names (e.g. the slice's topology
    and chip kind: the lowered text alone does not say which chips it is for), once per distinct
    (target, lowered program) in this process; an out-of-memory refusal is a result. For chips
    this process does not drive (`local` False: a TPU topology described from another host) JAX's
    persistent compilation cache is off: what it would store cannot be loaded back without a
    client for those chips."""
    lowered = program.lower()
    key = hashlib.sha256(f"{target}\n{lowered.as_text()}".encode()).hexdigest()
    if key not in _RESULTS:
        with contextlib.nullcontext() if local else _no_persistent_cache():
            _RESULTS[key] = _compile(program, lowered)
    return dataclasses.replace(_RESULTS[key], program=program)


@contextlib.contextmanager
def _no_persistent_cache() -> Iterator[None]:
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


def _compile(program: Program, lowered: Any) -> CompiledProgram:
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as err:  # the TPU compiler reports HBM exhaustion as an XlaRuntimeError
        message = str(err)
        need = needed_bytes(message, program.arguments)
        if need is None:
            raise
        first = message.strip().splitlines()[0][:300]
        return CompiledProgram(program, need, {}, None, {}, time.perf_counter() - start, first)
    stats = compiled.memory_analysis()
    memory = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
    }
    peak = memory["argument"] + memory["output"] + memory["temp"] - memory["alias"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) if cost else None
    collectives = count_collectives(compiled.as_text())
    seconds = time.perf_counter() - start
    return CompiledProgram(program, peak, memory, flops, collectives, seconds)
