"""Trainer pieces without a model: console/JSON-lines loggers, LR schedules, mini-batching."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from ml_collections import ConfigDict

from jrl.optim.schedule import Schedule
from jrl.runspec.optim import optimizer_settings
from jrl.trainer.io.tracking import Tracking, format_console_line
from jrl.trainer.update.batching import minibatches, pad_rows


def test_console_line_is_verls_format():
    line = format_console_line({"actor/pg_loss": 0.25, "training/global_step": 3, "note": "x"}, 3)
    assert line == "step:3 - actor/pg_loss:0.25 - training/global_step:3"
    assert format_console_line({"actor/lr": np.float64(1e-6)}, 1) == f"step:1 - actor/lr:{1e-6!r}"


def test_file_logger_appends_json_lines(tmp_path, capsys):
    tracking = Tracking(["console", "file"], project="p", experiment="e", run_dir=tmp_path)
    tracking.log({"a": 1.5, "b": float("nan")}, step=1)
    tracking.log({"a": 2.0}, step=2)
    tracking.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "data": {"a": 1.5, "b": "nan"}}, {"step": 2, "data": {"a": 2.0}}]
    assert capsys.readouterr().out.splitlines() == ["step:1 - a:1.5 - b:nan", "step:2 - a:2.0"]


def test_unknown_logger_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown logger 'nope'"):
        Tracking(["nope"], project="p", experiment="e", run_dir=tmp_path)


def _optim(**kw):
    """The settings of an RL ``optim`` section with `kw` changed."""
    base = {
        "optimizer": "AdamW",
        "lr": 1.0,
        "betas": [0.9, 0.999],
        "weight_decay": 0.0,
        "lr_warmup_steps": -1,
        "lr_warmup_steps_ratio": 0.0,
        "lr_scheduler_type": "constant",
        "min_lr_ratio": 0.0,
        "num_cycles": 0.5,
        "warmup_style": None,
    }
    return optimizer_settings(ConfigDict({**base, **kw}), "optim")


def lr_multiplier(optim, step, total):
    return Schedule.from_settings(optim, total).multiplier(step)


def test_warmup_steps_priority():
    assert _optim(lr_warmup_steps_ratio=0.25).schedule.warmup(10) == 2
    assert _optim(lr_warmup_steps=3, lr_warmup_steps_ratio=0.5).schedule.warmup(10) == 3
    assert _optim(lr_warmup_steps=None, lr_warmup_steps_ratio=0.5).schedule.warmup(10) == 5


def test_constant_and_cosine_schedules_closed_form():
    constant = _optim(lr_warmup_steps=4)
    assert [lr_multiplier(constant, s, 10) for s in range(6)] == [0, 0.25, 0.5, 0.75, 1, 1]
    cosine = _optim(lr_warmup_steps=2, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    for step in range(2, 12):
        progress = (step - 2) / 8
        expected = max(0.1, 0.55 + 0.45 * math.cos(math.pi * progress))
        assert lr_multiplier(cosine, step, 10) == pytest.approx(expected)
    assert lr_multiplier(cosine, 1, 10) == 0.5


def test_minibatches_and_padding():
    tensors = {"x": np.arange(24).reshape(12, 2)}
    batches = list(minibatches(tensors, mini_rows=6, micro_rows=3))
    assert [b["x"].shape for b in batches] == [(2, 3, 2), (2, 3, 2)]
    np.testing.assert_array_equal(batches[1]["x"].reshape(6, 2), tensors["x"][6:])
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        list(minibatches(tensors, mini_rows=5, micro_rows=5))
    padded, rows = pad_rows(tensors, 8)
    assert rows == 12 and padded["x"].shape == (16, 2) and not padded["x"][12:].any()


def test_train_state_shuffles_mini_batches_per_epoch_with_the_seed():
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jrl.parallel import make_mesh
    from jrl.trainer.update.learner import Learner, UpdatePlan

    sgd = optax.inject_hyperparams(optax.sgd)(learning_rate=0.0)
    state = Learner.create(nnx.Linear(1, 1, rngs=nnx.Rngs(0)), sgd, make_mesh(1))
    x = np.arange(8, dtype=np.float32)[:, None]
    tensors = {"x": x, "response_mask": np.ones((8, 2), np.float32)}

    def loss_fn(model, micro, norm):
        loss = jnp.sum(model(micro["x"])) / norm["tokens"]
        return loss, {"rows": jnp.sum(micro["x"])}

    plan = UpdatePlan(grad_clip=1.0, mini_rows=4, micro_rows=2, epochs=2)
    plain = state.train(loss_fn, tensors, plan, lr=0.0)["rows"]
    assert plain == [6.0, 22.0, 6.0, 22.0]
    shuffled = state.train(loss_fn, tensors, plan, lr=0.0, shuffle_seed=(42, 3))["rows"]
    expected = []
    for epoch in range(2):
        order = np.random.default_rng([42, 3, epoch]).permutation(8)
        expected += [float(x[order[:4]].sum()), float(x[order[4:]].sum())]
    assert shuffled == expected and shuffled != plain


def test_non_finite_gradient_skips_the_update_and_is_counted():
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jrl.parallel import make_mesh
    from jrl.trainer.update.learner import Learner, UpdatePlan

    sgd = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1)
    state = Learner.create(nnx.Linear(1, 1, rngs=nnx.Rngs(0)), sgd, make_mesh(1))
    before = jax.device_get(state.params)
    tensors = {"x": np.ones((4, 1), np.float32), "response_mask": np.ones((4, 2), np.float32)}

    def loss_fn(model, micro, norm):
        return jnp.sum(model(micro["x"]) * jnp.log(micro["x"] - 1.0)) / norm["tokens"], {}

    plan = UpdatePlan(grad_clip=1.0, mini_rows=2, micro_rows=2, epochs=1)
    history = state.train(loss_fn, tensors, plan, lr=0.1)
    assert history["skipped"] == [1.0, 1.0]
    assert not np.isfinite(history["grad_norm"]).any()
    after = jax.tree.leaves(jax.device_get(state.params))
    for a, b in zip(jax.tree.leaves(before), after, strict=True):
        np.testing.assert_array_equal(a, b)
    history = state.train(
        lambda m, mb, n: (jnp.sum(m(mb["x"])) / n["tokens"], {}), tensors, plan, lr=0.1
    )
    assert history["skipped"] == [0.0, 0.0]
    moved = jax.tree.leaves(jax.device_get(state.params))
    assert any(
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), moved, strict=True)
    )


def test_each_loss_specification_compiles_its_own_update():
    """The compiled update is cached per loss: two actor losses that differ in one option compile
    two programs (the second's loss is its own), an equal one reuses the first."""
    import dataclasses

    import optax

    from jrl.config import default_config
    from jrl.models import ModelConfig, init_random
    from jrl.parallel import make_mesh
    from jrl.runspec.algorithm import resolve_algorithm
    from jrl.trainer.roles.actor import ActorLoss
    from jrl.trainer.update.learner import Learner, UpdatePlan

    config = ModelConfig.from_hf(
        dict(
            model_type="llama",
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 32, (4, 6)).astype(np.int32)
    tensors = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.tile(np.arange(6, dtype=np.int32), (4, 1)),
        "responses": ids[:, 3:],
        "response_mask": np.ones((4, 3), np.float32),
        "old_log_probs": -rng.random((4, 3)).astype(np.float32),
        "advantages": rng.standard_normal((4, 3)).astype(np.float32),
    }
    plan = UpdatePlan(grad_clip=1.0, mini_rows=4, micro_rows=2)
    clip = ActorLoss.resolve(resolve_algorithm(default_config()), 1.0, "naive")
    bonus = dataclasses.replace(clip, entropy_coeff=0.5)
    results = []
    for losses in (
        [clip, clip],
        [clip, bonus],
        [clip, ActorLoss.resolve(resolve_algorithm(default_config()), 1.0, "naive")],
    ):
        sgd = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0)
        learner = Learner.create(init_random(config, seed=1), sgd, make_mesh(1))
        history = [learner.train(loss, tensors, plan, lr=1.0) for loss in losses]
        results.append((len(learner.compiled), history))
    assert [count for count, _ in results] == [1, 2, 1]
    # the same parameters and batch: only the entropy bonus (-0.5 H) tells the second updates apart
    plain_loss, bonus_loss = (results[i][1][1]["loss"][0] for i in (0, 1))
    assert bonus_loss < plain_loss - 0.1
