"""The `jax` rollout engine against a naive full-forward loop on a tiny random model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import left_padded_prompts, tiny_llama, tiny_rollout_spec

from jrl.batch import Batch
from jrl.models import init_random
from jrl.models.dtypes import cache_dtype
from jrl.models.kv_layout import HEADS_MAJOR, TOKENS_MAJOR, TOKENS_MINOR, KVLayout
from jrl.rollout import EngineLimits, JaxRollout, SamplingParams, make_rollout, sampling_params
from jrl.rollout.limits import kv_bytes_per_token
from jrl.rollout.sampler import cache_length
from jrl.rollout.selection import apply_top_k, apply_top_p

P, R, PAD = 6, 5, 0
LENGTHS = (6, 3, 1)
CONFIG = tiny_llama(pad_token_id=PAD, initializer_range=0.5)
# One prompt per prefill: a single compiled prefill keeps these tests quick.
LIMITS = EngineLimits(max_num_batched_tokens=P)
GREEDY = SamplingParams(R, pad_token_id=PAD, do_sample=False, calculate_log_probs=True)
# A run's training and validation sampling (`RolloutSpec.sampling`, `.validation`).
SAMPLING = SamplingParams(R, temperature=0.7, top_k=20, top_p=0.95, n=2, calculate_log_probs=True)
VALIDATION = SamplingParams(R, temperature=0.0, do_sample=False, calculate_log_probs=True)


@pytest.fixture(scope="module")
def model():
    return init_random(CONFIG, seed=0)


@pytest.fixture(scope="module")
def prompts() -> Batch:
    meta = {"uid": np.array(["a", "b", "c"], object)}
    return left_padded_prompts(LENGTHS, P, CONFIG.vocab_size, meta=meta)


def _full_forward(model):
    """Full forward pass (no cache): state, ids, mask, positions -> logits."""
    graphdef = nnx.split(model)[0]

    @jax.jit
    def run(state, ids, mask, positions):
        return nnx.merge(graphdef, state)(ids, mask, positions)

    return run


@pytest.fixture(scope="module")
def forward(model):
    return _full_forward(model)


def _naive_greedy(forward, state, prompts: Batch, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy tokens by re-running the full forward each step; also the last logits [B, T, V]."""
    rows = len(prompts)
    ids = np.concatenate([prompts["input_ids"], np.full((rows, steps), PAD)], axis=1)
    mask = np.concatenate([prompts["attention_mask"], np.zeros((rows, steps), np.int32)], axis=1)
    for s in range(steps):
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        logits = np.asarray(forward(state, ids, mask, positions))
        ids[:, P + s] = logits[:, P + s - 1].argmax(-1)
        mask[:, P + s] = 1
    return ids[:, P:], logits


def _token_log_probs(logits: np.ndarray, tokens: np.ndarray, temperature: float) -> np.ndarray:
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / temperature, axis=-1))
    return np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


@pytest.fixture(scope="module")
def naive(model, forward, prompts):
    return _naive_greedy(forward, nnx.state(model), prompts, R)


def _engine(model) -> JaxRollout:
    return JaxRollout(
        model,
        response_length=R,
        pad_token_id=PAD,
        eos_token_ids=CONFIG.eos_token_id,
        limits=LIMITS,
    )


@pytest.fixture(scope="module")
def rollout(model):
    return _engine(model)


def _generate(rollout, prompts: Batch, params: SamplingParams, seed: int = 0) -> dict:
    out = rollout.generate(prompts, params, jax.random.key(seed))
    return {k: np.asarray(v) for k, v in out.tensors.items()}


def test_greedy_matches_full_forward(rollout, prompts, naive):
    """head_dim 16 on this CPU: keys tokens-minor, values heads-major, unrounded, a buffer per
    layer, 16-bit values held in float32."""
    cpu = KVLayout(TOKENS_MINOR, HEADS_MAJOR, 1, per_layer=True, float32_storage=True)
    assert CONFIG.kv_layout("cpu") == cpu
    assert cache_dtype(cpu, jnp.bfloat16) == cache_dtype(cpu, jnp.float32) == np.float32
    assert cache_dtype(CONFIG.kv_layout("tpu"), jnp.bfloat16) == jnp.bfloat16
    assert rollout.cache_bytes(1, P, GREEDY) == (P + R - 1) * kv_bytes_per_token(
        CONFIG, jnp.float32, 1
    )
    _assert_greedy_matches(rollout, prompts, naive)


def test_greedy_matches_full_forward_with_a_tokens_major_cache(model, prompts, naive, monkeypatch):
    """head_dim 16 on a GPU or TPU: tokens before kv heads (`jrl.models.kv_layout`), here under
    the GPU's rule."""
    tokens_major = KVLayout(TOKENS_MAJOR, TOKENS_MAJOR)
    assert CONFIG.kv_layout("gpu") == CONFIG.kv_layout("tpu") == tokens_major
    rule = KVLayout.for_model
    monkeypatch.setattr(KVLayout, "for_model", lambda head_dim, platform: rule(head_dim, "gpu"))
    assert CONFIG.kv_layout("cpu") == tokens_major
    _assert_greedy_matches(_engine(model), prompts, naive)


