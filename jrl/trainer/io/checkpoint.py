"""Checkpoints in verl's layout, written by Orbax asynchronously and atomically.

Layout under ``trainer.default_local_dir``::

    global_step_N/
      checkpoint.json               manifest: roles, their items, every file's size and checksum
      actor/  model/ optimizer/ extra/   Orbax items named by ``checkpoint.save_contents``
              huggingface/               config, tokenizer (+ safetensors with ``hf_model``)
              lora_adapter/              with LoRA: the adapters as a PEFT folder (as verl)
      critic/ ...
    latest_checkpointed_iteration.txt   the bare integer N

A save copies the arrays to host and returns; Orbax writes them in the background into a hidden
``.global_step_N.tmp-*`` folder. When every role is written, a finisher thread checksums every
file (`jrl.trainer.io.checksums`), writes the manifest, renames the folder to ``global_step_N``,
then moves the tracker file, drops checkpoints beyond ``max_*_ckpt_to_keep`` and copies the step
to ``default_hdfs_dir`` (read back and checked there). A crash at any moment leaves the tracker
on the last complete step. A step folder is complete when its manifest lists files that are all
present with their recorded sizes, and intact when, besides, every byte matches its checksum, no
file was added and the manifest matches its own digest; only an intact step is restored, and
restored arrays must be finite (`DamagedCheckpoint` otherwise).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from jrl.models import save_pretrained
from jrl.models.lora import LoraSettings
from jrl.models.lora_export import ADAPTER_FOLDER, adapter_arrays, adapter_config, save_adapter
from jrl.models.safetensors_io import replace_directory
from jrl.parallel.distributed import shared_token
from jrl.runspec.run import CHECKPOINT_ITEMS as ITEMS
from jrl.trainer.io.checksums import (
    file_entries,
    sealed,
    stream_digest,
)
from jrl.trainer.io.step_folders import (
    HF_FOLDER,
    MANIFEST_FILE,
    ORBAX_ITEMS,
    TMP_DIR,
    TRACKER_FILE,
    CheckpointError,
    DamagedCheckpoint,
    complete_steps,
    read_manifest,
    read_tracker,
    step_dir,
    write_atomic,
)
from jrl.trainer.update.learner import Learner

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RoleSnapshot:
    """What one role (actor, critic) puts into a checkpoint."""

    learner: Learner
    items: Sequence[str]
    extra: dict[str, Any]
    kind: str = "causal_lm"
    lora: LoraSettings | None = None
    base_model: str = ""  # the model path its LoRA adapters apply to


def _lora(settings: LoraSettings | None) -> dict[str, Any] | None:
    """A role's LoRA settings as the manifest keeps them (`LoraSettings`' fields)."""
    return None if settings is None else dataclasses.asdict(settings)


def _abstract(tree: Any) -> Any:
    """Shape, dtype and sharding of every array (the restore target)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    flat = traverse_util.flatten_dict(tree)
    return {".".join(map(str, k)): tuple(v.shape) for k, v in flat.items()}


def _check_model_shapes(role_dir: Path, saved_tree: Any, target: dict[str, Any]) -> None:
    """Fails with the mismatching parameter names when the checkpoint's model is not the
    configured one."""
    saved = _flat_shapes(saved_tree)
    wanted = _flat_shapes(target)
    lines = [
        f"{name}: {saved[name]} in the checkpoint, {wanted[name]} in the config"
        for name in sorted(saved.keys() & wanted.keys())
        if saved[name] != wanted[name]
    ]
    lines += [f"{name}: only in the config" for name in sorted(wanted.keys() - saved.keys())]
    lines += [f"{name}: only in the checkpoint" for name in sorted(saved.keys() - wanted.keys())]
    if lines:
        more = f" (and {len(lines) - 6} more)" if len(lines) > 6 else ""
        raise CheckpointError(
            f"{role_dir / 'model'} does not match the configured model: "
            + "; ".join(lines[:6])
            + more
            + ". Resume with the model settings the checkpoint was saved with, or set "
            "trainer.resume_mode=disable"
        )


def _composite_handler() -> ocp.CompositeCheckpointHandler:
    """Orbax handlers of a role folder's items (the ``huggingface`` folder is not one)."""
    return ocp.CompositeCheckpointHandler(
        model=ocp.StandardCheckpointHandler(),
        optimizer=ocp.StandardCheckpointHandler(),
        extra=ocp.JsonCheckpointHandler(),
    )


class RoleRead(NamedTuple):
    """What `read_role` took from a role folder: the restored items (model, optimizer; None
    when not asked for) and ``extra`` ({} when not asked for)."""

    model: Any
    optimizer: Any
    extra: dict[str, Any]


