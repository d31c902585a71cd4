"""Measured advice for a plan that does not fit: each memory knob the config does not use yet is
tried by planning (so compiling) the run again with it, its saving is the worst phase's drop,
and the knobs that save are then tried together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jrl.plan.memory import Plan
from jrl.runspec import uses_critic

ARR = "actor_rollout_ref"


def candidate_knobs(config: Any) -> list[str]:
    """Overrides that cut per-chip memory and are not already in `config`, cheapest first."""
    arr = config.actor_rollout_ref
    knobs = []
    if not arr.model.use_fused_kernels:
        knobs.append(f"{ARR}.model.use_fused_kernels=True")
    if not arr.model.enable_gradient_checkpointing:
        knobs.append(f"{ARR}.model.enable_gradient_checkpointing=True")
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if micro and int(micro) > 1 and not arr.actor.use_dynamic_bsz:
        knobs.append(f"{ARR}.actor.ppo_micro_batch_size_per_gpu={int(micro) // 2}")
    fsdp = arr.actor.fsdp_config
    for name in ("optimizer_offload", "param_offload"):
        if not fsdp.get(name):
            knobs.append(f"{ARR}.actor.fsdp_config.{name}=True")
    if uses_critic(config) and not config.critic.model.get("enable_gradient_checkpointing"):
        knobs.append("critic.model.enable_gradient_checkpointing=True")
    return knobs


def advise(
    plan: Plan,
    config: Any,
    replan: Callable[[list[str]], Plan],
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """For each candidate knob, the bytes it saves on the worst phase (found by `replan` with the
    knob as an override), then the savers together: dicts of overrides, saving, fits."""
    advice = []
    savers = []
    for knob in candidate_knobs(config):
        say(f"advice: planning again with {knob}")
        try:
            trial = replan([knob])
        except Exception as err:  # a knob this card cannot take is reported, not fatal
            advice.append({"overrides": [knob], "error": f"{type(err).__name__}: {err}"})
            continue
        saving = plan.worst.total - trial.worst.total
        advice.append({"overrides": [knob], "saving_bytes": saving, "fits": trial.fits})
        if saving > 0:
            savers.append(knob)
    if len(savers) > 1:
        say(f"advice: planning again with {' '.join(savers)}")
        trial = replan(savers)
        saving = plan.worst.total - trial.worst.total
        advice.append({"overrides": savers, "saving_bytes": saving, "fits": trial.fits})
    return advice


def advice_lines(advice: list[dict[str, Any]]) -> list[str]:
    """One line per tried knob (or combination): its saving and whether the run then fits."""
    lines = []
    for item in advice:
        knobs = " ".join(item["overrides"])
        if "error" in item:
            lines.append(f"  {knobs}: cannot be planned ({item['error']})")
            continue
        verdict = "fits" if item["fits"] else "still does not fit"
        lines.append(f"  {knobs} saves {item['saving_bytes'] / 2**30:.2f} GiB; {verdict}")
    return lines
