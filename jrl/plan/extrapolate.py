"""A plan for a deep model from two shallow compiles: per-chip bytes, FLOPs and times are close to
affine in the number of decoder layers (each layer adds the same parameters, optimizer state,
activations and KV cache; the embedding, LM head and logits do not grow), so the plans at `a` and
`b` layers give the plan at L layers as value(a) + (value(b) - value(a)) * (L - a) / (b - a).
States and training phases follow it to a few percent; the rollout's temporaries grow a little
less than linearly (the compiler reuses buffers), so the estimate errs high there (the tests
compare with a full-depth compile). Compiling 2- and 4-layer copies takes seconds where an
80-layer model takes many minutes on a laptop; the result says it was extrapolated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jrl.parallel.topology import Slice
from jrl.plan.memory import Plan, make_plan, plan_kv_cache, rollout_slots
from jrl.plan.roles import build_roles
from jrl.plan.sync import plan_sync

LAYER_KEYS = (
    "actor_rollout_ref.model.override_config.model_config.num_hidden_layers",
    "critic.model.override_config.model_config.num_hidden_layers",
)


def _has(config: Any, key: str) -> bool:
    node = config
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            return False
    return True


def layer_overrides(config: Any, layers: int) -> list[str]:
    """Overrides of `config` that build every model of the run with `layers` decoder layers
    (``+key`` adds a key the config does not have yet)."""
    return [f"{'' if _has(config, key) else '+'}{key}={layers}" for key in LAYER_KEYS]


def _line(low: float, high: float, t: float) -> float:
    return low + (high - low) * t


def extrapolate(low: Plan, high: Plan, a: int, b: int, layers: int) -> Plan:
    """The plan at `layers` decoder layers from the plans at `a` < `b` layers (same run)."""
    t = (layers - a) / (b - a)
    states = tuple(
        dataclasses.replace(
            s, device=round(_line(x.device, s.device, t)), total=round(_line(x.total, s.total, t))
        )
        for x, s in zip(low.states, high.states, strict=True)
    )
    phases = tuple(
        dataclasses.replace(
            p,
            peak=round(_line(x.peak, p.peak, t)),
            others=round(_line(x.others, p.others, t)),
            flops=_line(x.flops, p.flops, t),
            seconds=_line(x.seconds, p.seconds, t),
        )
        for x, p in zip(low.phases, high.phases, strict=True)
    )
    note = (
        f"extrapolated to {layers} decoder layers from compiles at {a} and {b} layers (close to "
        f"affine in the layer count; high for the rollout); collectives are the {b}-layer "
        "programs'"
    )
    return dataclasses.replace(high, states=states, phases=phases, notes=(*high.notes, note))


def deep_plan(
    config_of: Callable[[list[str]], Any],
    where: Slice,
    layers: tuple[int, int],
    largest_bucket_only: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """The plan of the run `config_of([])` from compiles at `layers` = (a, b) decoder layers
    (`config_of(overrides)` builds the run's config with extra overrides). The rollout's slots are
    those the full-depth model gets (its states are built as shapes, which compiles nothing), and
    so are a split run's sync figures (bytes, buckets)."""
    full = config_of([])
    roles = build_roles(full, where)
    depths = {roles.actor.learner.model().config.num_layers}
    if roles.critic is not None:
        depths.add(roles.critic.learner.model().config.num_layers)
    if len(depths) > 1:
        raise ValueError(f"--layers needs the actor and critic to be equally deep, not {depths}")
    depth = depths.pop()
    a, b = layers
    if not 0 < a < b:
        raise ValueError(f"--layers={a},{b}: give two layer counts A < B, e.g. --layers=2,4")
    if depth <= b:
        return make_plan(full, where, largest_bucket_only, progress)
    plan_kv_cache(roles, full, where.hbm_bytes)
    slots = rollout_slots(roles, full)
    low, high = (
        make_plan(config_of(layer_overrides(full, n)), where, largest_bucket_only, progress, slots)
        for n in (a, b)
    )
    plan = extrapolate(low, high, a, b, depth)
    return plan if roles.transfer is None else dataclasses.replace(plan, sync=plan_sync(roles)[0])
