"""The fused log-prob + entropy op: a `custom_vjp` whose forward makes one online-softmax pass over
vocabulary tiles and whose backward recomputes the tiles chunk by chunk.

An implementation supplies two tiled passes (`Kernels`): the forward (per-row log p(target),
entropy, lse and E[l]) and `dlogits`, the gradient with respect to the raw logits z of one
vocabulary chunk. The backward loops over chunks of `width` columns: dz of the chunk (never the
whole [N, V]), then dh += dz @ W_cᵀ and dW_c = hᵀ @ dz with float32 accumulation. The last chunk
is shifted left to end at V (no padded copy of the LM head); its first `first` columns belong to
the previous chunk and are masked.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

# forward(hidden [N, D], lm_head [D, V], targets [N, 1] int32, temperature (f32 scalar),
#   softcap) -> (log p, entropy, lse, E[l]), each [N, 1] float32.
Forward = Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array]]
# dlogits(hidden [N, D], chunk [D, w] in the hidden dtype, targets [N, 1] relative to the chunk,
#   first (int32 scalar), temperature, softcap, lse, mean, g_logprob, g_entropy) -> dz [N, w] in
#   the hidden dtype, zero in the columns before `first`.
DLogits = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One implementation of the two tiled passes and the size of its backward chunks: about
    `chunk_elements` elements of dz ([N, width]), width a multiple of `chunk_align` and at most
    `max_chunk` (or V when smaller)."""

    name: str
    forward: Forward
    dlogits: DLogits
    chunk_elements: int
    chunk_align: int
    max_chunk: int


def pallas_kernels(
    name: str,
    forward: Forward,
    dlogits: DLogits,
    chunk_elements: int,
    chunk_align: int,
    max_chunk: int,
    interpret: bool,
) -> Kernels:
    """`Kernels` of Pallas passes that take an `interpret` keyword, bound to `interpret`."""
    return Kernels(
        name,
        functools.partial(forward, interpret=interpret),
        functools.partial(dlogits, interpret=interpret),
        chunk_elements,
        chunk_align,
        max_chunk,
    )


def pallas_dlogits(
    kernel: Callable[..., None],
    hidden: jax.Array,
    chunk: jax.Array,
    targets: jax.Array,
    first: jax.Array,
    temperature: jax.Array,
    row_values: tuple[jax.Array, ...],
    *,
    blocks: tuple[int, int],
    scalar_spec: pl.BlockSpec,
    compiler_params: Any,
    interpret: Any,
) -> jax.Array:
    """dz [N, w] (hidden dtype) of one chunk by the Pallas `kernel` on the grid (row blocks,
    column blocks) of `blocks` = (rows, columns) per block.

    The kernel's refs: temperature and first (in `scalar_spec`), the hidden [rows, D] and chunk
    [D, columns] blocks, targets, lse, E[l], g_logprob and g_entropy ([rows, 1]; `row_values` are
    the last four), then dz [rows, columns].
    """
    rows, dim = hidden.shape
    width = chunk.shape[1]
    bn, bv = blocks
    row_spec = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, bn), pl.cdiv(width, bv)),
        in_specs=[
            scalar_spec,
            scalar_spec,
            pl.BlockSpec((bn, dim), lambda i, j: (i, 0)),
            pl.BlockSpec((dim, bv), lambda i, j: (0, j)),
            *[row_spec] * 5,
        ],
        out_specs=pl.BlockSpec((bn, bv), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((rows, width), hidden.dtype),
        compiler_params=compiler_params,
        interpret=interpret,
        name="logprob_entropy_dlogits",
    )(
        jnp.reshape(temperature, (1,)),
        jnp.reshape(first, (1,)).astype(jnp.int32),
        hidden,
        chunk,
        targets,
        *row_values,
    )


def chunk_width(rows: int, vocab: int, elements: int, align: int, largest: int) -> int:
    """Columns per chunk: `elements // rows` rounded down to `align`, within [align, largest],
    and at most `vocab`."""
    width = (elements // max(rows, 1)) // align * align
    return min(max(width, align), largest, vocab)


def chunk_bounds(index: jax.Array, width: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """(start, first) of chunk `index`: its columns are [start, start + width) and the first
    `first` of them were already covered by the previous chunk."""
    nominal = index * width
    start = jnp.minimum(nominal, vocab - width)
    return start, nominal - start


def backward(
    kernels: Kernels,
    softcap: float | None,
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
    lse: jax.Array,
    mean: jax.Array,
    cotangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    """(d hidden in float32, d lm_head in its dtype) for the cotangents (of log p, of the entropy;
    [N, 1] float32) by recomputing the logits one vocabulary chunk at a time."""
    rows, dim = hidden.shape
    vocab = lm_head.shape[1]
    width = chunk_width(rows, vocab, kernels.chunk_elements, kernels.chunk_align, kernels.max_chunk)

    def body(index, carry):
        d_hidden, d_head = carry
        start, first = chunk_bounds(index, width, vocab)
        chunk = lax.dynamic_slice_in_dim(lm_head, start, width, axis=1).astype(hidden.dtype)
        dz = kernels.dlogits(
            hidden, chunk, targets - start, first, temperature, softcap, lse, mean, *cotangents
        )
        d_hidden += jnp.einsum("nv,dv->nd", dz, chunk, preferred_element_type=jnp.float32)
        d_chunk = jnp.einsum("nd,nv->dv", hidden, dz, preferred_element_type=jnp.float32)
        kept = lax.dynamic_slice_in_dim(d_head, start, width, axis=1)
        new = jnp.where(jnp.arange(width) >= first, d_chunk.astype(d_head.dtype), kept)
        return d_hidden, lax.dynamic_update_slice_in_dim(d_head, new, start, axis=1)

    init = (jnp.zeros((rows, dim), jnp.float32), jnp.zeros(lm_head.shape, lm_head.dtype))
    return lax.fori_loop(0, -(-vocab // width), body, init)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def fused_logprob_entropy(
    kernels: Kernels,
    softcap: float | None,
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy [N] (float32) of hidden [N, D] @ lm_head [D, V] computed by
    `kernels`; `targets` [N] int32, `temperature` a float32 scalar. The LM head is cast to the
    hidden dtype; its gradient comes back in its own dtype."""
    return _fused_fwd(kernels, softcap, hidden, lm_head, targets, temperature)[0]


def _fused_fwd(kernels, softcap, hidden, lm_head, targets, temperature):
    logprob, entropy, lse, mean = kernels.forward(
        hidden, lm_head, targets[:, None], temperature, softcap
    )
    residuals = (hidden, lm_head, targets, temperature, lse, mean)
    return (logprob[:, 0], entropy[:, 0]), residuals


def _fused_bwd(kernels, softcap, residuals, cotangents):
    hidden, lm_head, targets, temperature, lse, mean = residuals
    columns = tuple(g.astype(jnp.float32)[:, None] for g in cotangents)
    d_hidden, d_head = backward(
        kernels, softcap, hidden, lm_head, targets[:, None], temperature, lse, mean, columns
    )
    return d_hidden.astype(hidden.dtype), d_head, None, None


fused_logprob_entropy.defvjp(_fused_fwd, _fused_bwd)
