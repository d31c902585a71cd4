"""The rollout engine on its own devices, started with the actor's weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from jrl.parallel import make_mesh
from jrl.parallel.transfer import MeshTransfer, weight_buckets
from jrl.rollout.build import build_rollout
from jrl.rollout.spec import RolloutSpec
from jrl.runspec.placement import AsyncSpec
from jrl.trainer.overlap.weight_sync import WeightSync
from jrl.trainer.roles.actor import Actor


def split_rollout(
    spec: RolloutSpec,
    placement: AsyncSpec,
    actor: Actor,
    devices: Sequence[jax.Device],
    tokenizer: Any,
) -> tuple[Any, WeightSync]:
    """jrl's JAX sampler on `devices` (disjoint from the actor's), started with the actor's
    weights moved there by the sync program (in the placement's buckets, as every sync), and
    the `WeightSync` that keeps it current."""
    if spec.engine != "jax":
        print(
            f"jrl: {spec.section}.name={spec.engine}: with hybrid_engine=False jrl's JAX sampler "
            "generates on the rollout's own devices",
            flush=True,
        )
    transfer = MeshTransfer(actor.mesh, devices)
    leaves, treedef = jax.tree.flatten(actor.params)
    moved: list[Any] = [None] * len(leaves)
    for group in weight_buckets(leaves, placement.bucket_bytes):
        for i, array in zip(group, transfer.move([leaves[i] for i in group]), strict=True):
            moved[i] = array
    params = jax.tree.unflatten(treedef, moved)
    mesh = make_mesh(len(devices), devices=list(devices))
    engine = build_rollout(
        spec,
        actor.learner.graphdef,
        params,
        mesh,
        tokenizer,
        engine_name="jax",
        lora=actor.spec.model.lora,
    )
    return engine, WeightSync(transfer, engine, placement.bucket_bytes)
