"""Pure-JAX token selection: temperature, top-k, top-p and greedy picks with per-row keys, and the
log-probs of the picked tokens (`SamplingParams` says how)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jrl.rollout.sampling import SamplingParams
from jrl_kernels import tempered_logprob_entropy


def apply_top_k(logits: jax.Array, top_k: int) -> jax.Array:
    """Set every logit below the k-th largest of its row to -inf (ties at the k-th are kept)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    return jnp.where(logits < kth, -jnp.inf, logits)


def apply_top_p(logits: jax.Array, top_p: float) -> jax.Array:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`.

    A token stays when the probability of the tokens strictly more likely than it is below
    `top_p`, so the most likely token always stays; ties at the cut-off are kept.
    """
    if top_p >= 1.0:
        return logits
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs = -jnp.sort(-probs, axis=-1)
    before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    kept = jnp.where(before < top_p, sorted_probs, jnp.inf)
    cutoff = jnp.min(kept, axis=-1, keepdims=True)
    return jnp.where(probs < cutoff, -jnp.inf, logits)


def token_log_probs(logits: jax.Array, tokens: jax.Array, temperature: float) -> jax.Array:
    """log_softmax(logits / temperature) at `tokens` (float32): the trainer's log-prob math
    (`jrl_kernels.tempered_logprob_entropy`, which its naive implementation runs) on the logits
    that were computed for sampling."""
    return tempered_logprob_entropy(logits.astype(jnp.float32) / temperature, tokens)[0]


def row_keys(rng: jax.Array, rows: jax.Array, steps: jax.Array) -> jax.Array:
    """The key of token `steps[i]` of row `rows[i]`: fold_in(fold_in(rng, row), step).

    Keys follow the row and the token index only, so samples do not depend on how rows are
    batched, scheduled into cache slots or split over devices.
    """
    fold = jax.random.fold_in
    return jax.vmap(lambda row, step: fold(fold(rng, row), step))(rows, steps)


# The Threefry-2x32 hash (Salmon et al. 2011, as JAX runs it): rotation distances of its two
# alternating groups of four rounds, and the constant of its third key word.
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, distance: int) -> jax.Array:
    return (x << np.uint32(distance)) | (x >> np.uint32(32 - distance))


def threefry_bits(key_data: jax.Array, width: int) -> jax.Array:
    """`jax.random.bits(key, (width,))` of each row's Threefry key (`key_data` [B, 2] uint32)
    as [B, width] uint32, bit for bit: the Threefry-2x32 hash of the counter pairs (0, i), its
    two output words xor-ed (JAX's partitionable Threefry).

    The 20 rounds are written out, so that XLA fuses them into one elementwise pass; XLA:CPU runs
    JAX's own lowering of the hash as a loop of five passes over the whole [B, width] array (a
    9x slower draw for 128 rows of a 49k vocabulary)."""
    k0, k1 = key_data[:, :1], key_data[:, 1:]
    keys = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    x0 = jnp.zeros((1, width), jnp.uint32) + keys[0]
    x1 = jnp.arange(width, dtype=jnp.uint32)[None] + keys[1]
    for block in range(5):
        for distance in _THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotate_left(x1, distance)
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + np.uint32(block + 1)
    return x0 ^ x1


def gumbel_noise(keys: jax.Array, width: int) -> jax.Array:
    """`jax.random.gumbel(key, (width,))` (float32) of each of `keys` [B], as [B, width], bit for
    bit: -log(-log(u)) with u = max(tiny, f (1 - tiny) + tiny), f in [0, 1) from the top 23 of
    `threefry_bits`."""
    bits = threefry_bits(jax.random.key_data(keys), width)
    mantissa = (bits >> np.uint32(9)) | np.uint32(0x3F800000)
    fraction = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1)
    tiny = np.float32(np.finfo(np.float32).tiny)
    uniform = jnp.maximum(tiny, fraction * (np.float32(1) - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform))


ARGMAX_BLOCK = 128  # columns per block of `first_argmax`'s first pass


def first_argmax(x: jax.Array) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` (the first index of each row's maximum, int32) for finite `x`,
    as max and min-index reductions: XLA:CPU runs argmax's paired (value, index) reduction
    without vectorising it, and with the Gumbel noise fused into it took 4x the whole draw.

    A width that is a multiple of `ARGMAX_BLOCK` is searched in two passes: each block's
    maximum (one pass over x), then the first block holding the row's maximum, then the first
    column of that block holding it; XLA:CPU's second pass over the whole row (128 x 49152
    float32: 15.6 ms against 6.0) goes. An all-NaN row gives the last index.
    """
    rows, width = x.shape
    if width % ARGMAX_BLOCK:
        first = _first_index_of(x, jnp.max(x, axis=-1, keepdims=True))
    else:
        count = width // ARGMAX_BLOCK
        blocks = x.reshape(rows, count, ARGMAX_BLOCK)
        block_top = jnp.max(blocks, axis=-1)  # [B, count]
        top = jnp.max(block_top, axis=-1, keepdims=True)
        block = jnp.minimum(_first_index_of(block_top, top), count - 1)
        within = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, block]
        column = _first_index_of(within, top)
        first = jnp.where(column < ARGMAX_BLOCK, block * ARGMAX_BLOCK + column, width)
    return jnp.minimum(first, width - 1)  # a NaN row: the last token, not past the vocabulary


def _first_index_of(x: jax.Array, top: jax.Array) -> jax.Array:
    """The first column of each row of x [B, W] equal to top [B, 1] (int32), W where none is."""
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def _draws_like_jax(keys: jax.Array) -> bool:
    """Whether `gumbel_noise` is JAX's own draw for `keys`: Threefry keys, JAX's partitionable
    Threefry and its default (low dynamic range) Gumbel."""
    return (
        str(jax.random.key_impl(keys)) == "threefry2x32"
        and jax.config.jax_threefry_partitionable
        and not jax.config.jax_high_dynamic_range_gumbel
    )


def categorical(keys: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row of softmax(`logits` [B, V]) with that row's key: the tokens of
    `jax.vmap(jax.random.categorical)(keys, logits)` (the Gumbel-max trick), through
    `gumbel_noise` and `first_argmax` where they are JAX's draw."""
    if not _draws_like_jax(keys):
        return jax.vmap(jax.random.categorical)(keys, logits)
    return first_argmax(logits + gumbel_noise(keys, logits.shape[-1]))