def read_role(role_dir: str | os.PathLike, learner: Learner, items: Sequence[str]) -> RoleRead:
    """Reads the Orbax `items` of a role folder, resharded onto `learner`'s mesh, without
    loading them; a non-finite parameter or optimizer value raises `DamagedCheckpoint`."""
    role_dir = Path(role_dir)
    wanted = [item for item in items if item in ORBAX_ITEMS]
    if not wanted:
        return RoleRead(None, None, {})
    manifest = read_manifest(role_dir.parent)
    saved = manifest["roles"].get(role_dir.name, {}).get("items", [])
    missing = [item for item in wanted if item not in saved]
    if missing:
        raise CheckpointError(
            f"{role_dir} has no {missing} (it holds {saved}); remove them from "
            "checkpoint.load_contents"
        )
    checkpointer = ocp.Checkpointer(_composite_handler())
    current = learner.state_dict()
    args: dict[str, Any] = {}
    if "model" in wanted:
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(role_dir / "model"))
        _check_model_shapes(role_dir, metadata.tree, current["model"])
        args["model"] = ocp.args.StandardRestore(_abstract(current["model"]))
    if "optimizer" in wanted:
        args["optimizer"] = ocp.args.StandardRestore(_abstract(current["optimizer"]))
    if "extra" in wanted:
        args["extra"] = ocp.args.JsonRestore()
    try:
        restored = checkpointer.restore(role_dir, args=ocp.args.Composite(**args))
    except (ValueError, KeyError, FileNotFoundError, OSError) as err:
        raise CheckpointError(
            f"could not read {role_dir}: {str(err).splitlines()[0][:300]}; the checkpoint is "
            "damaged or was saved with a different model or optimizer"
        ) from err
    read = RoleRead(
        restored["model"] if "model" in wanted else None,
        restored["optimizer"] if "optimizer" in wanted else None,
        dict(restored["extra"]) if "extra" in wanted else {},
    )
    for item in ("model", "optimizer"):
        bad = non_finite(getattr(read, item))
        if bad:
            raise DamagedCheckpoint(
                f"{role_dir / item} is damaged: non-finite values in {', '.join(bad[:3])}"
                + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
            )
    return read


def non_finite(tree: Any) -> list[str]:
    """The paths of the floating arrays of `tree` holding a NaN or an infinity. One program
    checks them all: per-array programs, each with its own all-reduce over a sharded array, can
    stall XLA's CPU collectives when many are in flight on few cores."""
    named = {
        jax.tree_util.keystr(path, simple=True, separator="."): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    }
    if not named:
        return []
    return [name for name, ok in jax.device_get(_all_finite(named)).items() if not ok]


