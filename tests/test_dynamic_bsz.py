"""Dynamic batch sizes (use_dynamic_bsz): micro-batches by token budget give the fixed path's
gradients and log-probs, keep to their budget per device, and compile few shapes."""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import one_tiny_ppo_step, padded_rows, policy_log_probs

from jrl.batch import Batch
from jrl.config import ConfigError, default_config
from jrl.models import ModelConfig, init_random
from jrl.parallel import make_mesh
from jrl.runspec import load_config
from jrl.runspec.algorithm import resolve_algorithm
from jrl.trainer.roles.actor import ActorLoss
from jrl.trainer.update.dynamic_batching import TokenBudget, plan_micro_batches, token_minibatches
from jrl.trainer.update.learner import Learner, UpdatePlan, verl_row_order
from jrl.trainer.update.partition import karmarkar_karp

CONFIG = ModelConfig.from_hf(
    {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
    }
)
PROMPT, RESPONSE = 10, 6
WIDTH = PROMPT + RESPONSE


def _batch(
    seed: int, rows: int = 16, prompts: int = PROMPT, responses: int = RESPONSE
) -> dict[str, np.ndarray]:
    """Left-padded prompts and right-padded responses of random lengths (at most `prompts` and
    `responses` tokens), with PPO inputs."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(1, prompts + 1, rows)
    response_lens = rng.integers(1, responses + 1, rows)
    tensors = padded_rows(prompt_lens, response_lens, PROMPT, RESPONSE, CONFIG.vocab_size, rng)
    response_mask = tensors["response_mask"]
    return {
        **tensors,
        "old_log_probs": (rng.normal(-4.0, 0.3, response_mask.shape) * response_mask).astype(
            np.float32
        ),
        "advantages": rng.normal(0.0, 1.0, response_mask.shape).astype(np.float32),
    }


def _per_device(plan, shards: int) -> np.ndarray:
    """[slots, shards, rows per device] source rows."""
    return plan.rows.reshape(plan.rows.shape[0], shards, -1)


def test_karmarkar_karp_covers_every_index_and_balances():
    weights = [5, 5, 4, 3, 3, 2, 1]
    groups = karmarkar_karp(weights, 3, equal_size=False)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert sorted(sum(weights[i] for i in g) for g in groups) == [7, 8, 8]
    assert karmarkar_karp([1, 2], 4, equal_size=False) == [[1], [0], [], []]
    with pytest.raises(ValueError, match="partitions"):
        karmarkar_karp([1], 0)


@pytest.mark.parametrize("packed", [False, True])
def test_plan_keeps_each_device_within_its_budget(packed):
    tensors = _batch(seed=1, rows=30)
    lengths = tensors["attention_mask"].sum(1)
    mesh = make_mesh(2)
    budget = TokenBudget(40, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", packed)
    for pad_count in (False, True):
        plan = plan_micro_batches(tensors["attention_mask"], budget, mesh, pad_count)
        rows = plan.rows[plan.rows >= 0]
        assert sorted(rows) == list(range(30))  # every row exactly once
        per_device = _per_device(plan, 2)
        for device, share in enumerate((range(15), range(15, 30))):
            placed = per_device[:, device]
            assert set(placed[placed >= 0]) == set(share)  # rows stay on their device
        tokens = np.where(per_device >= 0, lengths[np.maximum(per_device, 0)], 0).sum(-1)
        assert tokens.max() <= 40
        fewest = max(math.ceil(lengths[:15].sum() / 40), math.ceil(lengths[15:].sum() / 40))
        assert plan.count >= fewest and not (plan.rows[plan.count :] >= 0).any()
        if pad_count:  # a power-of-two scan; its row count follows from its length
            slots = plan.rows.shape[0]
            assert slots & (slots - 1) == 0 and slots >= plan.count
        if packed:  # each sequence inside its device's packed rows, never overlapping
            assert plan.layout.rows == 2 * (40 // WIDTH) and plan.layout.length == WIDTH
            starts = plan.starts.reshape(per_device.shape)
            for micro, device in np.ndindex(*per_device.shape[:2]):
                used = np.zeros(plan.layout.rows * WIDTH, bool)
                slots = zip(per_device[micro, device], starts[micro, device], strict=True)
                for row, start in slots:
                    if row < 0:
                        continue
                    end = start + lengths[row]
                    assert start // WIDTH == (end - 1) // WIDTH
                    assert (end - 1) // WIDTH // (40 // WIDTH) == device
                    assert not used[start:end].any()
                    used[start:end] = True
        else:
            assert plan.layout is None and plan.starts is None
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=12 is below"):
        plan_micro_batches(tensors["attention_mask"], TokenBudget(12, budget.key), mesh)


def test_plan_takes_verls_count_when_the_partition_fits():
    mask = np.zeros((8, WIDTH), np.int32)
    mask[:, :10] = 1  # 80 tokens at 30 per micro-batch: three micro-batches of 3, 3 and 2 rows
    plan = plan_micro_batches(mask, TokenBudget(30, "k"), None)
    assert plan.count == 3 and plan.rows.shape == (3, 4)
    assert sorted((plan.rows >= 0).sum(1)) == [2, 3, 3]
    gathered = plan.gather({"x": np.arange(8) + 1})["x"]
    assert (
        sorted(gathered[gathered > 0]) == list(range(1, 9)) and (gathered[plan.rows < 0] == 0).all()
    )
    restored = plan.restore([{"y": gathered[i] * 10} for i in range(3)])
    np.testing.assert_array_equal(restored["y"], (np.arange(8) + 1) * 10)


def test_a_token_budget_below_the_padded_length_is_a_config_error():
    dynamic = ["--config=configs/gsm8k_ppo.py:tiny", "actor_rollout_ref.actor.use_dynamic_bsz=True"]
    with pytest.raises(ConfigError) as error:
        load_config(
            [
                *dynamic,
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
                "critic.forward_max_token_len_per_gpu=143",
            ]
        )
    message = str(error.value)
    for key in (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=100",  # follows the actor's
        "critic.forward_max_token_len_per_gpu=143",
    ):
        assert f"{key} must be >= the padded sequence length 144" in message
    assert "critic.ppo_max_token_len_per_gpu" not in message
    # the micro-batch keys are not needed, and the unused ones are not checked
    config, _ = load_config([*dynamic, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    assert config.critic.use_dynamic_bsz


def _algorithm(agg: str):
    cfg = default_config()
    cfg.actor_rollout_ref.actor.loss_agg_mode = agg
    cfg.actor_rollout_ref.actor.entropy_coeff = 0.01
    return resolve_algorithm(cfg)


def _state(mesh):
    return Learner.create(
        init_random(CONFIG, seed=3), optax.inject_hyperparams(optax.sgd)(0.5), mesh
    )


def test_dynamic_update_matches_fixed_micro_batches():
    """One mini-batch, one update: fixed micro-batches of 4 rows against token budgets, padded
    and packed, with empty rows and empty scan slots in play (seq-mean-token-mean: the row
    count normaliser must ignore empty rows)."""
    agg = "seq-mean-token-mean"
    mesh = make_mesh(2)
    tensors = _batch(seed=2)
    loss_fn = ActorLoss.resolve(_algorithm(agg), 0.8, "naive")
    budgets = {"padded": TokenBudget(40, "k"), "packed": TokenBudget(40, "k", packed=True)}
    for budget in budgets.values():  # several micro-batches and at least one empty slot
        mb, _ = next(token_minibatches(tensors, 16, budget, mesh))
        active = mb["response_mask"].reshape(len(mb["response_mask"]), -1).any(-1)
        assert active.sum() >= 2 and not active.all()
        assert not mb["attention_mask"].reshape(-1, WIDTH).any(-1).all()  # empty rows too
    results = {}
    for name, budget in [("fixed", None), *budgets.items()]:
        state = _state(mesh)
        split = {"micro_rows": 4} if budget is None else {"token_budget": budget}
        plan = UpdatePlan(grad_clip=10.0, mini_rows=16, epochs=1, **split)
        history = state.train(loss_fn, tensors, plan, lr=0.5)
        results[name] = (history, jax.tree.leaves(jax.device_get(state.params)))
    before = jax.tree.leaves(nnx.state(init_random(CONFIG, seed=3)))
    fixed_history, fixed_params = results.pop("fixed")
    assert any(not np.allclose(a, b) for a, b in zip(fixed_params, before, strict=True))
    for history, params in results.values():
        for key in ("actor/pg_loss", "grad_norm", "actor/pg_clipfrac"):
            np.testing.assert_allclose(history[key], fixed_history[key], rtol=1e-5, atol=1e-7)
        for a, b in zip(params, fixed_params, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_verl_row_order_deals_local_mini_batches():
    # 8 rows, 2 ranks (rows 0-3 and 4-7), mini-batches of 4: each takes 2 rows of each rank
    np.testing.assert_array_equal(verl_row_order(8, 2, 4), [0, 1, 4, 5, 2, 3, 6, 7])
    assert verl_row_order(8, 1, 4) is None and verl_row_order(8, 2, 8) is None
    shuffled = verl_row_order(8, 2, 4, np.random.default_rng(0))
    assert set(shuffled[:2]) | set(shuffled[4:6]) == {0, 1, 2, 3}  # rank 0 stays rank 0's
    np.testing.assert_array_equal(  # one rank: the plain shuffle
        verl_row_order(8, 1, 4, np.random.default_rng(0)), np.random.default_rng(0).permutation(8)
    )


@pytest.mark.parametrize("budget", [None, TokenBudget(40, "k")], ids=["fixed", "dynamic"])
def test_two_ranks_update_on_verls_mini_batches(budget):
    """Two optimizer steps on 2 data-parallel devices equal one device stepping through verl's
    mini-batches (each rank's half of its own rows), not through consecutive rows."""
    tensors = _batch(seed=6)
    loss_fn = ActorLoss.resolve(_algorithm("token-mean"), 1.0, "naive")
    split = {"micro_rows": 4} if budget is None else {"token_budget": budget}
    plan = UpdatePlan(grad_clip=10.0, mini_rows=8, epochs=1, **split)
    params = {}
    for name, devices, order in [
        ("two ranks", 2, None),
        ("verl order", 1, verl_row_order(16, 2, 8)),
        ("in order", 1, None),
    ]:
        state = _state(make_mesh(devices))
        rows = tensors if order is None else {k: v[order] for k, v in tensors.items()}
        state.train(loss_fn, rows, plan, lr=0.5)
        params[name] = jax.tree.leaves(jax.device_get(state.params))
    for a, b in zip(params["two ranks"], params["verl order"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    gap = max(
        np.abs(a - b).max() for a, b in zip(params["two ranks"], params["in order"], strict=True)
    )
    assert gap > 1e-4  # consecutive rows make different mini-batches


def test_dynamic_forward_log_probs_match_in_row_order():
    mesh = make_mesh(2)
    model = init_random(CONFIG, seed=4)
    batch = Batch(_batch(seed=5, rows=13))  # uneven device shares
    out = {}
    for name, rows, budget, packed in [
        ("fixed", 8, None, False),
        ("padded", None, TokenBudget(32, "k"), False),
        ("packed", None, TokenBudget(32, "k", packed=True), True),
    ]:
        out[name] = policy_log_probs(
            model, mesh, batch, rows=rows, budget=budget, packed=packed, calculate_entropy=True
        )
    mask = batch.tensors["response_mask"].astype(bool)
    for name in ("padded", "packed"):
        for got, want in zip(out[name], out["fixed"], strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)


def test_updates_compile_one_shape_per_scan_length():
    """Over updates whose prompt and response lengths vary, the micro-batch count takes four
    values but the compiled update functions (one executable each) stay at most 3: one per
    power-of-two scan length."""
    mesh = make_mesh(2)
    state = _state(mesh)
    loss_fn = ActorLoss.resolve(_algorithm("token-mean"), 1.0, "naive")
    budget = TokenBudget(24, "k")
    plan = UpdatePlan(grad_clip=1.0, mini_rows=16, epochs=1, token_budget=budget)
    counts = set()
    for step, (prompts, responses) in enumerate([(2, 1), (10, 6), (4, 3), (6, 4), (10, 6)]):
        tensors = _batch(seed=10 + step, prompts=prompts, responses=responses)
        counts.add(plan_micro_batches(tensors["attention_mask"], budget, mesh).count)
        history = state.train(loss_fn, tensors, plan, lr=0.1)
        assert np.isfinite(history["grad_norm"]).all()
    executables = sum(update._cache_size() for update in state.compiled.values())
    assert counts == {1, 2, 3, 4}
    assert executables == len(state.compiled) <= 3


@pytest.mark.parametrize("remove_padding", [False, True])
def test_tiny_run_with_dynamic_batch_sizes(tmp_path, remove_padding):
    one_tiny_ppo_step(
        tmp_path / "run",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=144",
        "critic.ppo_max_token_len_per_gpu=144",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "critic.ppo_micro_batch_size_per_gpu=null",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        f"critic.model.use_remove_padding={remove_padding}",
    )
