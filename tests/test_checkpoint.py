"""Checkpoints: save_freq, layout, retention, save/load contents, resume modes, remote copies,
atomic saves, resharding onto other meshes, and damaged or mismatching checkpoints."""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import fsspec
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from checkpoint_helpers import (
    PPO,
    ROLES,
    _mesh,
    _ppo,
    _snapshot,
    _state,
    _take_step,
    _trainer_cfg,
)
from flax import nnx, traverse_util

from jrl.assets import prepare_tiny
from jrl.config import ConfigError
from jrl.models import CausalLM, from_pretrained
from jrl.parallel import make_mesh
from jrl.runspec import load_config
from jrl.runspec.spec import resolve_run
from jrl.trainer.io.checkpoint import CheckpointManager, restore_role
from jrl.trainer.io.step_folders import (
    TRACKER_FILE,
    CheckpointError,
    find_resume_dir,
    problems,
    read_manifest,
    step_dir,
)
from jrl.trainer.update.learner import Learner

REPO = Path(__file__).resolve().parents[1]
# metrics of a step that depend on the restored parameters, optimizer, data position and RNG
RESUMED_KEYS = [
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "critic/vf_loss",
    "critic/grad_norm",
    "critic/values/mean",
    "prompt_length/mean",
]


def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*"))


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _checkpoint_files(files: Path | dict[str, int]) -> dict[str, int]:
    """The checkpoint part of a run folder's files: step folders and the tracker."""
    files = _files(files) if isinstance(files, Path) else files
    return {k: v for k, v in files.items() if k.startswith(("global_step_", TRACKER_FILE))}


def _largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def _assert_same_step(metrics: dict[str, float], reference: dict[str, float]) -> None:
    assert metrics["training/global_step"] == reference["training/global_step"]
    for key in RESUMED_KEYS:
        np.testing.assert_allclose(metrics[key], reference[key], rtol=1e-5, atol=1e-6, err_msg=key)


# -- a tiny PPO run: 5 steps, save_freq=2, the actor also exports an HF model ------------------


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory) -> SimpleNamespace:
    base = tmp_path_factory.mktemp("ppo")
    run_dir, remote = base / "run", base / "remote"
    metrics = _ppo(
        run_dir,
        "trainer.total_training_steps=5",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
        f"trainer.default_hdfs_dir=file://{remote}",
    )
    return SimpleNamespace(dir=run_dir, remote=remote, metrics=metrics)


def _copy_run(ppo_run: SimpleNamespace, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(ppo_run.dir, target)
    return target


def test_save_freq_steps_tracker_and_layout(ppo_run):
    assert ppo_run.metrics["training/global_step"] == 5
    assert _steps(ppo_run.dir) == [2, 4, 5]  # step % 2 == 0, and the last step
    assert (ppo_run.dir / TRACKER_FILE).read_bytes() == b"5"
    for step in (2, 4, 5):
        folder = step_dir(ppo_run.dir, step)
        assert problems(folder, ROLES) == []
        assert (folder / "checkpoint.json").is_file()
        for role in ROLES:
            for item in ("model", "optimizer", "extra", "huggingface"):
                assert (folder / role / item).is_dir(), (step, role, item)
            assert (folder / role / "huggingface" / "config.json").is_file()
        # hf_model only in the actor's save_contents
        assert list((folder / "actor" / "huggingface").glob("*.safetensors"))
        assert not list((folder / "critic" / "huggingface").glob("*.safetensors"))
    assert not [p for p in ppo_run.dir.iterdir() if ".tmp-" in p.name]


def test_default_hdfs_dir_receives_every_step_and_the_tracker(ppo_run):
    assert (ppo_run.remote / TRACKER_FILE).read_text() == "5"
    for step in (2, 4, 5):
        remote = ppo_run.remote / f"global_step_{step}"
        assert _files(remote) == _files(step_dir(ppo_run.dir, step)), step


def test_hf_model_export_loads_in_transformers_with_jrls_logits(ppo_run):
    import torch
    from transformers import AutoModelForCausalLM

    actor_dir = step_dir(ppo_run.dir, 5) / "actor"
    mesh = make_mesh(1)
    initial = from_pretrained(prepare_tiny()["model_path"], mesh=mesh)
    state = Learner.create(initial, optax.adamw(1e-3), mesh)
    before = jax.device_get(state.params.to_pure_dict())
    assert restore_role(actor_dir, state, ["model"]) == {}
    after = jax.device_get(state.params.to_pure_dict())
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    ]
    assert any(moved)  # the checkpoint holds trained weights, not the initial ones

    hf = AutoModelForCausalLM.from_pretrained(actor_dir / "huggingface", torch_dtype=torch.float32)
    ids = np.array([[3, 17, 42, 5, 101, 7]])
    with torch.no_grad():
        expected = hf(torch.as_tensor(ids)).logits.numpy()
    logits = np.asarray(state.model()(jnp.asarray(ids)))
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_disable_ignores_checkpoint_and_save_freq_minus_one_writes_nothing(
    ppo_run, tmp_path, capsys
):
    run_dir = _copy_run(ppo_run, tmp_path)
    before = _files(run_dir)
    metrics = _ppo(
        run_dir,
        "trainer.resume_mode=disable",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
    )
    assert metrics["training/global_step"] == 1  # trained from scratch, not from step 5
    assert "resumed from" not in capsys.readouterr().out
    # no new step folder, the tracker still names step 5 (the run's logs and plots do change)
    assert _checkpoint_files(run_dir) == _checkpoint_files(before)


