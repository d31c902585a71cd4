"""Training a mixture of experts: the load-balancing loss in the actor's objective and
``freeze_moe_router``, on the digits task's tiny Qwen3-MoE (`jrl.assets.TINY_MOE`)."""

import jax
import numpy as np
from flax import nnx

from jrl.assets import prepare_digits_moe
from jrl.runspec import load_config
from jrl.trainer.ppo.trainer import PPOTrainer

MODEL_CONFIG = "+actor_rollout_ref.model.override_config.model_config"


def _one_step(tmp_path, *overrides):
    """The actor's parameters before and after one GRPO step of the digits card on the tiny
    mixture of experts, and the step's metrics."""
    model = prepare_digits_moe()["model_path"]
    argv = [
        "--config=configs/digits_grpo.py",
        f"actor_rollout_ref.model.path={model}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console']",
        f"trainer.default_local_dir={tmp_path}",
        *overrides,
    ]
    trainer = PPOTrainer.from_config(load_config(argv)[0])
    before = jax.tree.map(np.asarray, nnx.to_pure_dict(trainer.actor.params))
    metrics = trainer.fit()
    after = jax.tree.map(np.asarray, nnx.to_pure_dict(trainer.actor.params))
    return before, after, metrics


def _block(params, layer=0):
    return params["model"]["layers"][layer]["mlp"]


def test_freeze_moe_router_trains_the_experts_but_not_the_routers(tmp_path):
    freeze = "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=True"
    before, after, _ = _one_step(tmp_path / "frozen", freeze)
    for layer in (0, 1):
        np.testing.assert_array_equal(
            _block(after, layer)["gate"]["kernel"], _block(before, layer)["gate"]["kernel"]
        )
        moved = (
            _block(after, layer)["experts"]["down_proj"]
            - _block(before, layer)["experts"]["down_proj"]
        )
        assert np.abs(moved).max() > 0
    before, after, _ = _one_step(tmp_path / "trained")
    assert np.abs(_block(after)["gate"]["kernel"] - _block(before)["gate"]["kernel"]).max() > 0


def test_the_load_balancing_loss_is_logged_and_added_where_output_router_logits(tmp_path):
    coef = f"{MODEL_CONFIG}.router_aux_loss_coef=10.0"
    one_update = "actor_rollout_ref.actor.ppo_mini_batch_size=16"  # the whole batch
    _, logged, metrics = _one_step(tmp_path / "logged", coef, one_update)
    assert metrics["actor/router_aux_loss"] >= 1.0  # about k = 2 when routing is even
    _, added, added_metrics = _one_step(
        tmp_path / "added", coef, one_update, f"{MODEL_CONFIG}.output_router_logits=True"
    )
    assert added_metrics["actor/router_aux_loss"] == metrics["actor/router_aux_loss"]
    assert added_metrics["actor/pg_loss"] == metrics["actor/pg_loss"]
    assert added_metrics["actor/grad_norm"] != metrics["actor/grad_norm"]  # its gradient joined
    assert not np.array_equal(_block(added)["gate"]["kernel"], _block(logged)["gate"]["kernel"])