def test_greedy_matches_full_forward_with_a_heads_major_cache(prompts, monkeypatch):
    """head_dim 128 on a GPU or TPU: the cache keeps kv heads before tokens
    (`jrl.models.kv_layout`), here under the TPU's rule."""
    config = tiny_llama(pad_token_id=PAD, initializer_range=0.5, head_dim=128)
    heads_major = KVLayout(HEADS_MAJOR, HEADS_MAJOR, token_multiple=16)
    assert config.kv_layout("gpu") == config.kv_layout("tpu") == heads_major
    # P + R - 1 = 10 columns, rounded up to 16: the ring has 10 columns for 4 tokens.
    assert cache_length(P, GREEDY, config.kv_layout("tpu")) == 16
    assert cache_length(P, GREEDY, CONFIG.kv_layout("tpu")) == P + R - 1
    rule = KVLayout.for_model
    monkeypatch.setattr(KVLayout, "for_model", lambda head_dim, platform: rule(head_dim, "tpu"))
    model = init_random(config, seed=0)
    naive = _naive_greedy(_full_forward(model), nnx.state(model), prompts, R)
    _assert_greedy_matches(_engine(model), prompts, naive)


def _assert_greedy_matches(rollout, prompts: Batch, naive: tuple[np.ndarray, np.ndarray]) -> None:
    tokens, logits = naive
    out = _generate(rollout, prompts, GREEDY)
    np.testing.assert_array_equal(out["responses"], tokens)
    np.testing.assert_array_equal(out["response_mask"], np.ones_like(tokens))
    expected = _token_log_probs(logits[:, P - 1 : -1], tokens, 1.0)
    np.testing.assert_allclose(out["rollout_log_probs"], expected, atol=1e-4)


def test_sliding_window_over_the_ring_of_generated_tokens(prompts):
    """One slot takes the rows one after another and the first row stops early (EOS), so the
    later rows' tokens start mid-ring; a 3-token window must still see what the full forward
    sees (it crosses from the prompt into the ring)."""
    config = tiny_llama(
        model_type="mistral",
        sliding_window=3,
        layer_types=None,
        pad_token_id=PAD,
        initializer_range=0.5,
    )
    model = init_random(config, seed=1)
    tokens, _ = _naive_greedy(_full_forward(model), nnx.state(model), prompts, R)
    eos = (int(tokens[0, 1]),)
    one_slot = EngineLimits(max_num_seqs=1, max_num_batched_tokens=P)
    rollout = JaxRollout(
        model, response_length=R, pad_token_id=PAD, eos_token_ids=eos, limits=one_slot
    )
    out = _generate(rollout, prompts, dataclasses.replace(GREEDY, eos_token_ids=eos))
    responses, mask = _expected_after_eos(tokens, eos)
    assert mask[0].sum() == 2 and mask[1:].sum() >= 6 and rollout.stats["rollout/slots"] == 1
    np.testing.assert_array_equal(out["responses"], responses)
    np.testing.assert_array_equal(out["response_mask"], mask)