def test_resume_path_relative_to_cwd_continues_exactly_and_deletes_it(
    ppo_run, tmp_path, monkeypatch, capsys
):
    run_dir = _copy_run(ppo_run, tmp_path)
    monkeypatch.chdir(tmp_path)
    metrics = _ppo(
        run_dir,
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path=run/global_step_4",
        "trainer.del_local_ckpt_after_load=true",
        "trainer.total_training_steps=5",
    )
    assert f"resumed from {run_dir / 'global_step_4'} at global step 4" in capsys.readouterr().out
    _assert_same_step(metrics, ppo_run.metrics)  # step 5 as in the uninterrupted run
    assert _steps(run_dir) == [2, 5]  # the loaded step is gone, the others stay


def test_auto_falls_back_past_a_truncated_newest_step(ppo_run, tmp_path, caplog):
    run_dir = _copy_run(ppo_run, tmp_path)
    damaged = _largest_file(run_dir / "global_step_5" / "actor" / "model")
    _truncate(damaged)
    with caplog.at_level(logging.WARNING, logger="jrl.trainer.io.checkpoint"):
        metrics = _ppo(run_dir, "trainer.total_training_steps=5", "trainer.save_freq=5")
    warning = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert str(damaged) in warning
    assert "resuming from global_step_4" in warning
    _assert_same_step(metrics, ppo_run.metrics)
    assert problems(run_dir / "global_step_5", ROLES) == []  # step 5 written again, complete
    assert (run_dir / TRACKER_FILE).read_text() == "5"


def test_resume_path_to_a_checkpoint_missing_a_file_fails_naming_it(ppo_run, tmp_path):
    run_dir = _copy_run(ppo_run, tmp_path)
    missing = run_dir / "global_step_4" / "critic" / "model" / "_METADATA"
    missing.unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{missing} is missing")):
        _ppo(
            run_dir,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={run_dir / 'global_step_4'}",
        )


def test_resume_path_without_resume_from_path_is_a_config_error():
    with pytest.raises(ConfigError, match="trainer.resume_from_path"):
        load_config([PPO, "trainer.resume_mode=resume_path"])


# -- the manager and restore functions on tiny train states -------------------------------------


