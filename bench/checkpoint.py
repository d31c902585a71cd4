"""Checkpoint save and restore: jrl's CheckpointManager against np.save of the gathered arrays.

A randomly initialised causal LM (fp32 parameters) with AdamW state is placed FSDP-sharded on a
mesh of `--devices` devices. One AdamW update, with the parameters themselves as the gradient,
makes the moments non-zero (a fresh optimizer state is all zeros, which would flatter any
compressing writer). Then, in one run:

- jrl: `CheckpointManager.save` of the actor's ``model``, ``optimizer`` and ``extra`` items (plus
  ``hf_model`` with `--hf-model`): the time until `save()` returns (the blocking part) and until
  `wait()` returns (written, committed, tracker file moved), and the bytes on disk;
- numpy (the baseline): `jax.device_get` of parameters and optimizer state, one `np.save` per
  array, each file fsynced (Orbax's tensorstore writes sync too): time and bytes on disk;
- checksums: the same save with `CheckpointManager(checksums=False)` (sizes only), and the
  restore without checking every file first: what checksums cost (ratios ``checksums/none``,
  which run-to-run noise of the disk dominates), and each pass alone: hashing the files just
  written (``checksum_pass``) and verifying them from a cold page cache (``verify_pass``), as
  fractions of the plain save's completion and the plain restore;
- restore: verifying every file against its checksum then `restore_role` into a fresh state
  of the same shape (other random parameters, zero moments), and for the baseline `np.load` +
  `jax.device_put` onto the same shardings; each reports whether the parameters (`equal`) and
  the optimizer state (`optimizer_equal`) are the saved ones bit for bit (SHA-256 of every
  array, taken before the saved state is dropped). Before each restore its files are dropped
  from the page cache, so all read from the disk.

Only one state lives at a time, so qwen2.5-0.5b (2 GB parameters + 4 GB AdamW moments) fits in
24 GB of host memory:

    python bench/checkpoint.py                              # tiny shape, seconds
    python bench/checkpoint.py --shape qwen2.5-0.5b --hf-model

Prints one JSON line per measurement, then the jrl/numpy ratios; exits with an error when a
restore does not give back the saved arrays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from train_step import BETAS, LR, SHAPES, WEIGHT_DECAY  # noqa: E402

from jrl.models import ModelConfig, init_random  # noqa: E402
from jrl.optim.optimizers import make_optimizer  # noqa: E402
from jrl.optim.settings import OptimizerSettings, ScheduleSettings  # noqa: E402
from jrl.parallel import make_mesh  # noqa: E402
from jrl.trainer.io.checkpoint import CheckpointManager, RoleSnapshot, restore_role  # noqa: E402
from jrl.trainer.io.checksums import file_entries  # noqa: E402
from jrl.trainer.io.step_folders import HF_FOLDER, problems, step_dir  # noqa: E402
from jrl.trainer.update.learner import Learner  # noqa: E402

STEP = 1
ROLE = "actor"
EXTRA = {"global_step": STEP, "lr_step": STEP, "data": {"epoch": 0, "index": 0}}


def build_state(shape: str, devices: int, seed: int) -> Learner:
    """A random-init fp32 causal LM of the shape with AdamW state, FSDP-sharded on `devices`."""
    config = ModelConfig.from_hf(SHAPES[shape]["config"])
    model = init_random(config, seed=seed, dtype=jnp.float32, param_dtype=jnp.float32)
    constant = ScheduleSettings("constant", None, 0.0)
    optim = OptimizerSettings("AdamW", LR, BETAS, WEIGHT_DECAY, constant)
    return Learner.create(model, make_optimizer(optim), make_mesh(devices, fsdp_size=-1))


def fill_moments(state: Learner) -> None:
    """One AdamW update of the optimizer state (only), the parameters standing in for the
    gradient, so that the moments and the step count are not zeros."""

    def advance(params: Any, opt_state: Any) -> Any:
        return state.tx.update(params, opt_state, params)[1]

    step = jax.jit(advance, out_shardings=state.opt_shardings, donate_argnums=1)
    state.load(optimizer=jax.block_until_ready(step(state.trainable, state.opt_state)))


def saved_tree(state: Learner) -> dict[str, Any]:
    """What both writers save: the parameters and the optimizer state."""
    return {"params": state.params.to_pure_dict(), "optimizer": state.opt_state}


def digests(tree: Any) -> list[str]:
    """SHA-256 of each array's dtype, shape and bytes, gathered to host one array at a time."""
    out = []
    for leaf in jax.tree.leaves(tree):
        host = np.ascontiguousarray(jax.device_get(leaf))
        digest = hashlib.sha256(f"{host.dtype}{host.shape}".encode())
        digest.update(host.reshape(-1).view(np.uint8))
        out.append(digest.hexdigest())
    return out


