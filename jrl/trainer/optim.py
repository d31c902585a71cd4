"""Optimizers and learning-rate schedules from verl's ``optim`` keys.

verl steps its LR scheduler once per training step (not per mini-batch), so the learning rate is a
host-side function of the scheduler step, injected into the optax state before each update.
"""

from __future__ import annotations

import math
from typing import Any

import optax


def warmup_steps(optim_cfg: Any, total_training_steps: int) -> int:
    """`lr_warmup_steps` when >= 0, else int(lr_warmup_steps_ratio * total_training_steps)."""
    steps = optim_cfg.get("lr_warmup_steps", -1)
    if steps is None or steps < 0:
        steps = int(optim_cfg.get("lr_warmup_steps_ratio", 0.0) * total_training_steps)
    return int(steps)


def scheduler_type(optim_cfg: Any) -> str:
    """`lr_scheduler_type` (or its older alias `warmup_style`)."""
    name = optim_cfg.get("warmup_style") or optim_cfg.get("lr_scheduler_type", "constant")
    if name not in ("constant", "cosine"):
        raise ValueError(
            f"optim.lr_scheduler_type={name!r} is not supported; use constant or cosine"
        )
    return name


def lr_multiplier(optim_cfg: Any, step: int, total_training_steps: int) -> float:
    """The LR factor after `step` scheduler steps (0 for the first update), as verl's schedulers."""
    warmup = warmup_steps(optim_cfg, total_training_steps)
    if step < warmup:
        return step / max(1, warmup)
    if scheduler_type(optim_cfg) == "constant":
        return 1.0
    min_ratio = float(optim_cfg.get("min_lr_ratio", 0.0) or 0.0)
    cycles = float(optim_cfg.get("num_cycles", 0.5))
    progress = (step - warmup) / max(1, total_training_steps - warmup)
    cosine = math.cos(math.pi * cycles * 2.0 * progress)
    return max(min_ratio, cosine * (1.0 - min_ratio) * 0.5 + (1.0 + min_ratio) * 0.5)


def make_optimizer(optim_cfg: Any) -> optax.GradientTransformation:
    """AdamW with an injectable learning rate (clipping and non-finite skips live in the step)."""
    name = str(optim_cfg.get("optimizer", "AdamW")).lower()
    if name not in ("adamw", "adam"):
        raise ValueError(f"optim.optimizer={name!r} is not supported; use AdamW")
    b1, b2 = optim_cfg.get("betas", (0.9, 0.999))
    decay = float(optim_cfg.get("weight_decay", 0.0)) if name == "adamw" else 0.0
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=float(optim_cfg.lr), b1=float(b1), b2=float(b2), weight_decay=decay
    )


def set_learning_rate(opt_state: Any, lr: float) -> Any:
    """Write `lr` into an `inject_hyperparams` optimizer state."""
    opt_state.hyperparams["learning_rate"] = lr
    return opt_state
