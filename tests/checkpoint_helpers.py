"""Shared by the checkpoint tests: a tiny PPO run, resume configs, and small learners."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from jrl import train
from jrl.assets import prepare_tiny
from jrl.models import from_pretrained
from jrl.parallel.mesh import MESH_AXES
from jrl.runspec.run import CheckpointSpec
from jrl.trainer.io.checkpoint import RoleSnapshot
from jrl.trainer.update.learner import Learner

REPO = Path(__file__).resolve().parents[1]
PPO = f"--config={REPO / 'configs' / 'gsm8k_ppo.py'}:tiny"
ROLES = ["actor", "critic"]


def _ppo(run_dir: Path, *overrides: str) -> dict[str, float]:
    """A tiny PPO run without validation (it leaves the training state alone)."""
    no_validation = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
    return train.main([PPO, f"trainer.default_local_dir={run_dir}", *no_validation, *overrides])


def _trainer_cfg(root: Path, mode: str = "auto", path: str | None = None) -> CheckpointSpec:
    """Where a run resumes from: `mode` (auto / disable / resume_path) under `root`."""
    return CheckpointSpec(
        local_dir=str(root),
        remote_dir=None,
        roles={},
        resume_mode=mode,
        resume_from_path=path,
        delete_after_load=False,
    )


def _mesh(k: int) -> Mesh:
    devices = np.asarray(jax.devices()[:k]).reshape(1, k, 1, 1)
    return Mesh(devices, MESH_AXES)


def _state(mesh: Mesh) -> Learner:
    model = from_pretrained(prepare_tiny()["model_path"], mesh=mesh)
    return Learner.create(model, optax.adamw(1e-3), mesh)


def _take_step(state: Learner) -> None:
    """One optimizer step with all-ones gradients (moves the params and the Adam count)."""
    grads = jax.tree.map(jnp.ones_like, state.trainable)
    updates, state.opt_state = state.tx.update(grads, state.opt_state, state.trainable)
    state.trainable = optax.apply_updates(state.trainable, updates)


def _snapshot(state: Learner, items: list[str], step: int, kind: str = "causal_lm"):
    return RoleSnapshot(state, items, {"global_step": step}, kind=kind)
