"""The per-chip memory plan: what every role keeps on each chip between phases (resident states)
plus each phase's compiled peak, against the chip's HBM.

A phase's total is its largest program's peak (arguments + outputs + temporaries - donated
aliases; its own role's states are among its arguments) plus the resident states of every other
role still in device memory: offloaded states (``param_offload`` / ``optimizer_offload``) count
only in the phases that fetch them, and the rollout's KV cache only while generating unless
``free_cache_engine`` is off. The rollout plans its KV cache for ``gpu_memory_utilization`` of
what the resident states leave free, as it does on a real chip.

A split run (``hybrid_engine=False``) keeps two meshes: each state and phase names the one whose
chips hold it (`TRAINER`, `ROLLOUT`), and a phase counts only the states of its own mesh; the
rollout's chips hold its weights and KV cache alone. Its weight sync (`jrl.plan.sync`) is one
more phase, ``update_weights``, on both: its largest bucket's peak plus the larger side's states.

Times are estimates, labelled so: a roofline lower bound per phase, the largest of its analytic
FLOPs over the slice's peak FLOP/s, its weight reads over the chip's HBM bandwidth and its sends
over the chip's ICI bandwidth. A split run's rollout overlaps the trainer's phases.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from jrl.parallel.topology import ICI_SOURCE, PEAK_SOURCE, Slice
from jrl.plan.compiled import COLLECTIVES, CompiledProgram, compile_program
from jrl.plan.programs import PHASES, per_chip_bytes, step_programs
from jrl.plan.roles import Roles, build_roles
from jrl.plan.sync import SYNC_PHASE, SyncPlan, plan_sync
from jrl.rollout.limits import ceil_pow2
from jrl.trainer.io.flops import peak_flops

# The resident states each phase takes as its own arguments.
PHASE_STATES = {
    "rollout": ("rollout weights", "rollout KV cache"),
    "old_log_prob": ("actor params",),
    "ref": ("reference params",),
    "values": ("critic params",),
    "update_critic": ("critic params", "critic optimizer"),
    "update_actor": ("actor params", "actor optimizer"),
    SYNC_PHASE: (),
}
TRAINER, ROLLOUT = "trainer", "rollout"


@dataclasses.dataclass(frozen=True)
class State:
    """A resident state: its per-chip bytes in device memory between phases (0 when offloaded)
    and wherever it lives (`total`), on the chips of `mesh` (`TRAINER` or `ROLLOUT`)."""

    name: str
    device: int
    total: int
    mesh: str = TRAINER


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    """One phase: its programs compiled, its per-chip `total` (peak + other residents), its
    analytic FLOPs and estimated seconds, and the meshes whose chips run it."""

    phase: str
    programs: tuple[CompiledProgram, ...]
    peak: int
    others: int
    flops: float
    seconds: float
    bound: str
    meshes: tuple[str, ...] = (TRAINER,)

    @property
    def total(self) -> int:
        return self.peak + self.others

    @property
    def collectives(self) -> dict[str, int]:
        return {c: sum(p.collectives.get(c, 0) for p in self.programs) for c in COLLECTIVES}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The slice, the resident states, every phase and the notes of one run's plan; a split
    run's weight sync (`sync`, None when colocated)."""

    where: Slice
    hbm: int | None
    states: tuple[State, ...]
    phases: tuple[PhasePlan, ...]
    notes: tuple[str, ...]
    peak_flops: float | None
    sync: SyncPlan | None = None

    @property
    def worst(self) -> PhasePlan:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        """Every phase within the chip's memory (True where no limit is known)."""
        if self.hbm is None:
            return True
        return all(p.total <= self.hbm and not _refused(p) for p in self.phases)

    @property
    def over(self) -> int:
        """Bytes the worst phase needs beyond the chip's memory (<= 0 when it fits; 0 where no
        limit is known)."""
        return 0 if self.hbm is None else self.worst.total - self.hbm

    @property
    def step_seconds(self) -> float:
        """The phases in turn; a split run's rollout runs while the trainer's phases do (one
        step off), then the weights sync."""
        if self.sync is None:
            return sum(p.seconds for p in self.phases)
        seconds = {p.phase: p.seconds for p in self.phases}
        rollout, sync = seconds.pop("rollout", 0.0), seconds.pop(SYNC_PHASE, 0.0)
        return max(rollout, sum(seconds.values())) + sync

    @property
    def sync_phase(self) -> PhasePlan | None:
        """A split run's ``update_weights`` phase (None when colocated)."""
        return next((p for p in self.phases if p.phase == SYNC_PHASE), None)

    def mesh_worst(self, mesh: str) -> PhasePlan:
        """The phase that takes the most of a chip of `mesh` (the sync, on both, excluded)."""
        return max((p for p in self.phases if p.meshes == (mesh,)), key=lambda p: p.total)


