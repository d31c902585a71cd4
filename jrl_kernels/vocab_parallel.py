"""The fused log-prob + entropy op split over the vocabulary across the devices of a mesh.

Each of the P devices along mesh `axes` owns the LM head's columns [r·V/P, (r+1)·V/P) (r its
index along `axes`) and its own N/P rows. Forward (one `shard_map`): gather the hidden rows and
targets over `axes`, run the kernel's forward on the device's vocabulary slice (targets shifted by
r·V/P, so a target outside the slice matches no column), turn its (log p, lse, E[l]) into the
slice's online-softmax state (`tiles.finished_stats`), merge the states of all slices
(`tiles.all_reduce_stats`: pmax, psum), finish and keep the device's own rows. Backward (a second
`shard_map`): gather rows, targets, the GLOBAL lse and E[l] and the cotangents, recompute dz on the
slice chunk by chunk (`fused.backward`), keep the slice's d lm_head on the device and
reduce-scatter (psum_scatter) the float32 d hidden partials, dh = Σ_r dz_r W_rᵀ, back to the rows.

No device holds more than V/P columns of the LM head or of its gradient; per device the largest
buffers are the gathered hidden [N, D] and its float32 gradient partial [N, D].
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jrl_kernels import tiles
from jrl_kernels.fused import Kernels, backward


def _gather(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """All devices' rows of `x` along `axes`, in the order of the `P(axes)` layout."""
    return lax.all_gather(x, axes, axis=0, tiled=True)


def _offset(lm_head: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """The first global column of this device's vocabulary slice."""
    return lax.axis_index(axes) * lm_head.shape[1]


def _local_rows(x: jax.Array, rows: int, axes: tuple[str, ...]) -> jax.Array:
    """This device's `rows` rows of the gathered `x`."""
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axes) * rows, rows)


def _forward_shard(
    kernels: Kernels,
    softcap: float | None,
    axes: tuple[str, ...],
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
) -> tuple[jax.Array, ...]:
    """(log p, entropy, lse, E[l]) [n] of this device's n rows over the whole vocabulary."""
    every = _gather(hidden, axes)
    shifted = _gather(targets, axes) - _offset(lm_head, axes)
    logprob, _, lse, mean = kernels.forward(every, lm_head, shifted[:, None], temperature, softcap)
    stats = tiles.all_reduce_stats(tiles.finished_stats(logprob, lse, mean), axes)
    return tuple(_local_rows(x[:, 0], hidden.shape[0], axes) for x in tiles.finish(stats))


def _backward_shard(
    kernels: Kernels,
    softcap: float | None,
    axes: tuple[str, ...],
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
    *rows: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(d hidden of this device's rows, d lm_head of its slice); `rows` = lse, E[l], g_logprob,
    g_entropy of its rows."""
    every = _gather(hidden, axes)
    shifted = _gather(targets, axes) - _offset(lm_head, axes)
    lse, mean, *cotangents = (_gather(x, axes)[:, None] for x in rows)
    d_hidden, d_head = backward(
        kernels,
        softcap,
        every,
        lm_head,
        shifted[:, None],
        temperature,
        lse,
        mean,
        tuple(cotangents),
    )
    d_hidden = lax.psum_scatter(d_hidden, axes, scatter_dimension=0, tiled=True)
    return d_hidden.astype(hidden.dtype), d_head


def _shard_map(fn: Any, mesh: Any, axes: tuple[str, ...], rows: int, out_specs: Any) -> Any:
    """`fn(hidden, lm_head, targets, temperature, *[n] row values)` on each device of `mesh`:
    hidden P(axes, None), lm_head P(None, axes), targets and the `rows` row values P(axes),
    temperature P() (replicated)."""
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(P(axes, None), P(None, axes), P(axes), P(), *[P(axes)] * rows),
        out_specs=out_specs,
        check_vma=False,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def vocab_parallel_logprob_entropy(
    kernels: Kernels,
    softcap: float | None,
    mesh: Any,
    axes: tuple[str, ...],
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy [N] (float32) of hidden [N, D] @ lm_head [D, V] by `kernels`
    with the rows and the vocabulary both split over mesh `axes` of `mesh` (N and V divisible by
    their devices); as `fused.fused_logprob_entropy` otherwise."""
    return _fwd(kernels, softcap, mesh, axes, hidden, lm_head, targets, temperature)[0]


def _fwd(kernels, softcap, mesh, axes, hidden, lm_head, targets, temperature):
    # in: hidden P(axes, None), lm_head P(None, axes), targets P(axes), temperature P();
    # out: log p, entropy, lse, E[l] P(axes) (lse and E[l] over the whole vocabulary).
    rows = P(axes)
    forward = _shard_map(
        functools.partial(_forward_shard, kernels, softcap, axes), mesh, axes, 0, (rows,) * 4
    )
    logprob, entropy, lse, mean = forward(hidden, lm_head, targets, temperature)
    return (logprob, entropy), (hidden, lm_head, targets, temperature, lse, mean)


def _bwd(kernels, softcap, mesh, axes, residuals, cotangents):
    hidden, lm_head, targets, temperature, lse, mean = residuals
    # in: as the forward's, then lse, E[l], g_logprob, g_entropy P(axes);
    # out: d hidden P(axes, None) (reduce-scattered), d lm_head P(None, axes) (each its slice).
    grads = _shard_map(
        functools.partial(_backward_shard, kernels, softcap, axes),
        mesh,
        axes,
        4,
        (P(axes, None), P(None, axes)),
    )
    columns = (g.astype(jnp.float32) for g in cotangents)
    d_hidden, d_head = grads(hidden, lm_head, targets, temperature, lse, mean, *columns)
    return d_hidden, d_head, None, None


vocab_parallel_logprob_entropy.defvjp(_fwd, _bwd)