def _count(opt_state) -> int:
    return int(optax.tree_utils.tree_get(opt_state, "count"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> SimpleNamespace:
    """Steps 2 and 3 of an actor (model, optimizer, extra) and a critic (model, extra), saved
    from an 8-device FSDP mesh; which step folders existed right after `save` returned."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    state = _state(make_mesh(8, fsdp_size=-1))
    manager = CheckpointManager(root)
    seen_early = []
    for step in (2, 3):
        _take_step(state)
        manager.save(
            step,
            {
                "actor": _snapshot(state, ["model", "optimizer", "extra"], step),
                "critic": _snapshot(state, ["model", "extra"], step, kind="value"),
            },
        )
        seen_early += [(p, problems(p)) for p in root.glob("global_step_*")]
    manager.close()
    return SimpleNamespace(
        root=root,
        state=state,
        params=jax.device_get(state.params.to_pure_dict()),
        opt_state=jax.device_get(state.opt_state),
        seen_early=seen_early,
    )


def test_async_save_is_atomic_and_finishes(saved):
    # whatever global_step_N existed while a save ran was already complete
    assert all(found == [] for _, found in saved.seen_early), saved.seen_early
    assert (saved.root / TRACKER_FILE).read_text() == "3"
    assert problems(step_dir(saved.root, 3), ROLES) == []
    assert read_manifest(step_dir(saved.root, 3))["global_step"] == 3
    assert sorted(p.name for p in saved.root.iterdir()) == [
        "global_step_2",
        "global_step_3",
        TRACKER_FILE,
    ]


def test_leftover_tmp_folder_is_never_resumed_and_a_new_manager_removes_it(saved, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(saved.root, root)
    leftover = root / ".global_step_9.tmp-0123abcd"
    shutil.copytree(root / "global_step_3", leftover)
    (root / TRACKER_FILE).unlink()
    assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 3)
    (root / TRACKER_FILE).write_text("9")
    assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 3)
    CheckpointManager(root).close()
    assert not leftover.exists()
    assert step_dir(root, 3).is_dir()


def test_save_contents_leave_out_unlisted_items(saved):
    folder = step_dir(saved.root, 3)
    assert sorted(p.name for p in (folder / "critic").iterdir() if p.is_dir()) == [
        "extra",
        "huggingface",
        "model",
    ]
    assert (folder / "actor" / "optimizer").is_dir()
    assert read_manifest(folder)["roles"]["critic"]["items"] == ["model", "extra"]
    # without hf_model the huggingface folder has the config and no weights
    assert (folder / "actor" / "huggingface" / "config.json").is_file()
    assert not list((folder / "actor" / "huggingface").glob("*.safetensors"))


def _assert_tree_equal(actual, expected) -> None:
    flat_actual = traverse_util.flatten_dict(jax.device_get(actual))
    flat_expected = traverse_util.flatten_dict(expected)
    assert flat_actual.keys() == flat_expected.keys()
    for key, value in flat_expected.items():
        np.testing.assert_array_equal(flat_actual[key], value, err_msg=str(key))


def test_load_contents_model_only_keeps_a_fresh_optimizer(saved):
    state = _state(_mesh(1))
    extra = restore_role(step_dir(saved.root, 3) / "actor", state, ["model"])
    assert extra == {}
    _assert_tree_equal(state.params.to_pure_dict(), saved.params)
    assert _count(state.opt_state) == 0
    assert _count(saved.opt_state) == 2


def test_load_contents_naming_an_unsaved_item_fails(saved):
    state = _state(_mesh(1))
    critic = step_dir(saved.root, 3) / "critic"
    with pytest.raises(CheckpointError, match=re.escape(str(critic))):
        restore_role(critic, state, ["model", "optimizer"])


@pytest.mark.parametrize("k", [1, 4])
def test_restore_reshards_onto_another_mesh(saved, k):
    sharded = [
        leaf.sharding.spec for leaf in jax.tree.leaves(saved.state.trainable) if leaf.ndim == 2
    ]
    assert any("fsdp" in spec for spec in sharded)  # saved FSDP-sharded over 8 devices
    mesh = _mesh(k)
    state = _state(mesh)
    extra = restore_role(step_dir(saved.root, 3) / "actor", state, ["model", "optimizer", "extra"])
    assert extra == {"global_step": 3}
    _assert_tree_equal(state.params.to_pure_dict(), saved.params)
    for restored, expected in zip(
        jax.tree.leaves(state.opt_state), jax.tree.leaves(saved.opt_state), strict=True
    ):
        np.testing.assert_array_equal(jax.device_get(restored), expected)
    pairs = [
        (state.trainable, state.trainable_shardings),
        (state.opt_state, state.opt_shardings),
    ]
    for tree, shardings in pairs:
        for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
            assert leaf.sharding.mesh.devices.size == k
            assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def test_restore_into_a_differently_shaped_model_fails_naming_the_path(saved):
    config = from_pretrained(prepare_tiny()["model_path"]).config
    other = CausalLM(
        dataclasses.replace(config, hidden_size=32, intermediate_size=64), rngs=nnx.Rngs(0)
    )
    mesh = _mesh(1)
    state = Learner.create(other, optax.adamw(1e-3), mesh)
    model_dir = step_dir(saved.root, 3) / "actor" / "model"
    with pytest.raises(CheckpointError) as error:
        restore_role(model_dir.parent, state, ["model"])
    message = str(error.value)
    assert str(model_dir) in message
    assert re.search(
        r"embed_tokens\.embedding: \(\d+, 64\) in the checkpoint, \(\d+, 32\)", message
    )


def test_resume_modes_pick_the_right_folder(saved, tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    shutil.copytree(saved.root, root)
    assert find_resume_dir(_trainer_cfg(root, "disable"), ROLES) is None
    assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 3)
    (root / TRACKER_FILE).write_text("2")
    assert find_resume_dir(_trainer_cfg(root), ROLES) == step_dir(root, 2)  # the tracker's step
    monkeypatch.chdir(tmp_path)
    relative = _trainer_cfg(root, "resume_path", "ckpt/global_step_3")
    assert find_resume_dir(relative, ROLES) == step_dir(root, 3)
    assert find_resume_dir(_trainer_cfg(tmp_path / "empty"), ROLES) is None


def test_resume_path_to_a_missing_or_truncated_folder_names_it(saved, tmp_path):
    root = tmp_path / "ckpt"
    shutil.copytree(saved.root, root)
    missing = root / "global_step_7"
    with pytest.raises(CheckpointError, match=re.escape(f"{missing} does not exist")):
        find_resume_dir(_trainer_cfg(root, "resume_path", str(missing)), ROLES)
    damaged = _largest_file(root / "global_step_3" / "actor" / "model")
    _truncate(damaged)
    with pytest.raises(CheckpointError, match=re.escape(str(damaged))):
        find_resume_dir(_trainer_cfg(root, "resume_path", str(step_dir(root, 3))), ROLES)


# -- retention --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_state() -> Learner:
    return _state(_mesh(1))


def _save_steps(manager: CheckpointManager, state: Learner, steps: range) -> None:
    items = ["model", "extra"]
    for step in steps:
        manager.save(step, {role: _snapshot(state, items, step) for role in ROLES})
    manager.close()


def test_max_ckpt_to_keep_per_role(small_state, tmp_path):
    root = tmp_path / "ckpt"
    manager = CheckpointManager(root, max_to_keep={"actor": 1, "critic": 2})
    _save_steps(manager, small_state, range(1, 4))
    assert _steps(root) == [2, 3]  # step 1 lost both roles, so its folder is gone
    step2 = step_dir(root, 2)
    assert sorted(p.name for p in step2.iterdir()) == ["checkpoint.json", "critic"]
    assert list(read_manifest(step2)["roles"]) == ["critic"]
    assert problems(step2, ["critic"]) == []
    assert problems(step2, ["actor"]) != []
    assert problems(step_dir(root, 3), ROLES) == []


def test_remove_previous_ckpt_in_save_keeps_one_of_each(small_state, tmp_path):
    config, _ = load_config([PPO, "trainer.remove_previous_ckpt_in_save=true"])
    with pytest.warns(DeprecationWarning, match="max_actor_ckpt_to_keep"):
        keep = resolve_run(config).checkpoint.retention
    assert keep == {"actor": 1, "critic": 1}
    root = tmp_path / "ckpt"
    remote = f"memory://{tmp_path.name}/remote"
    _save_steps(
        CheckpointManager(root, max_to_keep=keep, remote_dir=remote), small_state, range(1, 3)
    )
    assert _steps(root) == [2]
    assert problems(step_dir(root, 2), ROLES) == []
    # the remote copy (here an in-memory fsspec file system) holds the step and the tracker
    fs, base = fsspec.core.url_to_fs(remote)
    assert fs.cat(f"{base}/{TRACKER_FILE}") == b"2"
    copied = {
        path.split("/global_step_2/", 1)[1]: fs.size(path)
        for path in fs.find(f"{base}/global_step_2")
    }
    assert copied == _files(step_dir(root, 2))


def test_retention_defaults_keep_everything():
    config, _ = load_config([PPO])
    assert resolve_run(config).checkpoint.retention == {"actor": None, "critic": None}