def matches(state: Learner, params: list[str], optimizer: list[str]) -> dict[str, bool]:
    """Whether the state's parameters and optimizer state have the given digests."""
    tree = saved_tree(state)
    return {
        "equal": digests(tree["params"]) == params,
        "optimizer_equal": digests(tree["optimizer"]) == optimizer,
    }


def folder_bytes(path: Path) -> int:
    """Total size of the files under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def evict(folder: Path) -> None:
    """Drops the files under `folder` from the page cache (synced first), so that the next read
    comes from the disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall-clock seconds, result) of one call."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def jrl_save(state: Learner, root: Path, hf_model: bool, checksums: bool = True) -> dict[str, Any]:
    """Saves the state with CheckpointManager; returns times and the bytes of each part."""
    items = ["model", "optimizer", "extra"] + (["hf_model"] if hf_model else [])
    manager = CheckpointManager(root, checksums=checksums)
    try:
        start = time.perf_counter()
        manager.save(STEP, {ROLE: RoleSnapshot(state, items, EXTRA)})
        returned = time.perf_counter()
        manager.wait()
        done = time.perf_counter()
    finally:
        manager.close()
    role_dir = step_dir(root, STEP) / ROLE
    model, optimizer = folder_bytes(role_dir / "model"), folder_bytes(role_dir / "optimizer")
    return {
        "save_return_s": returned - start,
        "save_complete_s": done - start,
        "bytes": model + optimizer,
        "model_bytes": model,
        "optimizer_bytes": optimizer,
        "hf_model_bytes": folder_bytes(role_dir / HF_FOLDER) if hf_model else None,
        "step_folder_bytes": folder_bytes(step_dir(root, STEP)),
    }


def jrl_restore(root: Path, state: Learner, verify: bool = True) -> float:
    """Seconds to restore the saved role into `state` (arrays ready): with `verify`, as a
    resume does, every file is first checked against its checksum (`problems`), then
    restore_role."""

    def restore() -> None:
        if verify and problems(step_dir(root, STEP), [ROLE], contents=True):
            raise RuntimeError(f"{step_dir(root, STEP)} does not verify")
        restore_role(step_dir(root, STEP) / ROLE, state, ["model", "optimizer", "extra"])
        jax.block_until_ready(saved_tree(state))

    return seconds(restore)[0]


def numpy_save(tree: Any, folder: Path) -> float:
    """Seconds to gather `tree` to host and write each array with np.save, fsynced."""

    def write() -> None:
        leaves = jax.device_get(jax.tree.leaves(tree))
        folder.mkdir(parents=True)
        for i, leaf in enumerate(leaves):
            with open(folder / f"{i:05d}.npy", "wb") as f:
                np.save(f, leaf)
                f.flush()
                os.fsync(f.fileno())

    return seconds(write)[0]


def numpy_load(folder: Path, like: Any) -> tuple[float, Any]:
    """(seconds, tree) of reading the np.save files back onto the shardings of `like`."""
    leaves, treedef = jax.tree.flatten(like)
    shardings = [leaf.sharding for leaf in leaves]
    del leaves

    def read() -> Any:
        host = [np.load(folder / f"{i:05d}.npy") for i in range(len(shardings))]
        return jax.block_until_ready(jax.device_put(host, shardings))

    took, placed = seconds(read)
    return took, jax.tree.unflatten(treedef, placed)