@jax.jit
def _all_finite(arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
    return {name: jnp.isfinite(array).all() for name, array in arrays.items()}


def restore_role(role_dir: str | os.PathLike, learner: Learner, items: Sequence[str]) -> dict:
    """Loads the Orbax `items` of a role folder into `learner` (`read_role`, then
    `Learner.load`); returns the role's ``extra`` ({} when not loaded)."""
    read = read_role(role_dir, learner, items)
    learner.load(read.model, read.optimizer)
    return read.extra


class CheckpointManager:
    """Writes ``global_step_N`` folders under `root` in the background, one save at a time.

    `max_to_keep` maps a role to the number of its newest checkpoints to keep (None or 0: all);
    `remote_dir` (any fsspec URL) receives a copy of each finished step and the tracker file.
    `checksums=False` records sizes only (for measuring what checksums cost).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        max_to_keep: dict[str, int | None] | None = None,
        remote_dir: str | None = None,
        tokenizer: Any = None,
        checksums: bool = True,
    ):
        self.root = Path(root).expanduser().absolute()
        self.checksums = checksums
        self.max_to_keep = dict(max_to_keep or {})
        self.remote_dir = remote_dir
        self.tokenizer = tokenizer
        self.primary = jax.process_index() == 0
        self._checkpointers: dict[str, ocp.AsyncCheckpointer] = {}
        self._finisher: threading.Thread | None = None
        self._error: BaseException | None = None
        if self.primary and self.root.is_dir():
            for stale in self.root.iterdir():
                if TMP_DIR.match(stale.name):
                    shutil.rmtree(stale, ignore_errors=True)

    def save(self, step: int, roles: dict[str, RoleSnapshot]) -> None:
        """Starts saving `roles` as ``global_step_<step>``; returns once the arrays are copied."""
        self.wait()
        tmp = self.root / f".global_step_{step}.tmp-{shared_token()}"
        if self.primary:
            tmp.mkdir(parents=True)
        used = []
        for name, role in roles.items():
            unknown = set(role.items) - set(ITEMS)
            if unknown:
                raise CheckpointError(
                    f"checkpoint.save_contents of {name}: unknown {sorted(unknown)}; use "
                    f"{', '.join(ITEMS)}"
                )
            if "hf_model" in role.items and jax.process_count() > 1:
                raise CheckpointError(
                    f"checkpoint.save_contents of {name}: hf_model is not written in a "
                    "multi-process run; drop it and convert a checkpoint with python -m jrl.merge"
                )
            args = {}
            state = role.learner.state_dict()
            for item in ("model", "optimizer"):
                if item in role.items:
                    args[item] = ocp.args.StandardSave(state[item])
            if "extra" in role.items:
                args["extra"] = ocp.args.JsonSave(role.extra)
            if args:
                checkpointer = self._checkpointers.setdefault(
                    name, ocp.AsyncCheckpointer(_composite_handler())
                )
                checkpointer.save(tmp / name, args=ocp.args.Composite(**args))
                used.append(checkpointer)
            elif self.primary:
                (tmp / name).mkdir()
            model = role.learner.model()
            if role.lora is not None:  # gathered on every process, written by the primary
                adapters = adapter_arrays(model)
                if self.primary:
                    config = adapter_config(model, role.base_model)
                    save_adapter(tmp / f".{name}.{ADAPTER_FOLDER}", adapters, config)
            if self.primary:
                save_pretrained(
                    model,
                    tmp / f".{name}.{HF_FOLDER}",
                    self.tokenizer,
                    weights="hf_model" in role.items,
                )
        manifest = {
            "global_step": step,
            "roles": {
                name: {"items": list(role.items), "kind": role.kind, "lora": _lora(role.lora)}
                for name, role in roles.items()
            },
        }
        self._error = None
        self._finisher = threading.Thread(
            target=self._finish, args=(step, tmp, manifest, used), daemon=False
        )
        self._finisher.start()

    def _finish(self, step: int, tmp: Path, manifest: dict, used: list) -> None:
        try:
            for checkpointer in used:
                checkpointer.wait_until_finished()
            if not self.primary:
                return
            for name, role in manifest["roles"].items():
                os.replace(tmp / f".{name}.{HF_FOLDER}", tmp / name / HF_FOLDER)
                if role["lora"] is not None:
                    os.replace(tmp / f".{name}.{ADAPTER_FOLDER}", tmp / name / ADAPTER_FOLDER)
            manifest["files"] = file_entries(tmp, self.checksums)
            write_atomic(tmp / MANIFEST_FILE, json.dumps(sealed(manifest), indent=1))
            replace_directory(tmp, step_dir(self.root, step))
            write_atomic(self.root / TRACKER_FILE, str(step))
            self._rotate(step)
            if self.remote_dir:
                self._copy_to_remote(step)
        except BaseException as err:  # reported by the next save or wait
            self._error = err

    def _rotate(self, newest: int) -> None:
        """Drops each role's checkpoints beyond its `max_to_keep`, oldest first."""
        for role, keep in self.max_to_keep.items():
            if not keep or keep < 1:
                continue
            steps = [s for s in complete_steps(self.root, [role]) if s <= newest]
            for old in steps[keep:]:
                folder = step_dir(self.root, old)
                manifest = read_manifest(folder)
                manifest["roles"].pop(role, None)
                prefix = role + os.sep
                manifest["files"] = {
                    k: v for k, v in manifest["files"].items() if not k.startswith(prefix)
                }
                if not manifest["roles"]:
                    shutil.rmtree(folder)
                    continue
                write_atomic(folder / MANIFEST_FILE, json.dumps(sealed(manifest), indent=1))
                shutil.rmtree(folder / role)

    def _copy_to_remote(self, step: int) -> None:
        """Copies the step, reads every file back and checks it against the manifest, then
        moves the remote tracker."""
        import fsspec

        fs, remote_root = fsspec.core.url_to_fs(self.remote_dir)
        target = f"{remote_root.rstrip('/')}/global_step_{step}"
        fs.makedirs(target, exist_ok=True)
        local = step_dir(self.root, step)
        fs.put(str(local) + "/", target, recursive=True)
        for rel, entry in read_manifest(local)["files"].items():
            with fs.open(f"{target}/{rel}", "rb") as copy:
                size, digest = stream_digest(copy)
            if size != entry["size"] or entry.get("xxh3", digest) != digest:
                raise CheckpointError(f"the copy of {rel} at {target} does not match {local}")
        fs.pipe(f"{remote_root.rstrip('/')}/{TRACKER_FILE}", str(step).encode())

    def latest(self) -> str:
        """The newest complete checkpoint folder (after any save in progress), or "none": for
        messages."""
        self.wait()
        step = read_tracker(self.root)
        return "none" if step is None else str(self.root / f"global_step_{step}")

    def wait(self) -> None:
        """Blocks until the last save is complete; raises its error if it failed."""
        if self._finisher is not None:
            self._finisher.join()
            self._finisher = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"saving a checkpoint under {self.root} failed: {err}") from err

    def close(self) -> None:
        """Waits for the last save and releases Orbax's background workers."""
        try:
            self.wait()
        finally:
            for checkpointer in self._checkpointers.values():
                checkpointer.close()
            self._checkpointers.clear()
