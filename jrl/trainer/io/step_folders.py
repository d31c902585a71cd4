"""Where checkpoints live and whether a step folder can be trusted: step folders
(``global_step_N``), the tracker file, the manifest, which steps are complete or intact, and which
one a run resumes from (`find_resume_dir`). What a step folder holds and how it is written:
`jrl.trainer.io.checkpoint`."""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jrl.runspec.run import CheckpointSpec
from jrl.trainer.io.checksums import file_problems, seal_is_broken

log = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "checkpoint.json"
HF_FOLDER = "huggingface"
ORBAX_ITEMS = ("model", "optimizer", "extra")
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
TMP_DIR = re.compile(r"^\.global_step_\d+\.tmp-[0-9a-f]+$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read as asked."""


class DamagedCheckpoint(CheckpointError):
    """A step whose restored arrays are not what was saved (non-finite values)."""


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/global_step_<step>``."""
    return Path(root).absolute() / f"global_step_{int(step)}"


def step_of(path: str | os.PathLike) -> int:
    """The N of a ``…/global_step_N`` path (verl's rule: the integer after 'global_step_')."""
    name = Path(path).name
    match = _STEP_DIR.match(name)
    if not match:
        raise CheckpointError(
            f"{path}: a checkpoint folder is named global_step_<N> (as written under "
            "trainer.default_local_dir)"
        )
    return int(match.group(1))


def read_tracker(root: str | os.PathLike) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``, or None when there is none."""
    path = Path(root) / TRACKER_FILE
    if not path.exists():
        return None
    text = path.read_bytes().decode("utf-8", errors="replace").strip()
    if not text.isdigit():
        raise CheckpointError(f"{path} should hold a step number, found {text[:40]!r}")
    return int(text)


def write_atomic(path: Path, text: str) -> None:
    """Writes `text` to a sibling temp file and renames it onto `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a step folder (raises CheckpointError when it is missing or unreadable)."""
    path = Path(folder) / MANIFEST_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} has no {MANIFEST_FILE}: the save did not finish (or the folder was not "
            "written by jrl)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is damaged: {err}") from None


def problems(
    folder: str | os.PathLike, roles: Iterable[str] = (), contents: bool = False
) -> list[str]:
    """Why `folder` is not a complete checkpoint holding `roles` (empty when it is); with
    `contents`, why it is not intact: bytes that do not match their checksums, files added,
    a manifest that does not match its digest or names another step."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} does not exist"]
    try:
        manifest = read_manifest(folder)
    except CheckpointError as err:
        return [str(err)]
    if not isinstance(manifest, dict) or seal_is_broken(manifest):
        return [f"{folder / MANIFEST_FILE} is damaged: it does not match its own digest"]
    found = []
    match = _STEP_DIR.match(folder.name)
    if match and manifest.get("global_step") not in (None, int(match.group(1))):
        found.append(f"{folder / MANIFEST_FILE} names step {manifest.get('global_step')}")
    for role in roles:
        if role not in manifest.get("roles", {}):
            found.append(f"{folder} holds no {role!r} checkpoint")
    files = manifest.get("files", {})
    return found + file_problems(folder, files, contents, unlisted={MANIFEST_FILE})


def complete_steps(root: str | os.PathLike, roles: Iterable[str] = ()) -> list[int]:
    """Steps under `root` with a complete checkpoint holding `roles`, newest first."""
    roles = list(roles)
    return [s for s in _steps(root) if not problems(step_dir(root, s), roles)]


def _steps(root: str | os.PathLike) -> list[int]:
    """The N of every ``global_step_N`` folder under `root`, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True
    )


def newest_intact(
    root: str | os.PathLike, roles: Sequence[str], below: int | None = None, known: int = -1
) -> int | None:
    """The newest intact step under `root` holding `roles` (below step `below` when given);
    each newer step passed over is warned about, naming what is wrong (except step `known`,
    already reported)."""
    for step in _steps(root):
        if below is not None and step >= below:
            continue
        found = problems(step_dir(root, step), roles, contents=True)
        if not found:
            return step
        if step != known:
            log.warning(
                "global_step_%d is incomplete or damaged (%s); skipping it",
                step,
                "; ".join(found[:3]),
            )
    return None


def intact_steps(root: str | os.PathLike, roles: Sequence[str]) -> list[int]:
    """Every intact step under `root` holding `roles`, newest first (reads every byte)."""
    return [s for s in _steps(root) if not problems(step_dir(root, s), roles, contents=True)]


def step_state(folder: str | os.PathLike) -> tuple[str, list[str]]:
    """("intact" | "incomplete" | "damaged", the problems) of one step folder: incomplete when
    the manifest is missing or a file is missing or of another size, damaged when bytes differ
    from their checksums, a file was added or the manifest does not match its digest."""
    found = problems(folder)
    if found and not any("is damaged" in line for line in found):
        return "incomplete", found
    found = found or problems(folder, contents=True)
    return ("damaged", found) if found else ("intact", [])


def step_folders(path: str | os.PathLike) -> list[Path]:
    """`path` when it is a ``global_step_N`` folder, else the step folders of the run folder
    `path`, newest first."""
    path = Path(path).expanduser().absolute()
    if _STEP_DIR.match(path.name):
        return [path]
    return [step_dir(path, step) for step in _steps(path)]


def find_resume_dir(spec: CheckpointSpec, roles: Sequence[str]) -> Path | None:
    """The checkpoint to resume from under verl's ``trainer.resume_mode``, or None.

    ``disable``: none. ``resume_path``: ``resume_from_path`` (relative to the working directory),
    which must be intact (else the error names the file and the intact steps beside it); so does
    ``auto`` when the spec holds a ``resume_from_path`` (SFT's rule). Else
    ``auto``: the step in ``default_local_dir``'s tracker file; when that step is incomplete or
    damaged (or the tracker is missing or unreadable), the newest intact step, with a warning
    naming what is wrong; None when there is no intact step.
    """
    mode = spec.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path" or spec.resume_from_path:
        return _given_step(spec.resume_from_path, roles)
    root = Path(spec.local_dir).absolute()
    try:
        tracked = read_tracker(root)
    except CheckpointError as err:
        tracked, found = -1, [str(err)]
    if tracked is not None and tracked >= 0:
        found = problems(step_dir(root, tracked), roles, contents=True)
        if not found:
            return step_dir(root, tracked)
    step = newest_intact(root, roles, known=-1 if tracked is None else tracked)
    if tracked is not None:
        named = f"global_step_{tracked}" if tracked >= 0 else "an unreadable step"
        log.warning(
            "%s names %s, which is incomplete or damaged (%s); resuming from %s instead",
            root / TRACKER_FILE,
            named,
            "; ".join(found[:3]),
            "scratch" if step is None else f"global_step_{step}",
        )
    elif step is not None:
        log.warning("%s is missing; resuming from the newest intact step", root / TRACKER_FILE)
    return None if step is None else step_dir(root, step)


def _given_step(given: str | None, roles: Sequence[str]) -> Path:
    """``trainer.resume_from_path``, checked to be an intact step holding `roles`."""
    if not given:
        raise CheckpointError(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<…/global_step_N>"
        )
    path = Path(given).expanduser().absolute()
    if "global_step_" not in path.name:
        raise CheckpointError(
            f"trainer.resume_from_path={given!r} must point at a global_step_<N> folder"
        )
    found = problems(path, roles, contents=True)
    if found:
        others = [f"global_step_{s}" for s in intact_steps(path.parent, roles)]
        raise CheckpointError(
            f"trainer.resume_from_path={given!r} is not a usable checkpoint: "
            + "; ".join(found[:5])
            + f". Intact steps in {path.parent}: {', '.join(others) or 'none'}"
        )
    return path
