"""Pallas GPU kernels (Triton lowering) for the fused log-prob + entropy op.

Forward: grid (row blocks, vocabulary splits). A program loops over the [rows, cols] tiles of its
split, each tile a K-loop of [rows, k] x [k, cols] dots accumulated in float32, and folds the
tiles into an online-softmax state; the per-split states ([splits, N, 1]) are merged afterwards
(splitting the vocabulary keeps the GPU busy when there are few row blocks). Backward
(`dlogits`): grid (row blocks, column blocks) over one vocabulary chunk; each program recomputes
its tile and stores dz in the hidden dtype.

Loads and stores are masked at the array edges (rows past N, columns past V or past the chunk,
K past D), so any shape works; tile sizes are powers of two as Triton needs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jrl_kernels import tiles
from jrl_kernels.fused import Kernels, pallas_dlogits, pallas_kernels

BLOCK_ROWS = 64
BLOCK_VOCAB = 128
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 3
# Forward programs to aim for: enough to fill an H100/H200's 132 SMs several times.
TARGET_PROGRAMS = 1024
# dz elements per backward chunk (bf16: 128 MiB) and its largest width.
CHUNK_ELEMENTS = 1 << 26
MAX_CHUNK = 16384


def _block(size: int, largest: int) -> int:
    """A power-of-two tile size in [16, largest] covering `size` when it can."""
    return min(largest, max(16, pl.next_power_of_2(size)))


def _mask(*parts: jax.Array | None) -> jax.Array | None:
    """The conjunction of the masks that are not None (None when all are)."""
    present = [p for p in parts if p is not None]
    return functools.reduce(jnp.logical_and, present) if present else None


def _tile(h_ref, w_ref, col0, row_ok, col_ok, *, dim: int, block_k: int) -> jax.Array:
    """z = h_block @ w_block[:, col0 : col0 + cols] in float32, K-looped; masked rows, columns
    and K past D read as zero."""
    rows, cols = row_ok.shape[0], col_ok.shape[1]

    def step(k, acc):
        ks = pl.ds(k * block_k, block_k)
        k_ok = None
        if dim % block_k:
            k_ok = k * block_k + jnp.arange(block_k) < dim
        h_mask = _mask(row_ok, None if k_ok is None else k_ok[None, :])
        w_mask = _mask(col_ok, None if k_ok is None else k_ok[:, None])
        h = plgpu.load(h_ref.at[:, ks], mask=h_mask, other=0.0)
        w = plgpu.load(w_ref.at[ks, pl.ds(col0, cols)], mask=w_mask, other=0.0)
        return acc + jnp.dot(h, w, preferred_element_type=jnp.float32)

    return lax.fori_loop(0, pl.cdiv(dim, block_k), step, jnp.zeros((rows, cols), jnp.float32))


def _row_ok(rows: int, block_rows: int) -> jax.Array:
    """[block_rows, 1] mask of the program's rows that lie inside the array."""
    return (pl.program_id(0) * block_rows + jnp.arange(block_rows))[:, None] < rows


def _forward_kernel(
    temp_ref,
    h_ref,
    w_ref,
    t_ref,
    *out_refs,
    rows: int,
    vocab: int,
    dim: int,
    block_rows: int,
    block_vocab: int,
    block_k: int,
    vocab_tiles: int,
    tiles_per_split: int,
    softcap: float | None,
):
    row_ok = _row_ok(rows, block_rows)
    targets = plgpu.load(t_ref, mask=row_ok, other=-1)
    temperature = temp_ref[0]
    first_tile = pl.program_id(1) * tiles_per_split

    def step(j, stats):
        cols = (first_tile + j) * block_vocab + jnp.arange(block_vocab)[None, :]
        valid = cols < vocab
        z = _tile(h_ref, w_ref, j * block_vocab, row_ok, valid, dim=dim, block_k=block_k)
        logits, _ = tiles.tempered(z, temperature, softcap)
        return tiles.merge_stats(stats, tiles.tile_stats(logits, valid, cols == targets))

    count = jnp.minimum(tiles_per_split, vocab_tiles - first_tile)
    stats = lax.fori_loop(0, count, step, tiles.empty_stats((block_rows, 1)))
    for ref, value in zip(out_refs, stats, strict=True):
        plgpu.store(ref, value, mask=row_ok)