def _refused(phase: PhasePlan) -> bool:
    return any(p.out_of_memory for p in phase.programs)


def resident_states(roles: Roles) -> list[State]:
    """Every role's states per chip (see the module docstring), the KV cache excluded."""
    actor = roles.actor.learner

    def state(name: str, *trees: Any) -> State:
        device = sum(per_chip_bytes(t) for t in trees)
        return State(name, device, sum(per_chip_bytes(t, None) for t in trees))

    states = [
        state("actor params", actor.trainable, actor.frozen),
        state("actor optimizer", actor.opt_state),
    ]
    if roles.ref is not None and roles.ref.spec.model is not None:  # with LoRA: the actor's base
        states.append(state("reference params", roles.ref.stored))
    if roles.critic is not None:
        critic = roles.critic.learner
        states.append(state("critic params", critic.trainable, critic.frozen))
        states.append(state("critic optimizer", critic.opt_state))
    rollout = state("rollout weights", roles.rollout.state)
    states.append(dataclasses.replace(rollout, mesh=rollout_mesh(roles)))
    return states


def rollout_mesh(roles: Roles) -> str:
    """The mesh whose chips hold the rollout: its own in a split run, else the trainer's."""
    return TRAINER if roles.transfer is None else ROLLOUT


def _estimate(
    flops: float, reads: float, sends: float, chips: int, where: Slice, peak: float | None
) -> tuple[float, str]:
    """(seconds, which bound) of the roofline lower bound of work on `chips` chips."""
    bounds = {
        "compute": flops / (chips * peak) if peak else 0.0,
        "HBM": reads / where.chip.hbm_bandwidth if where.chip else 0.0,
        "ICI": sends / where.chip.ici_send_bandwidth if where.chip else 0.0,
    }
    bound = max(bounds, key=bounds.__getitem__)
    return bounds[bound], bound


def _phase_meshes(phase: str, roles: Roles) -> tuple[str, ...]:
    if phase == SYNC_PHASE:
        return (TRAINER, ROLLOUT)
    return (rollout_mesh(roles),) if phase == "rollout" else (TRAINER,)


def _others(own: tuple[str, ...], meshes: tuple[str, ...], states: list[State]) -> int:
    """The most any chip of `meshes` keeps of the states other than `own`."""
    return max(sum(s.device for s in states if s.mesh == m and s.name not in own) for m in meshes)


def plan_kv_cache(
    roles: Roles, config: Any, hbm: int | None, slots: int | None = None
) -> str | None:
    """Gives the rollout the free bytes its KV cache is planned in: what the resident states
    leave of `hbm`, or room for `slots` sequences of the widest prompts when given (to plan a
    shallow copy of a deep model with the deep one's slots); a note when nothing is left. With
    no known limit (`hbm` None) the engine measures its devices itself."""
    rollout = roles.rollout
    if hbm is None and slots is None:
        return "no memory limit is known for these devices: per-chip figures only"
    hbm = hbm or 0
    util = rollout.limits.gpu_memory_utilization
    one_slot = rollout.slot_bytes(int(config.data.max_prompt_length), roles.sampling)
    side = rollout_mesh(roles)
    free = hbm - sum(s.device for s in resident_states(roles) if s.mesh == side)
    note = None
    if slots is not None:
        free = math.ceil(slots * one_slot / util)
    elif util * free < one_slot:
        note = "the resident states leave no room for the KV cache: planned with one slot"
        free = math.ceil(one_slot / util)
    rollout.assume_free_bytes(free)
    return note