def run(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """All measurements, printed as they are taken; returns the records."""
    jrl_dir, plain_dir, numpy_dir = root / "jrl", root / "jrl-no-checksums", root / "numpy"
    state = build_state(args.shape, args.devices, seed=0)
    fill_moments(state)
    common = {
        "bench": "checkpoint",
        "shape": args.shape,
        "devices": args.devices,
        "backend": jax.default_backend(),
        "params": sum(leaf.size for leaf in jax.tree.leaves(state.params)),
    }
    records: list[dict[str, Any]] = []

    def emit(**fields: Any) -> dict[str, Any]:
        records.append({**common, **fields})
        print(json.dumps(records[-1]), flush=True)
        return records[-1]

    tree = saved_tree(state)
    params_digest, optimizer_digest = digests(tree["params"]), digests(tree["optimizer"])
    # sizes only first, so that any first-save warm-up is not counted against checksums
    plain = jrl_save(state, plain_dir, args.hf_model, checksums=False)
    emit(impl="jrl-no-checksums", measure="save_return", seconds=plain["save_return_s"])
    emit(impl="jrl-no-checksums", measure="save_complete", seconds=plain["save_complete_s"])
    saved = jrl_save(state, jrl_dir, args.hf_model)
    saved_return, saved_complete = saved.pop("save_return_s"), saved.pop("save_complete_s")
    emit(impl="jrl", measure="save_return", seconds=saved_return)
    emit(impl="jrl", measure="save_complete", seconds=saved_complete)
    jrl_size = emit(impl="jrl", measure="size", **saved)
    # the checksum pass alone, as the finisher runs it on the files just written
    hashing = emit(
        impl="jrl",
        measure="checksum_pass",
        seconds=seconds(lambda: file_entries(step_dir(jrl_dir, STEP)))[0],
    )
    numpy_save_s = numpy_save(tree, numpy_dir)
    emit(impl="numpy", measure="save", seconds=numpy_save_s)
    numpy_size = emit(impl="numpy", measure="size", bytes=folder_bytes(numpy_dir))
    del state, tree

    fresh = build_state(args.shape, args.devices, seed=1)
    jrl_restore(plain_dir, fresh, verify=False)  # warm-up: the first restore also compiles
    evict(plain_dir)
    unverified = emit(
        impl="jrl-no-checksums",
        measure="restore",
        seconds=jrl_restore(plain_dir, fresh, verify=False),
        **matches(fresh, params_digest, optimizer_digest),
    )
    evict(jrl_dir)
    checking = emit(
        impl="jrl",
        measure="verify_pass",
        seconds=seconds(lambda: problems(step_dir(jrl_dir, STEP), [ROLE], contents=True))[0],
    )
    evict(jrl_dir)
    restored = emit(
        impl="jrl",
        measure="restore",
        seconds=jrl_restore(jrl_dir, fresh),
        **matches(fresh, params_digest, optimizer_digest),
    )
    like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), saved_tree(fresh)
    )
    del fresh
    evict(numpy_dir)
    load_s, loaded = numpy_load(numpy_dir, like)
    emit(
        impl="numpy",
        measure="load",
        seconds=load_s,
        equal=digests(loaded["params"]) == params_digest,
        optimizer_equal=digests(loaded["optimizer"]) == optimizer_digest,
    )
    del loaded
    emit(
        impl="jrl/numpy",
        measure="ratio",
        save_return_ratio=saved_return / numpy_save_s,
        save_complete_ratio=saved_complete / numpy_save_s,
        size_ratio=jrl_size["bytes"] / numpy_size["bytes"],
        restore_ratio=restored["seconds"] / load_s,
    )
    emit(
        impl="checksums/none",
        measure="ratio",
        save_return_ratio=saved_return / plain["save_return_s"],
        save_complete_ratio=saved_complete / plain["save_complete_s"],
        restore_ratio=restored["seconds"] / unverified["seconds"],
        checksum_pass_of_save_complete=hashing["seconds"] / plain["save_complete_s"],
        verify_pass_of_restore=checking["seconds"] / unverified["seconds"],
    )
    return records


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (`--devices` defaults to every device JAX sees)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--devices", type=int, help="mesh size, FSDP over all (default: all devices)")
    p.add_argument("--hf-model", action="store_true", help="also save the hf_model item")
    p.add_argument(
        "--dir",
        type=Path,
        help="where to write (kept afterwards; default: a temporary folder, deleted at the end)",
    )
    args = p.parse_args(argv)
    available = len(jax.devices())
    args.devices = available if args.devices is None else args.devices
    if not 1 <= args.devices <= available:
        p.error(
            f"--devices must be between 1 and the {available} devices JAX sees, got {args.devices}"
            " (on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N simulates N)"
        )
    if args.dir is not None:
        for sub in ("jrl", "numpy"):
            if (args.dir / sub).exists():
                p.error(f"--dir {args.dir}: {args.dir / sub} already exists; pick an empty folder")
    return args


def main(argv: list[str] | None = None) -> None:
    """Runs the measurements in `--dir` or a temporary folder; fails when a restore differs."""
    args = parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="jrl-checkpoint-bench-"))
    try:
        records = run(args, root)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    wrong = [
        r["impl"] for r in records if r.get("equal") is False or r.get("optimizer_equal") is False
    ]
    if wrong:
        raise SystemExit(f"restoring gave back different arrays ({', '.join(wrong)}); see above")


if __name__ == "__main__":
    main()