def _dlogits_kernel(
    temp_ref,
    first_ref,
    h_ref,
    w_ref,
    t_ref,
    lse_ref,
    mean_ref,
    glp_ref,
    gent_ref,
    dz_ref,
    *,
    rows: int,
    width: int,
    dim: int,
    block_rows: int,
    block_vocab: int,
    block_k: int,
    softcap: float | None,
):
    row_ok = _row_ok(rows, block_rows)
    cols = pl.program_id(1) * block_vocab + jnp.arange(block_vocab)[None, :]
    col_ok = cols < width
    z = _tile(h_ref, w_ref, 0, row_ok, col_ok, dim=dim, block_k=block_k)
    row_refs = (t_ref, lse_ref, mean_ref, glp_ref, gent_ref)
    targets, lse, mean, g_logprob, g_entropy = (
        plgpu.load(ref, mask=row_ok, other=0) for ref in row_refs
    )
    valid = col_ok & (cols >= first_ref[0])
    dz = tiles.tile_dlogits(
        z, valid, cols == targets, temp_ref[0], softcap, lse, mean, g_logprob, g_entropy
    )
    plgpu.store(dz_ref, dz.astype(dz_ref.dtype), mask=row_ok & col_ok)


def _params() -> plgpu.CompilerParams:
    return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _scalar_spec() -> pl.BlockSpec:
    return pl.BlockSpec((1,), lambda i, j: (0,))


def forward(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
    softcap: float | None,
    *,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """(log p, entropy, lse, E[l]) [N, 1] float32 in one pass over the vocabulary."""
    rows, dim = hidden.shape
    vocab = lm_head.shape[1]
    bn, bv, bk = _block(rows, BLOCK_ROWS), BLOCK_VOCAB, _block(dim, BLOCK_K)
    row_blocks, vocab_tiles = pl.cdiv(rows, bn), pl.cdiv(vocab, bv)
    tiles_per_split = pl.cdiv(vocab_tiles, min(vocab_tiles, pl.cdiv(TARGET_PROGRAMS, row_blocks)))
    splits = pl.cdiv(vocab_tiles, tiles_per_split)
    kernel = functools.partial(
        _forward_kernel,
        rows=rows,
        vocab=vocab,
        dim=dim,
        block_rows=bn,
        block_vocab=bv,
        block_k=bk,
        vocab_tiles=vocab_tiles,
        tiles_per_split=tiles_per_split,
        softcap=softcap,
    )
    row_spec = pl.BlockSpec((bn, 1), lambda i, s: (i, 0))
    stats_spec = pl.BlockSpec((None, bn, 1), lambda i, s: (s, i, 0))
    partial = pl.pallas_call(
        kernel,
        grid=(row_blocks, splits),
        in_specs=[
            _scalar_spec(),
            pl.BlockSpec((bn, dim), lambda i, s: (i, 0)),
            pl.BlockSpec((dim, tiles_per_split * bv), lambda i, s: (0, s)),
            row_spec,
        ],
        out_specs=[stats_spec] * 4,
        out_shape=[jax.ShapeDtypeStruct((splits, rows, 1), jnp.float32)] * 4,
        compiler_params=_params(),
        interpret=interpret,
        name="logprob_entropy_fwd",
    )(jnp.reshape(temperature, (1,)), hidden, lm_head.astype(hidden.dtype), targets)
    return tiles.finish(tiles.reduce_stats(tiles.Stats(*partial), axis=0))


def dlogits(
    hidden: jax.Array,
    chunk: jax.Array,
    targets: jax.Array,
    first: jax.Array,
    temperature: jax.Array,
    softcap: float | None,
    *row_values: jax.Array,
    interpret: bool = False,
) -> jax.Array:
    """dz [N, w] (hidden dtype) of one chunk; `row_values` = lse, E[l], g_logprob, g_entropy."""
    rows, dim = hidden.shape
    width = chunk.shape[1]
    bn, bk = _block(rows, BLOCK_ROWS), _block(dim, BLOCK_K)
    kernel = functools.partial(
        _dlogits_kernel,
        rows=rows,
        width=width,
        dim=dim,
        block_rows=bn,
        block_vocab=BLOCK_VOCAB,
        block_k=bk,
        softcap=softcap,
    )
    return pallas_dlogits(
        kernel,
        hidden,
        chunk,
        targets,
        first,
        temperature,
        row_values,
        blocks=(bn, BLOCK_VOCAB),
        scalar_spec=_scalar_spec(),
        compiler_params=_params(),
        interpret=interpret,
    )


@functools.cache
def kernels(interpret: bool = False) -> Kernels:
    """The GPU kernels (`interpret`: run them in the Pallas interpreter, on any backend)."""
    return pallas_kernels(
        "pallas_gpu", forward, dlogits, CHUNK_ELEMENTS, BLOCK_VOCAB, MAX_CHUNK, interpret
    )
