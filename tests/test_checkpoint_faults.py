"""Checkpoints that cannot lie: a fault matrix over every kind of file of a tiny PPO run's
step 4 (actor + critic, steps 2 and 4 saved) — truncated, one byte flipped, same-size random
bytes, deleted, a stray file added — each found before anything is loaded: ``resume_mode=auto``
falls back to step 2 with a warning naming the file, ``resume_path`` fails naming it and the
intact step; the tracker's faults fall back to the newest intact step. Also `jrl.merge verify`,
restored arrays that are not finite, the remote copy's read-back, and the warnings for a model
that does not train. (The run that resumes past a corrupted chunk bit for bit is in
test_resume.py.)"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import fsspec
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checkpoint_helpers import ROLES, _mesh, _ppo, _snapshot, _state, _take_step, _trainer_cfg

from jrl import merge
from jrl.assets import prepare_tiny
from jrl.data.loader import DataLoader
from jrl.trainer.io.checkpoint import CheckpointManager
from jrl.trainer.io.step_folders import (
    TRACKER_FILE,
    CheckpointError,
    DamagedCheckpoint,
    find_resume_dir,
    step_dir,
)
from jrl.trainer.loop.resume import resume
from jrl.trainer.loop.sanity import garbage_warnings


def _largest(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


KINDS = {
    "manifest": lambda step: step / "checkpoint.json",
    "_METADATA": lambda step: step / "actor" / "model" / "_METADATA",
    "_sharding": lambda step: step / "actor" / "model" / "_sharding",
    "array chunk": lambda step: _largest(step / "actor" / "model" / "ocdbt.process_0" / "d"),
    "optimizer": lambda step: _largest(step / "actor" / "optimizer"),
    "extra": lambda step: _largest(step / "actor" / "extra"),
    "hf config": lambda step: step / "actor" / "huggingface" / "config.json",
    "tokenizer": lambda step: step / "actor" / "huggingface" / "tokenizer.json",
    "critic": lambda step: _largest(step / "critic" / "model"),
}


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _flip(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _random(path: Path) -> Path:
    """Up to 256 random bytes over the middle of the file, same size."""
    data = bytearray(path.read_bytes())
    count = min(256, len(data))
    start = (len(data) - count) // 2
    data[start : start + count] = np.random.default_rng(0).bytes(count)
    path.write_bytes(bytes(data))
    return path


def _delete(path: Path) -> Path:
    path.unlink()
    return path


def _stray(path: Path) -> Path:
    stray = path.with_name("stray.bin")
    stray.write_bytes(b"not saved by jrl")
    return stray


FAULTS = {
    "truncated": _truncate,
    "flipped": _flip,
    "random": _random,
    "deleted": _delete,
    "stray": _stray,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny PPO run (actor + critic) of 4 steps, checkpoints at steps 2 and 4."""
    prepare_tiny()
    root = tmp_path_factory.mktemp("faults") / "run"
    _ppo(root, "trainer.total_training_steps=4", "trainer.save_freq=2")
    assert (root / TRACKER_FILE).read_text() == "4"
    return root


def _damaged_copy(run: Path, tmp_path: Path, kind: str, fault: str) -> tuple[Path, Path]:
    root = tmp_path / "run"
    shutil.copytree(run, root)
    return root, FAULTS[fault](KINDS[kind](step_dir(root, 4)))


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_damaged_step_is_found_before_anything_is_loaded(run, tmp_path, caplog, kind, fault):
    root, victim = _damaged_copy(run, tmp_path, kind, fault)
    named = str(victim) if kind != "manifest" or fault == "stray" else "checkpoint.json"
    with caplog.at_level(logging.WARNING):
        assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 2)
    assert named in caplog.text and "resuming from global_step_2" in caplog.text
    given = _trainer_cfg(root, "resume_path", str(step_dir(root, 4)))
    with pytest.raises(CheckpointError, match="Intact steps in .*: global_step_2$") as err:
        find_resume_dir(given, ROLES)
    assert named in str(err.value)


@pytest.mark.parametrize("fault", ["truncated", "flipped", "random", "deleted"])
def test_a_damaged_tracker_falls_back_to_the_newest_intact_step(run, tmp_path, caplog, fault):
    root = tmp_path / "run"
    shutil.copytree(run, root)
    FAULTS[fault](root / TRACKER_FILE)
    with caplog.at_level(logging.WARNING):
        assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 4)  # step 4 is intact
    assert TRACKER_FILE in caplog.text


