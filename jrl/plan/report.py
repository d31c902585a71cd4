"""A plan as a readable table and as JSON (`python -m jrl.compile --json`)."""

from __future__ import annotations

from typing import Any

from jrl.parallel.topology import GIB
from jrl.plan.compiled import COLLECTIVES
from jrl.plan.memory import ROLLOUT, TRAINER, Plan
from jrl.plan.sync import id_ranges


def gib(n: float) -> str:
    """Bytes as GiB, with three decimals below 1 GiB (tiny models)."""
    return f"{n / GIB:.2f}" if abs(n) >= GIB else f"{n / GIB:.3f}"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def as_table(plan: Plan) -> str:
    """The resident states, each phase's per-chip total against the HBM, FLOPs, the estimated
    time and the collectives, then the verdict."""
    where = plan.where
    lines = [
        f"jrl.compile: {where.name} = {where.topology}, {where.chips} chips on {where.hosts} "
        f"host(s), {where.devices[0].device_kind}, {_memory(plan)} per chip",
        "",
        "resident per chip (GiB)   device   (all memory)",
    ]
    for s in plan.states:
        mesh = f"   on the {s.mesh}'s chips" if plan.sync else ""
        lines.append(f"  {s.name:<22}{gib(s.device):>8}   ({gib(s.total)}){mesh}")
    lines += [
        "",
        f"{'phase':<14}{'programs':>9}{'peak':>9}{'+others':>9}{'total':>9}{'of HBM':>8}"
        f"{'TFLOP':>10}{'est. time':>12}  bound    collectives",
    ]
    for p in plan.phases:
        share = f"{p.total / plan.hbm:.0%}" if plan.hbm else "-"
        calls = " ".join(f"{k}:{v}" for k, v in p.collectives.items() if v)
        refused = " (compiler: out of HBM)" if any(c.out_of_memory for c in p.programs) else ""
        lines.append(
            f"{p.phase:<14}{len(p.programs):>9}{gib(p.peak):>9}{gib(p.others):>9}"
            f"{gib(p.total):>9}{share:>8}{p.flops / 1e12:>10.2f}{_seconds(p.seconds):>12}"
            f"  {p.bound:<8} {calls or '-'}{refused}"
        )
    lines += split_lines(plan)
    lines += [
        "",
        f"step time, estimated (roofline lower bound): {_seconds(plan.step_seconds)}; FLOPs are "
        "analytic (verl's count); GiB from the compiler's memory analysis",
        *(f"note: {n}" for n in plan.notes),
        "",
        verdict(plan),
    ]
    return "\n".join(lines)


def split_lines(plan: Plan) -> list[str]:
    """A split run's meshes: each host's chips, each mesh's largest phase per chip, the sync."""
    sync, phase = plan.sync, plan.sync_phase
    if sync is None or phase is None:
        return []
    lines = ["", "split meshes (actor_rollout_ref.hybrid_engine=False), chips by id:"]
    for host, (trainer, rollout) in sync.hosts.items():
        lines.append(f"  host {host}: trainer {id_ranges(trainer)}; rollout {id_ranges(rollout)}")
    for mesh in (TRAINER, ROLLOUT):
        worst = plan.mesh_worst(mesh)
        share = f", {worst.total / plan.hbm:.0%} of HBM" if plan.hbm else ""
        lines.append(
            f"  {mesh} mesh per chip: {gib(worst.total)} GiB at most ({worst.phase}{share})"
        )
    lines.append(
        f"  weight sync: {_size(sync.sent)} per sync ({_size(sync.per_chip)} from each trainer "
        f"chip) in {sync.buckets} bucket(s), the largest {_size(sync.largest)}; "
        f"est. {_seconds(phase.seconds)} at {_ici(plan)} per chip (lower bound)"
    )
    return lines


def _size(n: int) -> str:
    return f"{gib(n)} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"


def _ici(plan: Plan) -> str:
    chip = plan.where.chip
    return "unknown ICI bandwidth" if chip is None else f"{chip.ici_send_bandwidth / 1e9:.0f} GB/s"


def _memory(plan: Plan) -> str:
    return "memory limit unknown" if plan.hbm is None else f"{gib(plan.hbm)} GiB HBM"


def verdict(plan: Plan) -> str:
    """The last line: fits (and by how much) or does not fit (the phase and the bytes over)."""
    worst = plan.worst
    if plan.hbm is None:
        return f"the largest phase ({worst.phase}) takes {gib(worst.total)} GiB per device"
    if plan.fits:
        return (
            f"fits: the largest phase ({worst.phase}) takes {gib(worst.total)} of "
            f"{gib(plan.hbm)} GiB per chip"
        )
    return (
        f"does not fit: {worst.phase} needs {gib(worst.total)} GiB per chip, "
        f"{gib(plan.over)} GiB over the {gib(plan.hbm)} GiB of HBM"
    )


def as_json(plan: Plan, advice: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every figure of the plan (bytes per chip, FLOPs, seconds), the verdict and the advice."""
    where = plan.where
    return {
        "topology": where.name,
        "jax_topology": where.topology,
        "chips": where.chips,
        "hosts": where.hosts,
        "device_kind": where.devices[0].device_kind,
        "hbm_bytes": plan.hbm,
        "fits": plan.fits,
        "over_bytes": plan.over,
        "worst_phase": plan.worst.phase,
        "step_seconds_estimate": plan.step_seconds,
        "peak_flops_per_chip": plan.peak_flops,
        "resident": {
            s.name: {"device": s.device, "total": s.total, "mesh": s.mesh} for s in plan.states
        },
        "phases": [
            {
                "phase": p.phase,
                "peak_bytes": p.peak,
                "other_resident_bytes": p.others,
                "total_bytes": p.total,
                "flops_analytic": p.flops,
                "seconds_estimate": p.seconds,
                "bound": p.bound,
                "collectives": p.collectives,
                "programs": [
                    {
                        "label": c.program.label,
                        "peak_bytes": c.peak,
                        "memory": c.memory,
                        "cost_analysis_flops": c.cost_flops,
                        "collectives": {k: c.collectives.get(k, 0) for k in COLLECTIVES},
                        "compile_seconds": round(c.seconds, 2),
                        "out_of_memory": c.error,
                    }
                    for c in p.programs
                ],
            }
            for p in plan.phases
        ],
        "notes": list(plan.notes),
        "advice": advice or [],
        "split": split_json(plan),
    }


def split_json(plan: Plan) -> dict[str, Any] | None:
    """A split run's hosts, each mesh's largest phase per chip and the sync; None when
    colocated."""
    sync, phase = plan.sync, plan.sync_phase
    if sync is None or phase is None:
        return None
    chip = plan.where.chip
    meshes = {}
    for mesh in (TRAINER, ROLLOUT):
        worst = plan.mesh_worst(mesh)
        meshes[mesh] = {"worst_phase": worst.phase, "total_bytes": worst.total}
    return {
        "hosts": [
            {"host": host, "trainer": list(trainer), "rollout": list(rollout)}
            for host, (trainer, rollout) in sync.hosts.items()
        ],
        "meshes": meshes,
        "sync": {
            "sent_bytes": sync.sent,
            "per_chip_bytes": sync.per_chip,
            "buckets": sync.buckets,
            "largest_bucket_bytes": sync.largest,
            "peak_bytes": phase.peak,
            "total_bytes": phase.total,
            "seconds_estimate": phase.seconds,
            "ici_send_bandwidth": None if chip is None else chip.ici_send_bandwidth,
        },
    }
