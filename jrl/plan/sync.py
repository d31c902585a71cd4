"""The weight sync of a split run (``hybrid_engine=False``), planned: which chips of each host
hold the trainer and the rollout, the bytes one sync moves, in how many buckets
(``update_weights_bucket_megabytes``, grouped as `weight_buckets` groups them for `WeightSync`),
and the program of its largest bucket, lowered over both meshes (`MeshTransfer.lower`) for the
compiler: its per-chip peak is what a sync adds to either side's resident states.

Its time is an estimate, labelled so: every trainer chip sends its shards of the weights at the
chip's whole ICI send bandwidth (a lower bound: a rollout chip several hops away shares links).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from jrl.parallel.transfer import leaf_bytes, weight_buckets
from jrl.plan.programs import Program, per_chip_bytes
from jrl.plan.roles import Roles

SYNC_PHASE = "update_weights"
HostChips = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]  # host: (trainer ids, rollout ids)


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """One weight sync: the chip ids of each host's trainer and rollout (`hosts`: host ->
    (trainer ids, rollout ids)), the bytes all trainer chips send (`sent`), the `buckets`, the
    bytes of the largest one as the rollout holds them (`largest`) and the bytes each trainer
    chip sends (`per_chip`)."""

    hosts: HostChips
    sent: int
    buckets: int
    largest: int
    per_chip: int


def host_split(trainer: Mesh, rollout: Mesh) -> HostChips:
    """Per host (process index), the ids of the chips of the `trainer` mesh and of the
    `rollout` mesh."""
    hosts: dict[int, tuple[list[int], list[int]]] = {}
    for side, mesh in enumerate((trainer, rollout)):
        for device in mesh.devices.flat:
            hosts.setdefault(device.process_index, ([], []))[side].append(device.id)
    return {h: (tuple(sorted(t)), tuple(sorted(r))) for h, (t, r) in sorted(hosts.items())}


def id_ranges(ids: Sequence[int]) -> str:
    """Chip ids as ranges: (0, 1, 2, 5) -> "0-2, 5"."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def plan_sync(roles: Roles) -> tuple[SyncPlan, Program]:
    """The sync of the split run `roles` (shapes only: cheap) and the program of its largest
    bucket, whose per-chip sends cover the whole sync (the phase's work, as FLOPs are)."""
    transfer = roles.transfer
    if transfer is None:
        raise ValueError("plan_sync needs a split run (actor_rollout_ref.hybrid_engine=False)")
    sources = jax.tree.leaves(roles.actor.params)
    targets = jax.tree.leaves(roles.rollout.state)
    moving = [_moving(s, t) for s, t in zip(sources, targets, strict=True)]
    groups = weight_buckets(targets, roles.bucket_bytes)
    largest = max(groups, key=lambda group: sum(leaf_bytes(targets[i]) for i in group))
    bucket = [moving[i] for i in largest]
    sent = transfer.sent_bytes(moving, [m.dtype for m in moving])
    per_chip = sent // transfer.senders
    sync = SyncPlan(
        hosts=host_split(roles.mesh, roles.rollout.mesh),
        sent=sent,
        buckets=len(groups),
        largest=sum(leaf_bytes(targets[i]) for i in largest),
        per_chip=per_chip,
    )
    program = Program(
        SYNC_PHASE,
        f"largest of {len(groups)} buckets: {len(bucket)} weights",
        lambda: transfer.lower(bucket),
        0.0,
        0.0,
        arguments=per_chip_bytes(bucket, None),
        ici_sends=per_chip,
    )
    return sync, program


def _moving(source: Any, target: Any) -> jax.ShapeDtypeStruct:
    """A trainer weight as it moves: the trainer's shape and layout in device memory, the
    rollout's dtype."""
    layout = NamedSharding(source.sharding.mesh, source.sharding.spec)
    return jax.ShapeDtypeStruct(source.shape, target.dtype, sharding=layout)