def _expected_after_eos(tokens: np.ndarray, eos: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    is_eos = np.isin(tokens, eos)
    seen_before = (np.cumsum(is_eos, axis=1) - is_eos) > 0
    return np.where(seen_before, PAD, tokens), (~seen_before).astype(np.int32)


def test_eos_stops_rows_and_masks(rollout, prompts, naive):
    tokens = naive[0]
    eos = (int(tokens[0, 1]), int(tokens[1, 2]))
    params = dataclasses.replace(GREEDY, eos_token_ids=eos)
    out = _generate(rollout, prompts, params)
    responses, mask = _expected_after_eos(tokens, eos)
    assert mask.sum() < mask.size
    np.testing.assert_array_equal(out["responses"], responses)
    np.testing.assert_array_equal(out["response_mask"], mask)
    assert np.all(out["rollout_log_probs"][mask == 0] == 0)
    assert np.all(out["rollout_log_probs"][mask == 1] < 0)

    ignored = _generate(rollout, prompts, dataclasses.replace(params, ignore_eos=True))
    np.testing.assert_array_equal(ignored["responses"], tokens)
    np.testing.assert_array_equal(ignored["response_mask"], np.ones_like(tokens))


def test_every_row_finishing_at_its_first_token(rollout, prompts, naive):
    eos = tuple(sorted({int(t) for t in naive[0][:, 0]}))
    out = _generate(rollout, prompts, dataclasses.replace(GREEDY, eos_token_ids=eos))
    np.testing.assert_array_equal(out["responses"][:, 0], naive[0][:, 0])
    np.testing.assert_array_equal(out["responses"][:, 1:], PAD)
    np.testing.assert_array_equal(out["response_mask"].sum(1), 1)


def test_rollout_sampling_layout_and_log_probs(model, rollout, prompts, forward):
    sampling = sampling_params(SAMPLING, rollout)
    assert (sampling.eos_token_ids, sampling.pad_token_id) == (rollout.eos_token_ids, PAD)
    sampling = dataclasses.replace(sampling, max_new_tokens=R - 2)
    out = rollout.generate(prompts, sampling, jax.random.key(0))
    rows = len(prompts) * 2
    assert {k: out[k].shape for k in out.tensors} == {
        "prompts": (rows, P),
        "responses": (rows, R),
        "response_mask": (rows, R),
        "rollout_log_probs": (rows, R),
        "input_ids": (rows, P + R),
        "attention_mask": (rows, P + R),
        "position_ids": (rows, P + R),
    }
    assert out["uid"].tolist() == ["a", "a", "b", "b", "c", "c"]
    repeated = prompts.repeat(2, interleave=True)
    np.testing.assert_array_equal(out["prompts"], repeated["input_ids"])
    np.testing.assert_array_equal(
        out["input_ids"], np.concatenate([out["prompts"], out["responses"]], 1)
    )
    np.testing.assert_array_equal(
        out["attention_mask"],
        np.concatenate([repeated["attention_mask"], out["response_mask"]], 1),
    )
    last = repeated["position_ids"][:, -1:]
    np.testing.assert_array_equal(out["position_ids"][:, :P], repeated["position_ids"])
    np.testing.assert_array_equal(out["position_ids"][:, P:], last + 1 + np.arange(R))
    # Columns past max_new_tokens are padding.
    np.testing.assert_array_equal(out["responses"][:, R - 2 :], PAD)
    np.testing.assert_array_equal(out["response_mask"][:, R - 2 :], 0)

    responses, mask = np.asarray(out["responses"]), np.asarray(out["response_mask"])
    logits = forward(nnx.state(model), out["input_ids"], out["attention_mask"], out["position_ids"])
    # processed_logprobs: of the tempered logits with top-k 20 and top-p 0.95 applied
    processed = apply_top_p(apply_top_k(np.asarray(logits)[:, P - 1 : -1] / 0.7, 20), 0.95)
    expected = np.where(mask == 1, _token_log_probs(processed, responses, 1.0), 0.0)
    np.testing.assert_allclose(out["rollout_log_probs"], expected, atol=1e-4)

    again = rollout.generate(prompts, sampling, jax.random.key(0))
    other = rollout.generate(prompts, sampling, jax.random.key(1))
    np.testing.assert_array_equal(again["responses"], responses)
    assert not np.array_equal(other["responses"], responses)
    assert not np.array_equal(responses[0::2], responses[1::2])


def test_update_weights_and_validation_sampling(rollout, prompts, forward):
    """New weights take effect; `val_kwargs` (temperature 0, do_sample False) decode greedily."""
    other = init_random(CONFIG, seed=1)
    rollout.update_weights(nnx.state(other))
    try:
        validation = sampling_params(VALIDATION, rollout)
        assert validation.greedy and validation.n == 1
        out = rollout.generate(prompts, validation, jax.random.key(0))
        tokens = _naive_greedy(forward, nnx.state(other), prompts, R)[0]
        responses, mask = _expected_after_eos(tokens, (1,))
        np.testing.assert_array_equal(out["responses"], responses)
        np.testing.assert_array_equal(out["response_mask"], mask)
        half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(other))
        rollout.update_weights(half)
        assert {x.dtype for x in jax.tree.leaves(rollout.state)} == {jnp.dtype(jnp.float32)}
        smaller = init_random(dataclasses.replace(CONFIG, vocab_size=32), seed=0)
        with pytest.raises(ValueError, match="shape"):
            rollout.update_weights(nnx.state(smaller))
    finally:
        rollout.update_weights(nnx.state(init_random(CONFIG, seed=0)))


def test_bad_inputs_fail_clearly(model, rollout, prompts):
    right_padded = Batch({k: np.flip(v, axis=1) for k, v in prompts.tensors.items()})
    with pytest.raises(ValueError, match=r"rows \[1, 2\].*left-padded"):
        rollout.generate(right_padded, GREEDY, jax.random.key(0))
    with pytest.raises(KeyError, match="position_ids"):
        rollout.generate(prompts.select(["input_ids", "attention_mask"]), GREEDY, jax.random.key(0))
    with pytest.raises(ValueError, match="pad_token_id"):
        rollout.generate(prompts, dataclasses.replace(GREEDY, pad_token_id=3), jax.random.key(0))
    with pytest.raises(ValueError, match="response_length"):
        rollout.generate(
            prompts, dataclasses.replace(GREEDY, max_new_tokens=R + 1), jax.random.key(0)
        )


def test_make_rollout(model):
    spec = tiny_rollout_spec(name="sglang", response_length=4)
    tokens = {"pad_token_id": PAD, "eos_token_ids": [1, 2]}
    made = make_rollout("jax", model, spec, **tokens)
    assert isinstance(made, JaxRollout) and made.eos_token_ids == (1, 2)
    assert made.response_length == 4 and made.limits == spec.limits
    with pytest.raises(ValueError, match="rollout.name=sglang has no engine of its own"):
        make_rollout("sglang", model, spec, **tokens)  # the JAX sampler serves it
    with pytest.raises(ValueError, match="rollout.name='nope' is unknown"):
        make_rollout("nope", model, spec, **tokens)
