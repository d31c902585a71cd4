"""Chunked XLA implementation: a loop over vocabulary chunks with plain `jnp.dot`, on any backend.

Only one chunk of logits ([N, width] float32) lives at a time, forward and backward; nothing per
chunk is kept for the backward pass (it recomputes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jrl_kernels.fused import Kernels, chunk_bounds, chunk_width
from jrl_kernels.tiles import empty_stats, finish, merge_stats, tempered, tile_dlogits, tile_stats

# Elements of one chunk of logits, its alignment and largest width (columns).
CHUNK_ELEMENTS = 1 << 25
CHUNK_ALIGN = 512
MAX_CHUNK = 8192


def _chunk_logits(hidden: jax.Array, chunk: jax.Array, targets: jax.Array, first: jax.Array):
    """(z [N, w] float32, valid columns, target one-hot) of one chunk."""
    z = jnp.dot(hidden, chunk.astype(hidden.dtype), preferred_element_type=jnp.float32)
    cols = jnp.arange(chunk.shape[1])[None, :]
    return z, cols >= first, cols == targets


def forward(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
    softcap: float | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(log p, entropy, lse, E[l]) [N, 1] with an online softmax over vocabulary chunks."""
    rows = hidden.shape[0]
    vocab = lm_head.shape[1]
    width = chunk_width(rows, vocab, CHUNK_ELEMENTS, CHUNK_ALIGN, MAX_CHUNK)

    def body(index, stats):
        start, first = chunk_bounds(index, width, vocab)
        chunk = lax.dynamic_slice_in_dim(lm_head, start, width, axis=1)
        z, valid, onehot = _chunk_logits(hidden, chunk, targets - start, first)
        logits, _ = tempered(z, temperature, softcap)
        return merge_stats(stats, tile_stats(logits, valid, onehot))

    stats = lax.fori_loop(0, -(-vocab // width), body, empty_stats((rows, 1)))
    return finish(stats)


def dlogits(
    hidden: jax.Array,
    chunk: jax.Array,
    targets: jax.Array,
    first: jax.Array,
    temperature: jax.Array,
    softcap: float | None,
    lse: jax.Array,
    mean: jax.Array,
    g_logprob: jax.Array,
    g_entropy: jax.Array,
) -> jax.Array:
    """dL/dz of one chunk [N, w] in the hidden dtype."""
    z, valid, onehot = _chunk_logits(hidden, chunk, targets, first)
    dz = tile_dlogits(z, valid, onehot, temperature, softcap, lse, mean, g_logprob, g_entropy)
    return dz.astype(hidden.dtype)


KERNELS = Kernels("chunked", forward, dlogits, CHUNK_ELEMENTS, CHUNK_ALIGN, MAX_CHUNK)
