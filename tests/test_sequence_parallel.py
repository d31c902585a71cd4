"""Sequence parallelism (verl's ``ulysses_sequence_parallel_size``) on 8 simulated devices: the
model's hidden states and gradients, and the actor's log-probs, equal those without it; attention
heads that cannot be split fail with the key. (`test_offload` runs a tiny PPO step with it.)"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import build_actor, tiny_llama

from jrl.assets import prepare_for
from jrl.batch import Batch
from jrl.models import init_random
from jrl.models.attention import check_sequence_heads
from jrl.parallel import batch_sharding, make_mesh, shard_params
from jrl.runspec import load_config
from jrl.trainer.roles.actor import Actor

ACTOR = "actor_rollout_ref.actor"


def test_heads_must_split_over_the_sequence_axis():
    check_sequence_heads(4, 2, 2)
    check_sequence_heads(4, 2, 4)  # two kv heads, each repeated on two devices
    check_sequence_heads(5, 1, 1)
    key = "critic.ulysses_sequence_parallel_size"
    with pytest.raises(ValueError, match=rf"{key}=8: .* use one of 1, 2, 4$"):
        check_sequence_heads(4, 2, 8, key=key)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\)"):
        check_sequence_heads(6, 3, 2)


def _padded_rows(rng: np.random.Generator, rows: int, length: int) -> tuple:
    """Random ids with some left and right padding: (input_ids, attention_mask, None, None)."""
    ids = rng.integers(2, 64, (rows, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    mask[1, -4:] = 0
    return ids, mask, None, None


def _packed_rows(rng: np.random.Generator, rows: int, length: int) -> tuple:
    """Random ids packed as segments of several lengths: (input_ids, None, positions, segments)."""
    ids = rng.integers(2, 64, (rows, length)).astype(np.int32)
    segments = np.zeros((rows, length), np.int32)
    positions = np.zeros((rows, length), np.int32)
    for row in range(rows):
        start, segment = 0, 1
        for size in rng.integers(2, 6, 4):
            end = min(start + int(size), length - 1)  # the last slot stays padding
            segments[row, start:end] = segment
            positions[row, start:end] = np.arange(end - start)
            start, segment = end, segment + 1
    return ids, None, positions, segments


@pytest.mark.parametrize(
    ("sp", "make_rows", "length"),
    [(2, _padded_rows, 16), (4, _packed_rows, 14)],
    ids=["sp2-padded", "sp4-packed-kv-repeated-length-padded"],
)
def test_hidden_states_and_gradients_equal_the_unsharded_ones(sp, make_rows, length):
    model = init_random(tiny_llama(), seed=0)
    graphdef, params = nnx.split(model)
    inputs = make_rows(np.random.default_rng(sp), 4, length)
    valid = (inputs[1] if inputs[1] is not None else inputs[3]).astype(bool)
    weights = np.random.default_rng(0).normal(size=(4, length, 32)).astype(np.float32)
    weights *= valid[..., None]

    def loss(params, *inputs):
        hidden = nnx.merge(graphdef, params).hidden(*inputs)
        return jnp.sum(hidden * weights), hidden

    expected = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, *inputs)
    mesh = make_mesh(8, sequence_parallel=sp)
    params, shardings = shard_params(params, mesh)
    arrays = [x for x in inputs if x is not None]

    def run(params, *arrays):
        it = iter(arrays)
        full = [None if x is None else next(it) for x in inputs]
        return jax.value_and_grad(loss, has_aux=True)(params, *full)

    rows = batch_sharding(mesh, 2)
    sharded = jax.jit(run, in_shardings=(shardings, *[rows] * len(arrays)))
    with jax.set_mesh(mesh):
        compiled = sharded.lower(params, *arrays).compile()
    (_, hidden), grads = compiled(params, *arrays)
    np.testing.assert_allclose(np.asarray(hidden)[valid], expected[0][1][valid], atol=2e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected[1]), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5)
    hlo = compiled.as_text()
    # Ulysses: per layer, q, k and v trade their sequence split for a head split, and back
    # (the backward pass does the same for their gradients).
    assert len(re.findall(r"all-to-all\(", hlo)) >= 4 * model.config.num_layers


def _actor(tmp_path_factory, gpus: int, sp: int, *overrides: str) -> Actor:
    config, _ = load_config(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            f"trainer.n_gpus_per_node={gpus}",
            f"{ACTOR}.ulysses_sequence_parallel_size={sp}",
            f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",
            f"trainer.default_local_dir={tmp_path_factory.mktemp('run')}",
            *overrides,
        ]
    )
    prepare_for(config)
    return build_actor(config, make_mesh(gpus, sequence_parallel=sp))


def _batch(rows: int, prompt: int, response: int) -> Batch:
    """Left-padded prompts and right-padded responses of random tokens, with advantages."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 500, (rows, prompt + response)).astype(np.int32)
    mask = np.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 4] = 0
        mask[row, prompt + response - row % 3 :] = 0
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": np.clip(np.cumsum(mask, -1) - 1, 0, None).astype(np.int32),
            "responses": ids[:, prompt:],
            "response_mask": mask[:, prompt:].astype(np.float32),
            "advantages": rng.normal(size=(rows, response)).astype(np.float32),
        }
    )


def test_actor_log_probs_equal_those_without_sequence_parallelism(tmp_path_factory):
    batch = _batch(rows=8, prompt=11, response=6)  # 17 tokens: padded to 18 for 2 devices
    results = []
    for gpus, sp, packed in ((4, 1, False), (8, 2, True)):
        packing = f"actor_rollout_ref.model.use_remove_padding={packed}"
        actor = _actor(tmp_path_factory, gpus, sp, packing)
        results.append(actor.compute_log_prob(batch, calculate_entropy=True))
    (log_probs, entropy), (sp_log_probs, sp_entropy) = results
    mask = batch.tensors["response_mask"].astype(bool)
    np.testing.assert_allclose(sp_log_probs[mask], log_probs[mask], atol=2e-5)
    np.testing.assert_allclose(sp_entropy[mask], entropy[mask], atol=2e-5)
