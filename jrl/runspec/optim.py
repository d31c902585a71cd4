"""verl's ``optim`` keys, read once: an RL role's section -> `OptimizerSettings`, SFT's ->
`SFTOptimizerSettings` (`jrl.optim.settings`, whose checks name the keys).

verl's rules for these keys live here only: the older ``warmup_style`` names the RL schedule
when it is set, over ``lr_scheduler_type`` (`scheduler_key`); ``lr_warmup_steps`` >= 0 sets the
warm-up, else ``lr_warmup_steps_ratio`` of the total steps does (`warmup_steps`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jrl.optim.settings import (
    InvalidSettings,
    OptimizerSettings,
    ScheduleSettings,
    SFTOptimizerSettings,
)
from jrl.runspec.reads import KeyReads

ADAMW = "verl 0.6.0's FSDP roles build AdamW whatever optim.optimizer names, and so does jrl"
# Megatron's scheduler keys (added with +key) and what to set instead in verl's FSDP keys.
MEGATRON_SCHEDULER_KEYS = {
    "lr_warmup_init": "warm-up starts from 0 here; drop it",
    "lr_decay_steps": "the schedule spans optim.total_training_steps; set that instead",
    "lr_decay_style": "set optim.lr_scheduler_type (constant or cosine) instead",
    "min_lr": "set optim.min_lr_ratio (a fraction of optim.lr) instead",
    "weight_decay_incr_style": "weight decay stays optim.weight_decay; drop it",
    "lr_wsd_decay_style": "no warmup-stable-decay schedule for RL; use optim.lr_scheduler_type",
    "lr_wsd_decay_steps": "no warmup-stable-decay schedule for RL; use optim.lr_scheduler_type",
    "use_checkpoint_opt_param_scheduler": "the schedule is resumed from the checkpoint's step",
}


def scheduler_key(section: Any) -> str:
    """The key that names an RL role's schedule: ``warmup_style`` (verl's older name) when it is
    set, else ``lr_scheduler_type``."""
    return "warmup_style" if section.get("warmup_style") else "lr_scheduler_type"


def scheduler_kind(section: Any) -> str:
    """The schedule an RL role's ``optim`` section names (`scheduler_key`)."""
    return section[scheduler_key(section)]


def warmup_steps(section: Any) -> int | None:
    """``lr_warmup_steps`` when 0 or more; None (``lr_warmup_steps_ratio`` decides) when it is
    negative, null or absent."""
    steps = section.get("lr_warmup_steps")
    return None if steps is None or steps < 0 else int(steps)


def optimizer_settings(section: Any, prefix: str) -> OptimizerSettings:
    """The optimizer of the RL role ``optim`` section `section` at `prefix` (e.g.
    ``critic.optim``); `InvalidSettings` lists its problems. Keys the schedule does not use are
    left unread: the cosine shape under a constant schedule, the warm-up ratio when a step count
    is given, ``lr_scheduler_type`` when ``warmup_style`` names the schedule. ``optimizer`` is
    only checked (verl 0.6.0's FSDP roles build AdamW whatever it says, and so does jrl)."""
    section = KeyReads.of(section, prefix)
    key = scheduler_key(section)
    if key == "warmup_style":
        section.skip("lr_scheduler_type", f"{prefix}.warmup_style is set and names the schedule")
    kind, steps = section[key], warmup_steps(section)
    cosine = {}
    if kind == "constant":
        section.skip(("min_lr_ratio", "num_cycles"), "the learning rate is constant")
    else:
        cosine = dict(
            min_lr_ratio=float(section.min_lr_ratio or 0.0), num_cycles=float(section.num_cycles)
        )
    if steps is not None:
        section.skip("lr_warmup_steps_ratio", f"{prefix}.lr_warmup_steps >= 0 sets the warm-up")
    schedule = ScheduleSettings(
        kind=kind,
        warmup_steps=steps,
        warmup_ratio=0.0 if steps is not None else float(section.lr_warmup_steps_ratio),
        key=f"{prefix}.{key}",
        **cosine,
    )
    section.skip("optimizer", ADAMW)
    return OptimizerSettings(
        optimizer=str(section.peek("optimizer")),
        lr=float(section.lr),
        betas=tuple(section.betas or ()),
        weight_decay=float(section.weight_decay),
        schedule=schedule,
        key=prefix,
    )


def optimizer_problems(section: Any, prefix: str) -> Iterator[str]:
    """Every problem of the RL role ``optim`` section at `prefix`: its settings' and Megatron's
    scheduler keys, which verl's FSDP roles do not read."""
    try:
        optimizer_settings(section, prefix)
    except InvalidSettings as err:
        yield from err.problems
    for key in MEGATRON_SCHEDULER_KEYS.keys() & section.keys():
        yield f"{prefix}.{key} is Megatron's: {MEGATRON_SCHEDULER_KEYS[key]}"


def sft_optimizer_settings(section: Any) -> SFTOptimizerSettings:
    """The optimizer of SFT's ``optim`` section; `InvalidSettings` lists its problems. verl
    v0.6.0's SFT names the warm-up ``warmup_steps_ratio`` (read when set, over
    ``lr_warmup_steps_ratio``) and reads ``+optim.eps`` (an ``override_optimizer_config.eps``
    wins over it)."""
    ratio = section.get("warmup_steps_ratio")
    schedule = ScheduleSettings(
        kind=section.lr_scheduler,
        warmup_steps=warmup_steps(section),
        warmup_ratio=float(section.lr_warmup_steps_ratio if ratio is None else ratio),
        key="optim.lr_scheduler",
    )
    eps = section.get("eps")
    overrides = {} if eps is None else {"eps": float(eps)}
    overrides.update(section.override_optimizer_config or {})
    return SFTOptimizerSettings(
        optimizer=str(section.optimizer),
        impl=str(section.optimizer_impl),
        lr=float(section.lr),
        betas=tuple(section.betas),
        weight_decay=float(section.weight_decay),
        clip_grad=float(section.clip_grad),
        schedule=schedule,
        overrides=overrides,
    )


def sft_optimizer_problems(section: Any) -> Iterator[str]:
    """Every problem of SFT's ``optim`` section."""
    try:
        sft_optimizer_settings(section)
    except InvalidSettings as err:
        yield from err.problems