def select_tokens(
    logits: jax.Array, keys: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array]:
    """Pick one token per row of `logits` [B, V] with that row's key (`keys` [B]); returns
    (tokens int32 [B], log-probs float32 [B] as `logprobs_mode` says, zeros unless
    `calculate_log_probs`)."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        tokens = first_argmax(logits)
    else:
        # The barrier keeps the logits in memory: fused into the LM head's matmul, the Gumbel
        # noise made the TPU compiler take 215 s instead of 34 s for a 0.5B rollout of 1024
        # slots (it costs the [B, V] logits once, as calculate_log_probs does anyway).
        logits = jax.lax.optimization_barrier(logits)
        scaled = apply_top_p(apply_top_k(logits / params.temperature, params.top_k), params.top_p)
        tokens = categorical(keys, scaled)
    tokens = tokens.astype(jnp.int32)
    if not params.calculate_log_probs:
        return tokens, jnp.zeros(tokens.shape, jnp.float32)
    if params.logprobs_mode == "raw_logprobs":
        return tokens, token_log_probs(logits, tokens, 1.0)
    if params.greedy or (params.top_k <= 0 and params.top_p >= 1):
        return tokens, token_log_probs(logits, tokens, params.log_prob_temperature)
    picked = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), tokens[:, None], axis=-1)
    return tokens, picked[:, 0]
