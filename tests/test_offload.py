"""Host offload (``param_offload``, ``optimizer_offload``): states live in pinned host memory
between uses, updates are unchanged, device memory held between uses drops by the offloaded bytes, a
backend without host memory kinds warns; a tiny PPO step offloads every role (with sequence
parallelism on) and checkpoints the offloaded states."""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import tiny_llama

from jrl.assets import prepare_for
from jrl.models import init_random
from jrl.parallel import ON_DEVICE, Offload, make_mesh, memory_bytes
from jrl.parallel.offload import HOST_MEMORY, host_memory_kind
from jrl.runspec import load_config
from jrl.trainer.ppo.trainer import PPOTrainer
from jrl.trainer.update.learner import Learner, UpdatePlan


def _kinds(tree) -> set[str]:
    return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


class _DeviceWithoutHostMemory:
    """A device of a backend that addresses no host memory kind."""

    platform = "accel"

    def addressable_memories(self):
        return [SimpleNamespace(kind="device")]


def test_backend_without_host_memory_warns_and_keeps_states_on_device():
    assert host_memory_kind(jax.devices()) == HOST_MEMORY  # this JAX's CPU backend has it
    assert host_memory_kind([_DeviceWithoutHostMemory()]) is None
    with pytest.warns(UserWarning, match=r"critic.x.param_offload=True: the 'accel' backend has"):
        offload = Offload.configure(True, "critic.x.param_offload", [_DeviceWithoutHostMemory()])
    assert offload == ON_DEVICE and not offload.enabled
    tree = {"w": jnp.ones(3)}
    assert offload.store(tree, None) is tree and offload.fetch(tree, None) is tree


def _loss(model, micro, normaliser):
    logp = jax.nn.log_softmax(model(micro["input_ids"])[:, :-1], axis=-1)
    target = jnp.take_along_axis(logp, micro["input_ids"][:, 1:, None], axis=-1)
    return -jnp.sum(target) / normaliser["tokens"], {}


def _trained_state(offload: bool, tensors: dict) -> tuple[Learner, dict[str, int]]:
    """A Learner (both offloads as `offload`) after one update, and the bytes per memory kind
    of the arrays alive after it that were not alive before it was made."""
    before = jax.live_arrays()  # kept alive, so no new array reuses their ids
    known = {id(x) for x in before}
    mesh = make_mesh(8)
    chosen = Offload.configure(offload, "param_offload", mesh.local_devices)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2)
    state = Learner.create(
        init_random(tiny_llama(), seed=0),
        tx,
        mesh,
        param_offload=chosen,
        optimizer_offload=chosen,
    )
    where = {HOST_MEMORY} if offload else {"device"}
    assert _kinds((state.trainable, state.opt_state)) == where
    plan = UpdatePlan(grad_clip=1.0, mini_rows=8, epochs=1, micro_rows=8)
    history = state.train(_loss, tensors, plan, lr=1e-2)
    assert math.isfinite(history["loss"][0])
    assert _kinds((state.trainable, state.opt_state)) == where
    return state, memory_bytes([x for x in jax.live_arrays() if id(x) not in known])


def test_offloaded_train_state_matches_and_frees_device_memory():
    ids = np.random.default_rng(0).integers(1, 64, (8, 12)).astype(np.int32)
    tensors = {"input_ids": ids, "response_mask": np.ones((8, 11), np.float32)}
    plain, plain_held = _trained_state(False, tensors)
    offloaded, offloaded_held = _trained_state(True, tensors)

    params = offloaded.params
    assert _kinds(params) == {"device"}
    again = jax.tree.leaves(offloaded.params)
    assert all(a is b for a, b in zip(jax.tree.leaves(params), again, strict=True))  # one copy
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)

    state_bytes = sum(memory_bytes((plain.trainable, plain.frozen, plain.opt_state)).values())
    print(f"held between uses: without offload {plain_held}, with offload {offloaded_held}")
    assert plain_held == {"device": state_bytes}
    assert offloaded_held == {HOST_MEMORY: state_bytes}  # nothing left in device memory


def test_tiny_ppo_step_offloads_every_role(tmp_path):
    config, _ = load_config(
        [
            "--config=configs/gsm8k_ppo.py:tiny",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "critic.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
            "actor_rollout_ref.ref.fsdp_config.param_offload=True",
            "critic.model.fsdp_config.param_offload=True",
            "critic.model.fsdp_config.optimizer_offload=True",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=1",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    prepare_for(config)
    trainer = PPOTrainer.from_config(config)
    metrics = trainer.fit()
    assert metrics["training/global_step"] == 1
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert math.isfinite(metrics[key]) and metrics[key] != 0, key
    # The reference (loaded from host memory) gives the actor's log-probs before the update.
    assert abs(metrics["actor/kl_loss"]) < 1e-6
    actor, critic = trainer.actor.learner, trainer.critic.learner
    stored = (actor.trainable, actor.opt_state, critic.trainable, critic.opt_state)
    assert _kinds(stored) == {HOST_MEMORY}
    assert _kinds(trainer.ref._stored) == {HOST_MEMORY}
    assert (tmp_path / "global_step_1" / "actor").is_dir()
    assert (tmp_path / "global_step_1" / "critic").is_dir()