def test_verify_prints_each_steps_state(run, tmp_path, capsys):
    assert merge.main(["verify", "--local_dir", str(run)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "global_step_4: intact",
        "global_step_2: intact",
        f"{TRACKER_FILE}: global_step_4",
        "jrl.merge: 2 of 2 step(s) intact",
    ]
    root, victim = _damaged_copy(run, tmp_path, "array chunk", "random")
    assert merge.main(["verify", "--local_dir", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("global_step_4: damaged: ") and str(victim) in out[0]
    assert out[1] == "global_step_2: intact"
    _delete(KINDS["optimizer"](step_dir(root, 2)))
    assert merge.main(["verify", "--local_dir", str(step_dir(root, 2))]) == 1
    assert capsys.readouterr().out.startswith("global_step_2: incomplete: ")
    assert merge.main(["verify", "--local_dir", str(tmp_path / "nothing")]) == 2
    # merge refuses a damaged step the same way
    status = merge.main(["--local_dir", str(step_dir(root, 4) / "actor"), "--target_dir", "x"])
    assert status == 2 and str(victim) in capsys.readouterr().err


def _poisoned(tree):
    """`tree` with a NaN in the first element of every floating array."""

    def poison(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.at[(0,) * x.ndim].set(jnp.nan)

    return jax.tree.map(poison, tree)


def test_non_finite_restored_arrays_are_a_damaged_step(tmp_path, caplog):
    """Steps 2 (finite) and 4 (a NaN in every parameter; its checksums are right): auto mode
    loads step 2 and warns naming step 4's model; resume_path fails on step 4 before any
    learner is touched."""
    root = tmp_path / "ckpt"
    state, manager = _state(_mesh(1)), CheckpointManager(root)
    _take_step(state)
    manager.save(2, {"actor": _snapshot(state, ["model", "optimizer"], 2)})
    manager.wait()
    finite = jax.device_get(state.params.to_pure_dict())
    state.trainable = _poisoned(state.trainable)
    manager.save(4, {"actor": _snapshot(state, ["model", "optimizer"], 4)})
    manager.close()
    loader = DataLoader([{"row": i} for i in range(8)], 2, shuffle=False, seed=0)

    fresh = _state(_mesh(1))
    roles = {"actor": (fresh, ["model", "optimizer"])}
    with caplog.at_level(logging.WARNING):
        resumed = resume(_trainer_cfg(root), roles, loader)
    assert resumed.step == 2
    assert "actor/model is damaged: non-finite values in" in caplog.text
    restored = jax.device_get(fresh.params.to_pure_dict())
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(finite), strict=True):
        np.testing.assert_array_equal(a, b)

    untouched = _state(_mesh(1))
    before = jax.device_get(untouched.params.to_pure_dict())
    given = _trainer_cfg(root, "resume_path", str(step_dir(root, 4)))
    with pytest.raises(DamagedCheckpoint, match="global_step_4/actor/model is damaged"):
        resume(given, {"actor": (untouched, ["model", "optimizer"])}, loader)
    after = jax.device_get(untouched.params.to_pure_dict())
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_remote_copy_is_read_back_and_checked(run, tmp_path, monkeypatch):
    """`default_hdfs_dir`: every copied file is read back and compared with the manifest; a
    copy that differs fails the save (here the remote filesystem corrupts what it stores)."""
    remote = tmp_path / "remote"
    manager = CheckpointManager(run, remote_dir=f"file://{remote}")
    manager._copy_to_remote(4)
    assert (remote / TRACKER_FILE).read_text() == "4"
    original_put = fsspec.implementations.local.LocalFileSystem.put

    def corrupting_put(self, source, target, **kwargs):
        original_put(self, source, target, **kwargs)
        _random(_largest(Path(target.rstrip("/"))))

    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "put", corrupting_put)
    with pytest.raises(CheckpointError, match="does not match"):
        CheckpointManager(run, remote_dir=f"file://{tmp_path / 'bad'}")._copy_to_remote(4)
    assert not (tmp_path / "bad" / TRACKER_FILE).exists()  # the remote tracker did not move


def test_garbage_warnings_name_the_step_and_metric():
    healthy = {"actor/grad_norm": 0.9, "actor/pg_loss": 0.1, "actor/entropy": 2.40}
    assert garbage_warnings(healthy, 5, vocab_size=12) == []
    frozen = {**healthy, "actor/grad_norm": 0.0}
    (line,) = garbage_warnings(frozen, 5, vocab_size=12)
    assert line.startswith("step 5: actor/grad_norm is 0 while actor/pg_loss=0.1")
    settled = {**frozen, "actor/pg_loss": 0.0}  # all advantages zero: nothing to learn
    assert garbage_warnings(settled, 5, vocab_size=12) == []
    uniform = {**healthy, "actor/entropy": float(np.log(12))}
    (line,) = garbage_warnings(uniform, 6, vocab_size=12)
    assert "step 6: actor/entropy=2.4849 is ln(12)" in line
    critic = {"critic/grad_norm": 0.0, "critic/vf_loss": 0.3}
    assert "critic/grad_norm is 0" in garbage_warnings(critic, 1, vocab_size=12)[0]
