"""Batched generation on the device: one prefill, then a `lax.while_loop` of cached decode steps."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jrl.rollout.sampling import SamplingParams, select_tokens


def prompt_positions(prompt_mask: jax.Array) -> jax.Array:
    """Position ids of a left-padded prompt: 0 at its first valid token, 0 on the padding."""
    return jnp.maximum(jnp.cumsum(prompt_mask.astype(jnp.int32), axis=-1) - 1, 0)


def _is_eos(tokens: jax.Array, params: SamplingParams) -> jax.Array:
    if params.ignore_eos or not params.eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(params.eos_token_ids, jnp.int32))


def _response_mask(responses: jax.Array, params: SamplingParams) -> jax.Array:
    """1 up to and including each row's first EOS, 0 after it."""
    eos = _is_eos(responses, params).astype(jnp.int32)
    return (jnp.cumsum(eos, axis=-1) - eos == 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "params"))
def generate_tokens(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    params: SamplingParams,
) -> dict[str, Any]:
    """Generate up to `params.max_new_tokens` tokens after left-padded prompts [B, P].

    Returns `responses` [B, R] int32 (EOS kept, `pad_token_id` after it), `response_mask` [B, R]
    int32 and, with `calculate_log_probs`, `rollout_log_probs` [B, R] float32 (0 where masked).
    Step t samples with `fold_in(rng, t)`; the loop ends once every row has emitted an EOS.
    """
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompt_ids.shape
    steps = params.max_new_tokens
    prompt_mask = prompt_mask.astype(bool)
    kv_mask = jnp.concatenate([prompt_mask, jnp.ones((batch, steps - 1), bool)], axis=1)
    cache = model.init_cache(batch, prompt_len + steps - 1)

    hidden, cache = model.forward_cached(
        prompt_ids, prompt_positions(prompt_mask), cache, 0, kv_mask
    )
    first, first_logp = select_tokens(
        model.logits(hidden[:, -1]), jax.random.fold_in(rng, 0), params
    )
    responses = jnp.full((batch, steps), params.pad_token_id, jnp.int32).at[:, 0].set(first)
    log_probs = jnp.zeros((batch, steps), jnp.float32).at[:, 0].set(first_logp)
    next_position = jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32)

    def not_done(carry):
        t, _, _, finished, _ = carry
        return (t < steps) & ~jnp.all(finished)

    def decode_step(carry):
        t, responses, log_probs, finished, cache = carry
        last = jax.lax.dynamic_slice_in_dim(responses, t - 1, 1, axis=1)
        positions = (next_position + t - 1)[:, None]
        hidden, cache = model.forward_cached(last, positions, cache, prompt_len + t - 1, kv_mask)
        tokens, logp = select_tokens(model.logits(hidden[:, 0]), jax.random.fold_in(rng, t), params)
        tokens = jnp.where(finished, params.pad_token_id, tokens)
        responses = responses.at[:, t].set(tokens)
        log_probs = log_probs.at[:, t].set(logp)
        return t + 1, responses, log_probs, finished | _is_eos(tokens, params), cache

    carry = (jnp.int32(1), responses, log_probs, _is_eos(first, params), cache)
    _, responses, log_probs, _, _ = jax.lax.while_loop(not_done, decode_step, carry)

    response_mask = _response_mask(responses, params)
    out = {"responses": responses, "response_mask": response_mask}
    if params.calculate_log_probs:
        out["rollout_log_probs"] = log_probs * response_mask
    return out
