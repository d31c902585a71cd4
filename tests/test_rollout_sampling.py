"""Sampling parameters and token selection, checked against numpy references."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jrl.rollout.sampling import SamplingParams
from jrl.rollout.selection import (
    apply_top_k,
    apply_top_p,
    categorical,
    first_argmax,
    gumbel_noise,
    row_keys,
    select_tokens,
    threefry_bits,
    token_log_probs,
)
from jrl.runspec.rollout import ROLLOUT, sampling_settings

ROLLOUT_CFG = {
    "response_length": 12,
    "temperature": 0.7,
    "top_k": 5,
    "top_p": 0.9,
    "do_sample": True,
    "n": 4,
    "ignore_eos": False,
    "calculate_log_probs": True,
    "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False},
}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _top_k_reference(logits: np.ndarray, k: int) -> np.ndarray:
    out = logits.copy()
    for row in out:
        if 0 < k < row.size:
            kth = np.sort(row)[::-1][k - 1]
            row[row < kth] = -np.inf
    return out


def _top_p_reference(logits: np.ndarray, p: float) -> np.ndarray:
    out = logits.copy()
    for row, probs in zip(out, _softmax(logits), strict=True):
        order = np.argsort(-probs, kind="stable")
        total, keep = 0.0, []
        for i in order:
            keep.append(i)
            total += probs[i]
            if total >= p:
                break
        cutoff = probs[keep].min()
        row[probs < cutoff] = -np.inf
    return out


@pytest.fixture(scope="module")
def logits() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(6, 16)).astype(np.float32) * 2


@pytest.mark.parametrize("k", [-1, 0, 1, 3, 16, 40])
def test_top_k_matches_reference(logits, k):
    np.testing.assert_array_equal(
        np.asarray(apply_top_k(jnp.asarray(logits), k)), _top_k_reference(logits, k)
    )


def test_top_k_keeps_ties():
    row = jnp.asarray([[1.0, 3.0, 3.0, 0.0]])
    np.testing.assert_array_equal(apply_top_k(row, 1), [[-np.inf, 3.0, 3.0, -np.inf]])


@pytest.mark.parametrize("p", [1e-4, 0.3, 0.75, 0.95, 1.0])
def test_top_p_matches_reference(logits, p):
    got = np.asarray(apply_top_p(jnp.asarray(logits), p))
    np.testing.assert_array_equal(got, _top_p_reference(logits, p))
    assert np.isfinite(got).sum(-1).min() >= 1


def test_params_validation_and_greedy():
    assert SamplingParams(4, do_sample=False, temperature=1.0).greedy
    assert SamplingParams(4, temperature=0.0).greedy
    assert not SamplingParams(4, temperature=0.5).greedy
    assert SamplingParams(4, eos_token_ids=[2, 3]).eos_token_ids == (2, 3)
    assert SamplingParams(4, eos_token_ids=None).eos_token_ids == ()
    assert SamplingParams(4, eos_token_ids=7).eos_token_ids == (7,)
    assert SamplingParams(4, temperature=0.0).log_prob_temperature == 1.0
    for bad in ({"top_p": 0.0}, {"temperature": -1.0}, {"n": 0}, {"top_k": -2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(4, **bad)


@pytest.mark.parametrize("as_config_dict", [False, True])
def test_sampling_settings_from_the_rollout_section(as_config_dict):
    cfg = ml_collections.ConfigDict(ROLLOUT_CFG) if as_config_dict else ROLLOUT_CFG
    train = sampling_settings(cfg, ROLLOUT)
    assert train == SamplingParams(
        max_new_tokens=12,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        do_sample=True,
        n=4,
        calculate_log_probs=True,
    )
    val = sampling_settings(cfg, ROLLOUT, validate=True)
    assert (val.temperature, val.top_k, val.top_p, val.n, val.greedy) == (0.0, -1, 1.0, 1, True)
    assert val.calculate_log_probs


def test_sampling_settings_errors_name_the_key():
    cfg = {k: v for k, v in ROLLOUT_CFG.items() if k != "top_p"}
    with pytest.raises(KeyError, match="actor_rollout_ref.rollout.top_p"):
        sampling_settings(cfg, ROLLOUT)
    cfg = {**ROLLOUT_CFG, "val_kwargs": {**ROLLOUT_CFG["val_kwargs"], "n": 0}}
    with pytest.raises(ValueError, match="val_kwargs.*n=0"):
        sampling_settings(cfg, ROLLOUT, validate=True)


def test_greedy_selection_and_log_probs(logits):
    params = SamplingParams(4, temperature=0.0, calculate_log_probs=True)
    keys = row_keys(jax.random.key(0), jnp.arange(len(logits)), jnp.zeros(len(logits), int))
    tokens, logp = select_tokens(jnp.asarray(logits), keys, params)
    np.testing.assert_array_equal(tokens, logits.argmax(-1))
    expected = np.log(_softmax(logits.astype(np.float64)))[
        np.arange(len(logits)), logits.argmax(-1)
    ]
    np.testing.assert_allclose(logp, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        token_log_probs(jnp.asarray(logits), tokens, 0.5),
        np.log(_softmax(logits.astype(np.float64) / 0.5))[np.arange(len(logits)), tokens],
        rtol=1e-5,
        atol=1e-5,
    )


def test_sampling_follows_filtered_distribution():
    rows = 4000
    row = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, 2.2], np.float32)
    params = SamplingParams(4, temperature=0.8, top_k=5, top_p=0.9, calculate_log_probs=True)
    expected = _softmax(_top_p_reference(_top_k_reference(row[None] / 0.8, 5), 0.9))[0]
    logits = jnp.asarray(np.tile(row, (rows, 1)))

    @jax.jit
    def select(rng):
        return select_tokens(logits, row_keys(rng, jnp.arange(rows), jnp.full(rows, 7)), params)

    tokens, logp = select(jax.random.key(3))
    freq = np.bincount(np.asarray(tokens), minlength=row.size) / rows
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(expected))
    np.testing.assert_allclose(freq, expected, atol=0.03)
    # processed_logprobs (the default): of the distribution sampled from, as vLLM returns them
    np.testing.assert_allclose(logp, np.log(expected)[np.asarray(tokens)], atol=1e-5)
    raw = dataclasses.replace(params, logprobs_mode="raw_logprobs")
    _, raw_logp = select_tokens(
        logits[:8], row_keys(jax.random.key(3), jnp.arange(8), jnp.full(8, 7)), raw
    )
    raw_tokens = np.asarray(tokens)[:8]
    np.testing.assert_allclose(raw_logp, np.log(_softmax(row))[raw_tokens], atol=1e-5)
    again, _ = select(jax.random.key(3))
    other, _ = select(jax.random.key(4))
    np.testing.assert_array_equal(tokens, again)
    assert (np.asarray(tokens) != np.asarray(other)).mean() > 0.3


def test_row_keys_follow_row_and_step_only():
    rng = jax.random.key(0)
    data = jax.random.key_data
    keys = row_keys(rng, jnp.asarray([3, 5, 3]), jnp.asarray([2, 2, 2]))
    np.testing.assert_array_equal(data(keys[0]), data(keys[2]))
    assert not np.array_equal(data(keys[0]), data(keys[1]))
    expected = jax.random.fold_in(jax.random.fold_in(rng, 5), 2)
    np.testing.assert_array_equal(data(keys[1]), data(expected))
    later = row_keys(rng, jnp.asarray([3]), jnp.asarray([3]))
    assert not np.array_equal(data(later[0]), data(keys[0]))


def test_the_sampler_draws_jax_s_own_categorical_bit_for_bit():
    """The written-out Threefry, Gumbel noise and first-argmax draw the tokens
    `jax.random.categorical` draws (an odd width, -inf logits of top-k / top-p included)."""
    width = 1001
    keys = row_keys(jax.random.key(11), jnp.arange(64), jnp.full(64, 5))
    logits = jax.random.normal(jax.random.key(1), (64, width)) * 4
    logits = logits.at[:, ::3].set(-jnp.inf)
    one_row = jax.vmap(lambda key: jax.random.bits(key, (width,)))
    np.testing.assert_array_equal(
        jax.jit(threefry_bits, static_argnums=1)(jax.random.key_data(keys), width),
        one_row(keys),
    )
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (width,)))
    np.testing.assert_array_equal(
        jax.jit(gumbel_noise, static_argnums=1)(keys, width), gumbel(keys)
    )
    tokens = jax.jit(categorical)(keys, logits)
    np.testing.assert_array_equal(tokens, jax.vmap(jax.random.categorical)(keys, logits))
    assert len(set(np.asarray(tokens).tolist())) > 30
    ties = jnp.asarray([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 5.0]])
    np.testing.assert_array_equal(first_argmax(ties), jnp.argmax(ties, axis=-1))


@pytest.mark.parametrize("width", [512, 500])  # in blocks of ARGMAX_BLOCK, and not
def test_first_argmax_finds_the_first_maximum_in_blocks_and_not(width):
    """Rows with many ties (a few distinct values), the maximum in the last block only, all
    equal, -inf entries: the first index of the maximum, as `jnp.argmax`; an all-NaN row: the last
    index. The Gumbel draw over such a width is JAX's own too."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, size=(16, width)).astype(np.float32)
    x[1] = 0.0
    x[1, -3] = 1.0  # only in the last block
    x[2] = 7.0
    x[3, ::2] = -np.inf
    x[4, [5, 300]] = 9.0  # the same maximum in two blocks
    x[5, [300, 5]] = [9.0, 8.0]
    got = jax.jit(first_argmax)(jnp.asarray(x))
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    x[6] = np.nan
    assert int(jax.jit(first_argmax)(jnp.asarray(x))[6]) == width - 1
    keys = jax.random.split(jax.random.key(3), 16)
    logits = jnp.asarray(rng.normal(size=(16, width)), jnp.float32)
    np.testing.assert_array_equal(
        jax.jit(categorical)(keys, logits), jax.vmap(jax.random.categorical)(keys, logits)
    )
