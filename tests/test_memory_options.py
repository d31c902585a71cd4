"""Memory options: remat (gradient checkpointing), activation offload and packed sequences
(use_remove_padding) change memory, never results."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import one_tiny_ppo_step, padded_rows, policy_log_probs, tiny_gemma2

from jrl.batch import Batch
from jrl.models import init_random
from jrl.models.decoder import host_offload_supported, set_memory_options
from jrl.parallel import make_mesh, shard_batch
from jrl.runspec import load_config
from jrl.runspec.models import model_settings
from jrl.trainer.roles.critic import response_values
from jrl.trainer.roles.log_probs import response_log_probs
from jrl.trainer.update.learner import Learner, UpdatePlan
from jrl.trainer.update.packing import pack, packing_plan, plan_packing, with_packing

ROOT = Path(__file__).resolve().parents[1]
# Gemma 2: sliding-window and global layers, soft-capped attention and logits.
CONFIG = tiny_gemma2()
PROMPT, RESPONSE = 10, 6


def _batch(prompt_lens: list[int], response_lens: list[int], seed: int = 0) -> dict:
    """Left-padded prompts and right-padded responses of the given lengths."""
    rng = np.random.default_rng(seed)
    return padded_rows(prompt_lens, response_lens, PROMPT, RESPONSE, CONFIG.vocab_size, rng)


# 16 rows, mostly padding, so that several sequences share a packed row.
PROMPT_LENS = [3, 10, 5, 2, 7, 1, 4, 6, 2, 3, 8, 5, 1, 2, 4, 3]
RESPONSE_LENS = [2, 6, 1, 4, 3, 5, 2, 1, 6, 2, 1, 3, 2, 4, 1, 2]


def _model(remat: str = "none", offload: bool = False, kind: str = "causal_lm"):
    model = init_random(CONFIG, kind=kind, seed=3)
    set_memory_options(model, remat_policy=remat, activation_offload=offload)
    return model


def _loss(model, tensors, packing=None):
    log_prob, _ = response_log_probs(model, tensors, 0.8, packing)
    mask = tensors["response_mask"]
    return -jnp.sum(log_prob * mask) / jnp.sum(mask)


def _loss_and_grads(remat: str, offload: bool = False):
    graphdef, params = nnx.split(_model(remat, offload))
    tensors = _batch(PROMPT_LENS, RESPONSE_LENS)
    fn = jax.jit(jax.value_and_grad(lambda p, t: _loss(nnx.merge(graphdef, p), t)))
    return jax.device_get(fn(params, tensors))


def _residual_bytes(remat: str) -> int:
    graphdef, params = nnx.split(_model(remat))
    tensors = _batch(PROMPT_LENS, RESPONSE_LENS)
    fwd = jax.eval_shape(
        lambda p, t: jax.vjp(lambda q: _loss(nnx.merge(graphdef, q), t), p)[1], params, tensors
    )
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(fwd))


@pytest.fixture(scope="module")
def no_remat():
    return _loss_and_grads("none")


def _assert_same(actual, expected):
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(actual[1]), jax.tree.leaves(expected[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat, no_remat):
    _assert_same(_loss_and_grads(remat), no_remat)
    # and it is on: the forward keeps less for the backward
    assert _residual_bytes(remat) < _residual_bytes("none")


def test_activation_offload_on_cpu_warns_once_and_keeps_gradients(no_remat):
    host_offload_supported.cache_clear()
    with pytest.warns(UserWarning, match="enable_activation_offload.*'cpu'"):
        result = _loss_and_grads("full", offload=True)
    _assert_same(result, no_remat)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        assert not host_offload_supported("cpu")


def test_activation_offload_moves_layer_inputs_to_pinned_host_on_accelerators(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    graphdef, params = nnx.split(_model("full", offload=True))
    tensors = _batch(PROMPT_LENS, RESPONSE_LENS)

    def residuals(p, t):
        return jax.tree.leaves(jax.vjp(lambda q: _loss(nnx.merge(graphdef, q), t), p)[1])

    compiled = jax.jit(residuals).lower(params, tensors).compile()
    shapes = jax.eval_shape(residuals, params, tensors)
    on_host = [
        s.size * s.dtype.itemsize
        for s, sharding in zip(shapes, compiled.output_shardings, strict=True)
        if sharding.memory_kind == "pinned_host"
    ]
    rows, width = tensors["input_ids"].shape
    # each decoder layer's input [B, T, D] float32, nothing else
    assert on_host == [rows * width * CONFIG.hidden_size * 4] * CONFIG.num_layers


def test_offload_without_remat_is_refused():
    with pytest.raises(ValueError, match="activation_offload needs remat"):
        dataclasses.replace(CONFIG, activation_offload=True)
    with pytest.raises(ValueError, match="enable_gradient_checkpointing=True"):
        load_config(
            [
                "--config=configs/gsm8k_grpo.py:tiny",
                "actor_rollout_ref.model.enable_activation_offload=True",
                "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            ]
        )
    spec = model_settings({"path": "unused", "enable_gradient_checkpointing": True}, {})
    assert spec.memory_options() == {
        "remat_policy": "full",
        "activation_offload": False,
    }


def _intervals(starts: np.ndarray, lengths: np.ndarray, width: int, rows: int) -> None:
    """Asserts the sequences of one micro-batch fit their rows and never overlap."""
    used = np.zeros(rows * width, bool)
    for start, n in zip(starts, lengths, strict=True):
        if n == 0:
            continue
        assert start // width == (start + n - 1) // width < rows  # inside one row
        assert not used[start : start + n].any()
        used[start : start + n] = True


def test_plan_packing_fits_every_micro_batch_into_bucketed_rows():
    rng = np.random.default_rng(1)
    width = 32
    lengths = rng.integers(0, width + 1, 20)
    lengths[:4] = width  # full rows
    mask = (np.arange(width) < lengths[:, None]).astype(np.int32)
    mesh = make_mesh(8)
    starts, layout = plan_packing(mask, group_rows=12, mesh=mesh)
    assert layout.length == width and layout.rows % 8 == 0 and layout.rows <= 16
    for first in (0, 12):  # the last micro-batch is shorter
        group = slice(first, first + 12)
        _intervals(starts[group], lengths[group], width, layout.rows)

    # eight half-full rows pack two by two; five such pairs round up to six rows
    half = np.zeros((10, 8), np.int32)
    half[:, :4] = 1
    assert plan_packing(half[:8], group_rows=8)[1].rows == 4
    assert plan_packing(half, group_rows=10)[1].rows == 6
    with pytest.raises(ValueError, match="attention_mask"):
        plan_packing(half[0], group_rows=8)


def test_packed_rows_give_the_padded_log_probs_and_values():
    tensors = _batch(PROMPT_LENS, RESPONSE_LENS)
    mask = tensors["response_mask"].astype(bool)
    mesh = make_mesh(8)
    packed_tensors, layout = with_packing(tensors, len(PROMPT_LENS), mesh)
    assert layout.rows < len(PROMPT_LENS)
    segments = pack(packed_tensors, layout).segment_ids
    assert max(len(set(np.asarray(row)) - {0}) for row in segments) >= 3  # rows are shared

    lm = _model()
    sharded = shard_batch(packed_tensors, mesh)
    padded, packed = jax.jit(
        lambda t: (response_log_probs(lm, t, 0.8), response_log_probs(lm, t, 0.8, layout))
    )(sharded)
    for a, b in zip(padded, packed, strict=True):  # log-probs, entropy
        np.testing.assert_allclose(np.asarray(b)[mask], np.asarray(a)[mask], atol=1e-5)

    critic = _model(kind="value")
    _, no_mesh = with_packing(tensors, len(PROMPT_LENS), None)
    padded_v, packed_v = jax.jit(
        lambda t: (response_values(critic, t), response_values(critic, t, no_mesh))
    )(packed_tensors)
    np.testing.assert_allclose(packed_v, padded_v, atol=1e-5)
    assert np.all(np.asarray(packed_v)[~mask] == 0)


def test_policy_log_probs_with_remove_padding_match_padded():
    """The trainer's forward: packing plans per forward chunk, rows padded to the chunk."""
    mesh = make_mesh(8)
    model = _model("full")
    batch = Batch(_batch(PROMPT_LENS[:12], RESPONSE_LENS[:12]))
    out = {}
    for remove_padding in (False, True):
        out[remove_padding] = policy_log_probs(model, mesh, batch, rows=8, packed=remove_padding)[0]
    mask = batch.tensors["response_mask"].astype(bool)
    np.testing.assert_allclose(out[True][mask], out[False][mask], atol=1e-5)