def rollout_slots(roles: Roles, config: Any) -> int:
    """Slots per replica the rollout plans for the widest prompt bucket of a training step."""
    rollout = roles.rollout
    rows = int(config.data.train_batch_size) * int(roles.sampling.n)
    replicas = rollout.mesh.shape["data"] * rollout.mesh.shape["fsdp"]
    per_replica = ceil_pow2(math.ceil(rows / replicas))
    return rollout.plan(per_replica, int(config.data.max_prompt_length), roles.sampling).slots


def plan_phases(
    roles: Roles,
    config: Any,
    where: Slice,
    largest_bucket_only: bool = False,
    progress: Callable[[str], None] | None = None,
    kv_slots: int | None = None,
) -> Plan:
    """Compiles every program of `config`'s step for `where` and assembles the plan (the KV
    cache planned as `plan_kv_cache` says)."""
    hbm = where.hbm_bytes
    states = resident_states(roles)
    notes = list(roles.notes)
    note = plan_kv_cache(roles, config, hbm, kv_slots)
    if note:
        notes.append(note)
    kept_cache = not roles.rollout.limits.free_cache_engine
    programs = step_programs(roles, config, largest_bucket_only)
    sync = None
    if roles.transfer is not None:
        sync, program = plan_sync(roles)
        programs.append(program)
    peak = peak_flops(where.devices[0].device_kind)
    compiled: dict[str, list[CompiledProgram]] = {}
    for number, program in enumerate(programs, 1):
        if progress:
            progress(f"compiling {number}/{len(programs)}: {program.phase} ({program.label})")
        target = f"{where.topology} {where.chips} {where.devices[0].device_kind}"
        local = where.topology == "local"
        compiled.setdefault(program.phase, []).append(compile_program(program, target, local))
    cache = max(
        (c.program.arguments - per_chip_bytes(roles.rollout.state) for c in compiled["rollout"]),
        default=0,
    )
    kv = State("rollout KV cache", cache if kept_cache else 0, cache, rollout_mesh(roles))
    all_states = [*states, kv]
    phases = []
    for phase in PHASES:
        if phase not in compiled:
            continue
        own = PHASE_STATES[phase]
        if phase == "ref" and not any(s.name == "reference params" for s in states):
            own = ("actor params",)  # with LoRA the reference is the actor's base
        meshes = _phase_meshes(phase, roles)
        others = _others(own, meshes, all_states)
        flops = max(c.program.flops for c in compiled[phase])
        reads = max(c.program.weight_reads for c in compiled[phase])
        sends = max(c.program.ici_sends for c in compiled[phase])
        chips = roles.rollout.mesh.size if meshes == (ROLLOUT,) else roles.mesh.size
        seconds, bound = _estimate(flops, reads, sends, chips, where, peak)
        top = max(c.peak for c in compiled[phase])
        programs_of = tuple(compiled[phase])
        phases.append(PhasePlan(phase, programs_of, top, others, flops, seconds, bound, meshes))
    notes.append(f"peak FLOP/s and HBM bandwidth: {PEAK_SOURCE}")
    if sync is not None:
        notes.append(f"ICI send bandwidth: {ICI_SOURCE}")
    return Plan(where, hbm, tuple(all_states), tuple(phases), tuple(notes), peak, sync)


def make_plan(
    config: Any,
    where: Slice,
    largest_bucket_only: bool = False,
    progress: Callable[[str], None] | None = None,
    kv_slots: int | None = None,
) -> Plan:
    """The plan of `config` on the slice `where` (roles built from config.json alone)."""
    roles = build_roles(config, where)
    return plan_phases(roles, config, where, largest_bucket_only, progress, kv_slots)
