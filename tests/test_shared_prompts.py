"""Packed rows in which the answers of one prompt share it (`jrl.trainer.update.packing`): the
prompt is laid out once per group, and log-probs, values and gradients stay those of the padded
rows."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from helpers import padded_rows, tiny_gemma2
from ml_collections import ConfigDict

from jrl.models import init_random
from jrl.parallel import make_mesh
from jrl.runspec.reads import KeyReads
from jrl.runspec.roles import LOG_PROB_KEYS, BatchSplit, batch_split, packing
from jrl.trainer.roles.critic import response_values
from jrl.trainer.roles.log_probs import response_log_probs
from jrl.trainer.roles.specs import shares_prompts
from jrl.trainer.update.packing import PACK_SHARED, PACK_SOURCE, PACK_START, with_packing

# Gemma 2: sliding-window layers (the window counts positions, not packed slots) and soft-caps.
CONFIG = tiny_gemma2(sliding_window=5)
PROMPT, RESPONSE, ANSWERS = 12, 4, 4


def _grouped_batch(prompt_lens: list[int], response_lens: list[int], seed: int = 0) -> dict:
    """`ANSWERS` rows per prompt (prompt i's answers are rows i, i + groups, ...: not adjacent),
    each with its own response."""
    groups = len(prompt_lens)
    rows = padded_rows(
        np.tile(prompt_lens, ANSWERS),
        response_lens,
        PROMPT,
        RESPONSE,
        CONFIG.vocab_size,
        np.random.default_rng(seed),
    )
    for row in range(groups, len(response_lens)):  # the same prompt as row % groups
        for key in ("input_ids", "attention_mask", "position_ids"):
            rows[key][row, :PROMPT] = rows[key][row % groups, :PROMPT]
    return rows


PROMPT_LENS = [11, 9, 12, 10]
RESPONSE_LENS = [4, 2, 3, 1, 4, 4, 2, 3, 1, 2, 4, 3, 2, 1, 3, 4]


def _loss(model, tensors, layout=None):
    log_prob, _ = response_log_probs(model, tensors, 0.8, layout)
    mask = tensors["response_mask"]
    return -jnp.sum(log_prob * mask) / jnp.sum(mask)


def test_shared_prompts_give_the_padded_log_probs_values_and_gradients():
    tensors = _grouped_batch(PROMPT_LENS, RESPONSE_LENS)
    mask = tensors["response_mask"].astype(bool)
    shared, layout = with_packing(tensors, len(RESPONSE_LENS), None, share_prompts=True)
    _, sequences = with_packing(tensors, len(RESPONSE_LENS), None)
    assert layout.shared_prompts and layout.length == PROMPT + ANSWERS * RESPONSE
    # each prompt is laid out once: 4 groups of about 11 + 4 * 3 tokens need fewer slots
    assert layout.rows * layout.length < sequences.rows * sequences.length
    assert len(set(shared[PACK_SOURCE])) == len(PROMPT_LENS)
    np.testing.assert_array_equal(shared[PACK_SHARED], np.tile(PROMPT_LENS, ANSWERS))
    assert np.sum(shared[PACK_START] != shared[PACK_SOURCE]) == len(RESPONSE_LENS) - 4

    lm = init_random(CONFIG, seed=3)
    padded, packed = jax.jit(
        lambda t: (response_log_probs(lm, t, 0.8), response_log_probs(lm, t, 0.8, layout))
    )(shared)
    for a, b in zip(padded, packed, strict=True):  # log-probs, entropy
        np.testing.assert_allclose(np.asarray(b)[mask], np.asarray(a)[mask], atol=1e-5)

    graphdef, params = nnx.split(lm)
    grads = jax.jit(
        jax.grad(lambda p, t, packed: _loss(nnx.merge(graphdef, p), t, packed), argnums=0),
        static_argnums=2,
    )
    for a, b in zip(
        jax.tree.leaves(grads(params, shared, None)),
        jax.tree.leaves(grads(params, shared, layout)),
        strict=True,
    ):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)

    critic = init_random(CONFIG, kind="value", seed=4)
    padded_v, packed_v = jax.jit(
        lambda t: (response_values(critic, t), response_values(critic, t, layout))
    )(shared)
    np.testing.assert_allclose(packed_v, padded_v, atol=1e-5)


def _one_prompt(prompt: int, response: int) -> dict:
    """4 answers of `response` tokens to one prompt of `prompt` tokens."""
    rows = padded_rows([prompt] * 4, [response] * 4, prompt, response, 8, np.random.default_rng(0))
    for key in ("input_ids", "attention_mask", "position_ids"):
        rows[key][1:, :prompt] = rows[key][0, :prompt]
    return rows


def test_long_shared_rows_keep_plain_packing():
    """Shared rows of T + 3R = 10240 tokens would attend far more than the 4 rows of 4096 they
    replace: `layout_cost` keeps the rows one by one; with answers of 64 tokens, one row shares."""
    shared, layout = with_packing(_one_prompt(2048, 2048), 4, None, share_prompts=True)
    assert not layout.shared_prompts and layout.length == 4096
    assert PACK_SOURCE not in shared
    _, layout = with_packing(_one_prompt(2048, 64), 4, None, share_prompts=True)
    assert layout.shared_prompts and layout.rows == 1


def _split(packed: bool, n: int, attention: str | None = None) -> BatchSplit:
    """The log-prob split of a model section with `use_remove_padding` = `packed` and the
    attention `attention`, for `n` answers per prompt."""
    override = {} if attention is None else {"attn_implementation": attention}
    model = KeyReads(ConfigDict({"use_remove_padding": packed, "override_config": override}))
    section = {"log_prob_use_dynamic_bsz": False, "log_prob_micro_batch_size_per_gpu": 1}
    return batch_split(KeyReads(ConfigDict(section)), "ref", LOG_PROB_KEYS, packing(model, n))


def test_prompts_are_shared_only_where_the_run_can():
    packed, flash = _split(True, 4), _split(True, 4, "flash_attention_2")
    mesh = make_mesh(1)
    assert shares_prompts(packed, mesh)
    assert shares_prompts(flash, mesh)  # CPU: XLA's attention takes the mask
    assert not shares_prompts(_split(True, 1), mesh)  # one answer per prompt: nothing to share
    assert not shares_prompts(_split(False, 4), mesh)
    # a stand-in for a TPU slice's mesh (its devices' platform and axis sizes are all that is read)
    tpu = types.SimpleNamespace(
        devices=np.array([types.SimpleNamespace(platform="tpu")]), shape={"fsdp": 4}
    )
    assert not shares_prompts(flash, tpu)  # the splash kernel has no mask for shared prompts
    assert shares_prompts(packed, tpu)
    sequence_parallel = types.SimpleNamespace(devices=mesh.devices, shape={"sequence": 2})
    assert not shares_prompts(packed, sequence_parallel)
