"""Resuming a run: the checkpoint that ``trainer.resume_mode`` selects, loaded into every trained
role, and the data loader put back where that step left it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jrl.data.loader import DataLoader
from jrl.trainer.io.checkpoint import find_resume_dir, restore_role, step_of
from jrl.trainer.update.learner import Learner


class Resumed(NamedTuple):
    """The restored step (0: none), its folder (None: none) and the first role's ``extra``."""

    step: int
    folder: Path | None
    extra: dict[str, Any]


def resume(
    trainer_cfg: Any,
    roles: Mapping[str, tuple[Learner, Sequence[str]]],
    loader: DataLoader,
) -> Resumed:
    """Loads the checkpoint that ``trainer.resume_mode`` selects into `roles` (name ->
    (learner, ``checkpoint.load_contents``); the first role holds ``extra``) and sets `loader`'s
    position: from ``extra`` when it was loaded, else from the step (one batch per step)."""
    folder = find_resume_dir(trainer_cfg, list(roles))
    if folder is None:
        return Resumed(0, None, {})
    step = step_of(folder)
    extras = [
        restore_role(folder / name, learner, items) for name, (learner, items) in roles.items()
    ]
    extra = extras[0]
    first = next(iter(roles))
    if extra:
        if extra.get("global_step") != step:
            raise ValueError(
                f"{folder}/{first}/extra records global step {extra.get('global_step')}, not "
                f"{step}; the folder was renamed or mixed with another checkpoint"
            )
        loader.set_state(extra["data_loader"])
    else:
        batches = len(loader)
        loader.set_state({"epoch": step // batches, "position": step % batches})
    return Resumed(step, folder, extra)
