"""Continuous batching, slot plans, KV-cache lifetime, compile bounds and tensor-parallel decode."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import left_padded_prompts, tiny_llama
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jrl.batch import Batch
from jrl.config.defaults import default_config
from jrl.models import init_random
from jrl.parallel import MESH_AXES
from jrl.rollout import EngineLimits, JaxRollout, SamplingParams, generate_tokens
from jrl.rollout.layout import prompt_bucket, row_layout
from jrl.rollout.limits import kv_bytes_per_token, plan_slots, slot_bytes
from jrl.rollout.tensor_parallel import rollout_mesh
from jrl.runspec.rollout import ROLLOUT, engine_limits

P, R, PAD = 8, 10, 0
LENGTHS = (8, 1, 5, 3, 7, 2, 6, 4, 8, 1, 3, 5, 6)
CONFIG = tiny_llama(pad_token_id=PAD, initializer_range=0.5)
# Six of the 64 tokens end a response, so sampled lengths spread over 1..R.
SAMPLING = SamplingParams(
    R, eos_token_ids=(1, 7, 19, 33, 45, 60), pad_token_id=PAD, calculate_log_probs=True
)
LIMITS = EngineLimits(max_num_seqs=16, max_num_batched_tokens=2 * P)


@pytest.fixture(scope="module")
def model():
    return init_random(CONFIG, seed=0)


@pytest.fixture(scope="module")
def prompts() -> Batch:
    return left_padded_prompts(LENGTHS, P, CONFIG.vocab_size)


def _engine(model, **kwargs) -> JaxRollout:
    kwargs.setdefault("limits", LIMITS)
    return JaxRollout(model, response_length=R, pad_token_id=PAD, eos_token_ids=1, **kwargs)


def _run(rollout: JaxRollout, prompts: Batch, seed: int = 0) -> dict:
    out = rollout.generate(prompts, SAMPLING, jax.random.key(seed))
    return {k: np.asarray(v) for k, v in out.tensors.items()}


@pytest.fixture(scope="module")
def reference(model, prompts):
    """16 slots, two prompts per prefill (the last one alone), one device: (outputs, stats)."""
    rollout = _engine(model)
    return _run(rollout, prompts), rollout.stats


def _assert_same_rows(out: dict, expected: dict) -> None:
    np.testing.assert_array_equal(out["responses"], expected["responses"])
    np.testing.assert_array_equal(out["response_mask"], expected["response_mask"])
    np.testing.assert_allclose(out["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5)


def test_rows_do_not_depend_on_slots_or_scheduling(model, prompts, reference):
    expected, stats = reference
    lengths = expected["response_mask"].sum(1)
    assert len(set(lengths.tolist())) > 3 and lengths.max() == R  # mixed lengths
    assert stats["rollout/slots"] == 16 and stats["rollout/prefill_rows"] == 2
    few = EngineLimits(max_num_seqs=2, max_num_batched_tokens=2 * P)
    continuous, static = (
        _engine(model, limits=few),
        _engine(model, limits=few, continuous_batching=False),
    )
    _assert_same_rows(_run(continuous, prompts), expected)
    _assert_same_rows(_run(static, prompts), expected)
    # Refilling each slot as soon as it frees takes fewer decode steps than batch by batch.
    steps = {k: r.stats["rollout/decode_steps"] for k, r in [("c", continuous), ("s", static)]}
    assert steps["c"] < steps["s"]
    assert steps["c"] >= (lengths - 1).sum() / 2  # two slots, one token each per step
    assert stats["rollout/decode_steps"] < steps["c"]


def test_a_prompt_answered_n_times_is_prefilled_once(model, prompts):
    """n = 2 answers per prompt: each prefill of two rows computes one prompt; the rows equal
    those of the prompts repeated by hand (each prefilled on its own)."""
    twice = dataclasses.replace(SAMPLING, n=2)
    shared = _engine(model)
    out = shared.generate(prompts, twice, jax.random.key(3))
    assert shared.stats["rollout/shared_prefill"] == 2
    by_hand = _engine(model)
    expected = by_hand.generate(prompts.repeat(2), SAMPLING, jax.random.key(3))
    assert by_hand.stats["rollout/shared_prefill"] == 1
    _assert_same_rows(
        {k: np.asarray(v) for k, v in out.tensors.items()},
        {k: np.asarray(v) for k, v in expected.tensors.items()},
    )
    lengths = np.asarray(out.tensors["response_mask"]).sum(1)
    assert (lengths[::2] != lengths[1::2]).any()  # the two answers of a prompt differ

    def flops(engine, sampling):  # of the lowered program; the prefill's loop body counts once
        return engine.lower(2 * len(LENGTHS), P, sampling).cost_analysis()["flops"]

    assert flops(shared, twice) < flops(by_hand, SAMPLING)


def test_tensor_parallel_decode_equals_single_device(model, prompts, reference):
    """Two data-parallel replicas of a two-way tensor-parallel model, from a 4-device mesh."""
    four = Mesh(np.asarray(jax.devices()[:4]).reshape(1, 4, 1, 1), MESH_AXES)
    keep = dataclasses.replace(LIMITS, free_cache_engine=False)
    rollout = _engine(model, mesh=four, tensor_parallel_size=2, limits=keep)
    assert dict(rollout.mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 2, "sequence": 1}
    layer = rollout.state["model"]["layers"][0]
    assert layer["self_attn"]["q_proj"]["kernel"].sharding.spec == PartitionSpec(None, "tensor")
    assert layer["mlp"]["down_proj"]["kernel"].sharding.spec == PartitionSpec("tensor", None)
    _assert_same_rows(_run(rollout, prompts), reference[0])
    # The kept cache (slots split over the replicas, kv heads over 'tensor') goes back in as is.
    expected = NamedSharding(rollout.mesh, PartitionSpec("data", "tensor"))  # [S, K, ...]
    for buffer in (*rollout.cache.k, *rollout.cache.v):
        assert buffer.sharding.is_equivalent_to(expected, 4)
    compiled = generate_tokens._cache_size()
    _assert_same_rows(_run(rollout, prompts), reference[0])
    assert generate_tokens._cache_size() == compiled


def _live_bytes() -> int:
    return sum(x.nbytes for x in jax.live_arrays())


def test_free_cache_engine_frees_the_cache(model, prompts, reference):
    kept = _engine(model, limits=dataclasses.replace(LIMITS, free_cache_engine=False))
    _assert_same_rows(_run(kept, prompts), reference[0])
    cache = kept.cache
    layers, heads, dim = CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.head_dim
    tokens = P + R - 1  # on a CPU: keys tokens-minor, values heads-major, the exact count
    buffers = (*cache.k, *cache.v)
    assert len(buffers) == 2 * layers
    assert {x.shape for x in cache.k} == {(16, heads, dim, tokens)}  # a buffer per layer
    assert {x.shape for x in cache.v} == {(16, heads, tokens, dim)}
    size = sum(x.nbytes for x in buffers)
    assert size == 16 * tokens * kv_bytes_per_token(CONFIG, jnp.float32, 1)
    pointers = [x.unsafe_buffer_pointer() for x in buffers]
    _assert_same_rows(_run(kept, prompts), reference[0])
    # donated to the second call, which wrote them in place
    assert all(x.is_deleted() for x in buffers)
    assert [x.unsafe_buffer_pointer() for x in (*kept.cache.k, *kept.cache.v)] == pointers
    before = _live_bytes()
    kept.release()
    assert kept.cache is None and before - _live_bytes() == size

    freed = _engine(model)
    _assert_same_rows(_run(freed, prompts), reference[0])
    assert freed.cache is None
    assert not any(x.shape in (buffers[0].shape, buffers[-1].shape) for x in jax.live_arrays())


def test_compilations_stay_bounded_across_prompt_lengths(model):
    """Prompts are cut to power-of-two buckets and rows padded to powers of two per replica."""
    rollout = _engine(model, limits=EngineLimits(max_num_seqs=4, max_num_batched_tokens=4))
    greedy = SamplingParams(3, pad_token_id=PAD, do_sample=False)
    width = 16
    compiled = generate_tokens._cache_size()
    longest = [3, 4, 5, 7, 8, 6]
    rows = [5, 6, 7, 8, 5, 6]
    outputs = {}
    for n, top in zip(rows, longest, strict=True):
        lengths = [top] + [1 + i % top for i in range(n - 1)]
        batch = left_padded_prompts(lengths, width, CONFIG.vocab_size, seed=n)
        outputs[(n, top)] = rollout.generate(batch, greedy, jax.random.key(0))
    assert generate_tokens._cache_size() - compiled == 2  # buckets 4 and 8
    assert all(out["responses"].shape == (n, R) for (n, _), out in outputs.items())


def test_prompt_buckets_and_row_layout():
    assert [prompt_bucket(n, 12) for n in (1, 2, 3, 5, 8, 9, 12)] == [1, 2, 4, 8, 8, 12, 12]
    layout = row_layout(10, 4)
    assert layout.per_replica == 4 and layout.counts.tolist() == [3, 3, 2, 2]
    assert layout.source[layout.real].tolist() == list(range(10))
    assert layout.real.reshape(4, 4).sum(1).tolist() == [3, 3, 2, 2]
    single = row_layout(5, 1)
    assert single.per_replica == 8 and single.real.sum() == 5


def test_slot_plans_follow_the_limits():
    per_slot = slot_bytes(CONFIG, jnp.bfloat16, 1, tokens=100)
    assert per_slot == 100 * kv_bytes_per_token(CONFIG, jnp.bfloat16, 1) + 16 * CONFIG.vocab_size
    assert kv_bytes_per_token(CONFIG, jnp.bfloat16, 2) * 2 == kv_bytes_per_token(
        CONFIG, jnp.bfloat16, 1
    )
    limits = EngineLimits(max_num_seqs=64, max_num_batched_tokens=1024)
    plan = plan_slots(limits, rows=512, prompt_length=128, budget_bytes=None, bytes_per_slot=1)
    assert (plan.slots, plan.prefill_rows) == (64, 8)
    budget = plan_slots(
        limits, rows=512, prompt_length=128, budget_bytes=20 * per_slot, bytes_per_slot=per_slot
    )
    assert budget.slots == 16  # 20 fit; a power of two of them is used
    few_rows = plan_slots(limits, rows=3, prompt_length=600, budget_bytes=None, bytes_per_slot=1)
    assert (few_rows.slots, few_rows.prefill_rows) == (2, 1)
    # One wave (the slots hold every row): a prefill takes all of them, up to the token budget.
    one_wave = plan_slots(limits, rows=32, prompt_length=16, budget_bytes=None, bytes_per_slot=1)
    assert (one_wave.slots, one_wave.prefill_rows) == (32, 32)
    long_prompts = plan_slots(
        limits, rows=32, prompt_length=256, budget_bytes=None, bytes_per_slot=1
    )
    assert long_prompts.prefill_rows == 4
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        plan_slots(limits, rows=8, prompt_length=8, budget_bytes=10, bytes_per_slot=per_slot)


def test_limits_from_config_and_bad_values():
    rollout_cfg = default_config().actor_rollout_ref.rollout
    limits = engine_limits(rollout_cfg, ROLLOUT)
    assert limits == EngineLimits(
        max_num_seqs=rollout_cfg.max_num_seqs,
        max_num_batched_tokens=rollout_cfg.max_num_batched_tokens,
        gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
        free_cache_engine=rollout_cfg.free_cache_engine,
    )
    cfg = ml_collections.ConfigDict(rollout_cfg.to_dict())
    cfg.max_num_seqs = 0
    with pytest.raises(ValueError, match="rollout.max_num_seqs=0"):
        engine_limits(cfg, ROLLOUT)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        EngineLimits(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="free_cache_engine='yes'"):
        engine_limits({**cfg.to_dict(), "free_cache_engine": "yes"}, ROLLOUT)
    with pytest.raises(KeyError, match="rollout.max_num_batched_tokens"):
        engine_limits({"max_num_seqs": 4}, ROLLOUT)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=3"):
        rollout_mesh(Mesh(np.asarray(jax.devices()).reshape(8, 1, 1, 1), MESH_AXES), 3)
