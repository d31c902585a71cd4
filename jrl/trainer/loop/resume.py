"""Resuming a run: the checkpoint that ``trainer.resume_mode`` selects, loaded into every trained
role, and the data loader put back where that step left it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jrl.data.loader import DataLoader
from jrl.runspec.run import CheckpointSpec
from jrl.trainer.io.checkpoint import RoleRead, read_role
from jrl.trainer.io.step_folders import (
    DamagedCheckpoint,
    find_resume_dir,
    newest_intact,
    step_dir,
    step_of,
)
from jrl.trainer.update.learner import Learner

log = logging.getLogger(__name__)


class Resumed(NamedTuple):
    """The restored step (0: none), its folder (None: none) and the first role's ``extra``."""

    step: int
    folder: Path | None
    extra: dict[str, Any]


def resume(
    spec: CheckpointSpec,
    roles: Mapping[str, tuple[Learner, Sequence[str]]],
    loader: DataLoader,
) -> Resumed:
    """Loads the checkpoint that ``trainer.resume_mode`` selects into `roles` (name ->
    (learner, ``checkpoint.load_contents``); the first role holds ``extra``) and sets `loader`'s
    position: from ``extra`` when it was loaded, else from the step (one batch per step)."""
    folder, reads = find_resume_dir(spec, list(roles)), None
    while folder is not None:
        reads = _read_all(folder, roles, spec)
        if reads is not None:
            break
        folder = _older_intact(folder, list(roles))  # a damaged step under resume_mode=auto
    if folder is None:
        return Resumed(0, None, {})
    step = step_of(folder)
    for (learner, _), read in zip(roles.values(), reads, strict=True):
        learner.load(read.model, read.optimizer)
    extra = reads[0].extra
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


def _read_all(
    folder: Path, roles: Mapping[str, tuple[Learner, Sequence[str]]], spec: CheckpointSpec
) -> list[RoleRead] | None:
    """Every role's items read from `folder` before any is loaded, so that a damaged step
    leaves every learner as it was; None for a damaged step under ``resume_mode=auto`` (a
    warning names it), which raises otherwise."""
    try:
        return [
            read_role(folder / name, learner, items) for name, (learner, items) in roles.items()
        ]
    except DamagedCheckpoint as err:
        if spec.resume_mode != "auto":
            raise
        log.warning("%s; not resuming from %s", err, folder.name)
        return None


def _older_intact(folder: Path, roles: Sequence[str]) -> Path | None:
    step = newest_intact(folder.parent, roles, below=step_of(folder))
    log.warning("resuming from %s instead", "scratch" if step is None else f"global_step_{step}")
    return None if step is None else step_dir(folder.parent, step)
