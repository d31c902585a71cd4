"""Math on one tile of logits, shared by every tiled implementation (XLA and Pallas alike).

A tile is `z = hidden_rows @ lm_head_columns` in float32, shape [rows, cols]. Per-row values are
kept as [rows, 1] columns so that the same code runs inside Mosaic and Triton kernels. `valid`
marks the columns that belong to this tile (inside the vocabulary and not already counted by an
earlier tile); `onehot` marks each row's target column.

The online softmax state of a row is `Stats(m, a, b, t)`: running max `m`, `a = Σ exp(l - m)`,
`b = Σ exp(l - m) · l` and the target's logit `t`, over the tempered logits `l` seen so far. From
it, lse = m + log a, E[l] = b / a, log p(target) = t - lse and H = lse - E[l]. Finished results
over some columns are the state `Stats(lse, 1, E[l], log p + lse)` (`finished_stats`), so states of
disjoint column ranges merge across devices too (`all_reduce_stats`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class Stats(NamedTuple):
    """Online softmax state of each row (arrays of equal shape, float32)."""

    m: jax.Array
    a: jax.Array
    b: jax.Array
    t: jax.Array


def empty_stats(shape: tuple[int, ...]) -> Stats:
    """The state before any column: max -inf, sums zero."""
    zeros = jnp.zeros(shape, jnp.float32)
    return Stats(jnp.full(shape, -jnp.inf, jnp.float32), zeros, zeros, zeros)


def tempered(z: jax.Array, temperature: jax.Array | float, softcap: float | None):
    """(logits l, tanh(z / softcap) or None): l = softcap·tanh(z/softcap)/T, or z/T without cap."""
    if softcap is None:
        return z / temperature, None
    th = jnp.tanh(z / softcap)
    return (softcap * th) / temperature, th


def tile_stats(logits: jax.Array, valid: jax.Array, onehot: jax.Array) -> Stats:
    """Softmax state of one tile's valid columns (all-invalid rows give the empty state)."""
    masked = jnp.where(valid, logits, -jnp.inf)
    m = jnp.max(masked, axis=-1, keepdims=True)
    e = jnp.where(valid, jnp.exp(masked - m), 0.0)
    a = jnp.sum(e, axis=-1, keepdims=True)
    b = jnp.sum(e * jnp.where(valid, logits, 0.0), axis=-1, keepdims=True)
    t = jnp.sum(jnp.where(valid & onehot, logits, 0.0), axis=-1, keepdims=True)
    return Stats(m, a, b, t)


def _rescale(m_old: jax.Array, m_new: jax.Array) -> jax.Array:
    """exp(m_old - m_new), taken as 0 where m_old is -inf (no column seen yet)."""
    return jnp.where(m_old == -jnp.inf, 0.0, jnp.exp(m_old - m_new))


def merge_stats(x: Stats, y: Stats) -> Stats:
    """The state over the columns of both `x` and `y`."""
    m = jnp.maximum(x.m, y.m)
    sx, sy = _rescale(x.m, m), _rescale(y.m, m)
    return Stats(m, x.a * sx + y.a * sy, x.b * sx + y.b * sy, x.t + y.t)


def reduce_stats(stats: Stats, axis: int) -> Stats:
    """Merges states stacked along `axis` (partial results over disjoint column ranges)."""
    m = jnp.max(stats.m, axis=axis, keepdims=True)
    scale = _rescale(stats.m, m)
    return Stats(
        jnp.squeeze(m, axis),
        jnp.sum(stats.a * scale, axis=axis),
        jnp.sum(stats.b * scale, axis=axis),
        jnp.sum(stats.t, axis=axis),
    )


def all_reduce_stats(stats: Stats, axes: tuple[str, ...]) -> Stats:
    """Merges the states that the devices along mesh `axes` hold for disjoint column ranges
    (inside a `shard_map`): m = pmax(m_i), a = psum(a_i·exp(m_i - m)), b likewise, t = psum(t_i)."""
    m = lax.pmax(stats.m, axes)
    scale = _rescale(stats.m, m)
    return Stats(m, *lax.psum((stats.a * scale, stats.b * scale, stats.t), axes))


def finished_stats(logprob: jax.Array, lse: jax.Array, mean: jax.Array) -> Stats:
    """The state of the columns that `finish` turned into (log p, lse, E[l]): m = lse, a = 1,
    b = E[l], t = log p + lse (the target's logit; 0 when the target is not among them)."""
    return Stats(lse, jnp.ones_like(lse), mean, logprob + lse)


def finish(stats: Stats) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(log p(target), entropy, lse, E[l]) from the state over the whole vocabulary."""
    lse = stats.m + jnp.log(stats.a)
    mean = stats.b / stats.a
    return stats.t - lse, lse - mean, lse, mean


def tile_dlogits(
    z: jax.Array,
    valid: jax.Array,
    onehot: jax.Array,
    temperature: jax.Array | float,
    softcap: float | None,
    lse: jax.Array,
    mean: jax.Array,
    g_logprob: jax.Array,
    g_entropy: jax.Array,
) -> jax.Array:
    """dL/dz of one tile (float32, zero outside `valid`) for cotangents `g_logprob`, `g_entropy`.

    With p = softmax(l): dL/dl = g_lp·(onehot - p) - g_H·p·(l - E[l]); then through l = z/T or
    l = softcap·tanh(z/softcap)/T.
    """
    logits, th = tempered(z, temperature, softcap)
    p = jnp.exp(logits - lse)
    dl = g_logprob * (jnp.where(onehot, 1.0, 0.0) - p) - g_entropy * p * (logits - mean)
    dz = dl / temperature
    if th is not None:
        dz = dz * (1.0 - th * th)
    return jnp.where(valid, dz, 0.0)
