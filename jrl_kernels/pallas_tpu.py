"""Pallas TPU (Mosaic) kernels for the fused log-prob + entropy op.

Forward: grid (row blocks, vocabulary blocks), the vocabulary axis innermost and sequential; each
step multiplies a [rows, D] block of hidden states by a [D, cols] block of the LM head on the MXU
and folds the tile into an online-softmax state held in VMEM scratch; the last step writes the
per-row results. Backward (`dlogits`): grid (row blocks, column blocks) over one vocabulary chunk,
each step recomputing its tile of logits and writing dz in the hidden dtype.

Blocks that overhang the arrays (last row block, last vocabulary block) are fine: out-of-range
columns are masked, and out-of-range rows only touch their own (dropped) output rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jrl_kernels import tiles
from jrl_kernels.fused import Kernels, pallas_dlogits, pallas_kernels

BLOCK_ROWS = 256
BLOCK_VOCAB = 512
# dz elements per backward chunk (bf16: 128 MiB) and its largest width.
CHUNK_ELEMENTS = 1 << 26
MAX_CHUNK = 16384


def _row_block(rows: int) -> int:
    """Rows per block: BLOCK_ROWS, or all rows rounded up to 16 (bf16 sublane packing)."""
    return min(BLOCK_ROWS, -(-rows // 16) * 16)


def _vocab_block(cols: int) -> int:
    """Columns per block: BLOCK_VOCAB, or all columns rounded up to the 128 lanes."""
    return min(BLOCK_VOCAB, -(-cols // 128) * 128)


def _interpret(interpret: bool) -> pltpu.InterpretParams | bool:
    return pltpu.InterpretParams() if interpret else False


def _tile(h_ref, w_ref) -> tuple[jax.Array, jax.Array]:
    """(z float32, global column index) of the current grid step's tile."""
    z = jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    cols = pl.program_id(1) * w_ref.shape[1] + lax.broadcasted_iota(jnp.int32, z.shape, 1)
    return z, cols


def _forward_kernel(temp_ref, h_ref, w_ref, t_ref, *refs, vocab: int, softcap: float | None):
    outputs, scratch = refs[:4], refs[4:]
    step = pl.program_id(1)

    @pl.when(step == 0)
    def _init():
        for ref, value in zip(scratch, tiles.empty_stats(scratch[0].shape), strict=True):
            ref[...] = value

    z, cols = _tile(h_ref, w_ref)
    logits, _ = tiles.tempered(z, temp_ref[0], softcap)
    tile = tiles.tile_stats(logits, cols < vocab, cols == t_ref[...])
    stats = tiles.merge_stats(tiles.Stats(*(ref[...] for ref in scratch)), tile)
    for ref, value in zip(scratch, stats, strict=True):
        ref[...] = value

    @pl.when(step == pl.num_programs(1) - 1)
    def _write():
        for ref, value in zip(outputs, tiles.finish(stats), strict=True):
            ref[...] = value


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
    width: int,
    softcap: float | None,
):
    z, cols = _tile(h_ref, w_ref)
    valid = (cols >= first_ref[0]) & (cols < width)
    dz = tiles.tile_dlogits(
        z,
        valid,
        cols == t_ref[...],
        temp_ref[0],
        softcap,
        lse_ref[...],
        mean_ref[...],
        glp_ref[...],
        gent_ref[...],
    )
    dz_ref[...] = dz.astype(dz_ref.dtype)


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
    bn, bv = _row_block(rows), _vocab_block(vocab)
    row_spec = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    column = jax.ShapeDtypeStruct((rows, 1), jnp.float32)
    return pl.pallas_call(
        functools.partial(_forward_kernel, vocab=vocab, softcap=softcap),
        grid=(pl.cdiv(rows, bn), pl.cdiv(vocab, bv)),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec((bn, dim), lambda i, j: (i, 0)),
            pl.BlockSpec((dim, bv), lambda i, j: (0, j)),
            row_spec,
        ],
        out_specs=[row_spec] * 4,
        out_shape=[column] * 4,
        scratch_shapes=[pltpu.VMEM((bn, 1), jnp.float32)] * 4,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=_interpret(interpret),
        name="logprob_entropy_fwd",
    )(jnp.reshape(temperature, (1,)), hidden, lm_head.astype(hidden.dtype), targets)


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
    width = chunk.shape[1]
    return pallas_dlogits(
        functools.partial(_dlogits_kernel, width=width, softcap=softcap),
        hidden,
        chunk,
        targets,
        first,
        temperature,
        row_values,
        blocks=(_row_block(hidden.shape[0]), _vocab_block(width)),
        scalar_spec=pl.BlockSpec(memory_space=pltpu.SMEM),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=_interpret(interpret),
    )


@functools.cache
def kernels(interpret: bool = False) -> Kernels:
    """The TPU kernels (`interpret`: run them in the Pallas TPU interpreter, on any backend)."""
    return pallas_kernels(
        "pallas_tpu", forward, dlogits, CHUNK_ELEMENTS, BLOCK_VOCAB, MAX_CHUNK, interpret
    )