def test_shuffled_training_with_packing_matches_padded():
    """Packing is planned after the shuffle, so every micro-batch's plan is its own."""

    def loss_fn(model, micro, norm, packing=None):
        log_prob, _ = response_log_probs(model, micro, 0.8, packing)
        return -jnp.sum(log_prob * micro["response_mask"]) / norm["tokens"], {}

    tensors = _batch(PROMPT_LENS, RESPONSE_LENS)
    mesh = make_mesh(1)
    params = {}
    for plan in (None, packing_plan(8, mesh)):
        state = Learner.create(_model(), optax.inject_hyperparams(optax.sgd)(0.5), mesh)
        update = UpdatePlan(grad_clip=1.0, mini_rows=16, micro_rows=8, epochs=2, packing=plan)
        state.train(loss_fn, tensors, update, lr=0.5, shuffle_seed=(7, 1))
        params[plan is None] = jax.tree.leaves(jax.device_get(state.params))
    before = jax.tree.leaves(nnx.state(_model()))
    assert any(not np.allclose(a, b) for a, b in zip(params[True], before, strict=True))
    for a, b in zip(params[False], params[True], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _load_bench():
    spec = importlib.util.spec_from_file_location("memory_bench", ROOT / "bench" / "memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_analysis_remat_and_packing_use_less_memory():
    """Remat shrinks what the forward keeps for the backward (XLA:CPU schedules the recomputation
    early, so its compiled temp size does not show it); packing shrinks both."""
    bench = _load_bench()
    padded = bench.padded_batch(8, 48, 16, CONFIG.vocab_size)
    packed, layout = with_packing(padded, 8, None)
    assert layout.rows < 8
    residuals, temp = {}, {}
    for name, remat, tensors, packing in [
        ("none", "none", padded, None),
        ("full", "full", padded, None),
        ("dots", "dots", padded, None),
        ("packed", "none", packed, layout),
    ]:
        loss, params = bench.training_loss(CONFIG, jnp.float32, remat, False, packing)
        residuals[name] = bench.residual_bytes(loss, params, tensors)
        if remat == "none":
            temp[name] = bench.compiled_memory(loss, params, tensors)["temp_bytes"]
    assert residuals["full"] < residuals["dots"] < residuals["none"]
    assert residuals["packed"] < residuals["none"]
    assert temp["packed"] < temp["none"]


def test_tiny_run_with_remove_padding_and_gradient_checkpointing(tmp_path):
    one_tiny_ppo_step(
        tmp_path / "run",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "critic.model.use_remove_padding=True",
    )
