"""The KV cache's axis orders: how one layer's keys and values lay out the logical axes (batch,
tokens, kv_heads, head_dim), chosen from head_dim and the platform.

A TPU tiles an array's two minor dimensions as (sublanes, 128 lanes). When the decode loop wants
the cache laid out otherwise than the program's entry parameter, the compiler copies the whole
cache into and out of the loop, per layer. Tokens-major [batch, tokens, kv_heads, head_dim] puts
(kv_heads, head_dim) minor; heads-major [batch, kv_heads, tokens, head_dim] puts (tokens, head_dim)
minor, which pads nothing when head_dim is a multiple of 128 but pads a head_dim of 64 to 128
lanes. So on a TPU or GPU the cache is heads-major exactly when head_dim is a multiple of 128,
and then a slot's column count is rounded up to a multiple of the bf16 sublane tile (16): with an
odd count (prompt + response - 1) the entry was laid out unpadded and the loop padded. A
tokens-major cache keeps the exact count.

On a CPU the values are heads-major and the keys transposed, [batch, kv_heads, head_dim, tokens],
for every head_dim, unrounded: a decode step's two attention products (batched over (batch,
kv_heads), or summed, `attention.eager_attention`) then read the layers as they lie. SmolLM2-135M
(head_dim 64, fp32, 128 slots of 95 tokens, one layer's attention): tokens-major keys and values
were transposed into copies at every step (a quarter of the decode loop's time); heads-major keys
took 2.1 ms, transposed keys 1.2 ms (reading the layer's keys and values once: 0.45 ms). There
each layer also has a buffer of its own: XLA:CPU copied a layer's slice of one stacked buffer
into the attention's operand at every step. A bfloat16 model's cache holds its (bfloat16) values
in float32 there: XLA:CPU computes every bfloat16 op other than a matrix product in float32, so
a bfloat16 cache was converted whole to float32 and back at each write and again at each read
(SmolLM2-135M, 128 slots: 41% of a decode step). In float32 the writes are in place and the
attention reads the buffers as they lie, for twice the cache's bytes. Elsewhere one buffer
holds all layers (the TPU compiler's memory for the rollout stays close to affine in depth,
which `jrl.compile --layers` extrapolates from).

Measured with the TPU compiler, one kv head per chip (tensor parallel 2), temporaries of the
rollout program (`jrl.compile`'s figures, 1 / 2 decoder layers):
- Qwen2.5-1.5B (head_dim 128) on v5litepod-16, 256 slots: tokens-major 407 / 809 MiB (two
  128 MiB copies per layer), heads-major unrounded 280 / 297, heads-major rounded 151 / 168.
- Qwen2.5-0.5B (head_dim 64) on v5litepod-8, 1024 slots: tokens-major 1041 / 1117 MiB; rounded
  1073 / 2101 (the loop then put tokens minor and copied the cache); heads-major 1.1 / 2.1 GiB.
- The tiny card with head_dim 128 on v5e:2x2 (`tests/test_compile_tpu.py`): heads-major
  unrounded 68 MiB for a 64 MiB cache, rounded 3.3 MiB.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the layout is plain data, read without jax (ModelConfig)
    import jax

TPU_LANES = 128
TPU_SUBLANES = 16  # of a bf16 tile
BATCH, TOKENS, KV_HEADS, HEAD_DIM = range(4)  # the logical axes of a layer's keys or values


@dataclasses.dataclass(frozen=True)
class AxisOrder:
    """A layer's keys or values as the cache holds them: `axes[i]` is the logical axis (BATCH,
    TOKENS, KV_HEADS, HEAD_DIM) at the cache's axis i; the batch stays first."""

    axes: tuple[int, int, int, int]

    def shape(self, batch: int, tokens: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """The layer's shape in this order."""
        logical = (batch, tokens, kv_heads, head_dim)
        return tuple(logical[axis] for axis in self.axes)

    def put(self, x: jax.Array) -> jax.Array:
        """[B, T, K, Dh] in this order."""
        return x.transpose(self.axes)

    def take(self, x: jax.Array) -> jax.Array:
        """This order's layer as [B, T, K, Dh]."""
        return x.transpose(tuple(self.axes.index(axis) for axis in range(4)))

    @property
    def token_axis(self) -> int:
        return self.axes.index(TOKENS)

    @property
    def heads_axis(self) -> int:
        return self.axes.index(KV_HEADS)

    def first_tokens(self, batch: jax.Array, tokens: int) -> tuple[object, ...]:
        """The index of a layer's columns 0 .. tokens-1 of the rows `batch`."""
        between = (slice(None),) * (self.token_axis - 1)
        return (batch, *between, slice(None, tokens))


TOKENS_MAJOR = AxisOrder((BATCH, TOKENS, KV_HEADS, HEAD_DIM))
HEADS_MAJOR = AxisOrder((BATCH, KV_HEADS, TOKENS, HEAD_DIM))
TOKENS_MINOR = AxisOrder((BATCH, KV_HEADS, HEAD_DIM, TOKENS))


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """Where a cache of this model keeps its tokens and kv heads: the keys' and the values'
    `AxisOrder`, and whether each layer has a buffer of its own, [batch, ...the part's order],
    or one buffer [layers, batch, ...] holds all layers."""

    keys: AxisOrder
    values: AxisOrder
    # What a slot's column count is rounded up to: the TPU's sublane tile (16 rows of bf16, 8 of
    # fp32) where (tokens, head_dim) are the minor dimensions for the TPU's sake, else 1.
    token_multiple: int = 1
    per_layer: bool = False
    # Whether the values of a 16-bit float model are held in float32 (unchanged: a bfloat16 is
    # exact in float32; `jrl.models.dtypes.cache_dtype`). See the module docstring.
    float32_storage: bool = False

    @classmethod
    def for_model(cls, head_dim: int, platform: str) -> KVLayout:
        """The layout of a model with this head_dim on `platform` ('cpu', 'gpu', 'tpu'; see the
        module docstring)."""
        if platform == "cpu":
            return cls(TOKENS_MINOR, HEADS_MAJOR, per_layer=True, float32_storage=True)
        if head_dim % TPU_LANES == 0:
            return cls(HEADS_MAJOR, HEADS_MAJOR, token_multiple=TPU_SUBLANES)
        return cls(TOKENS_MAJOR, TOKENS_MAJOR)

    @property
    def orders(self) -> tuple[AxisOrder, AxisOrder]:
        """(keys, values): the parts of a cache, in `KVCache`'s order."""
        return self.keys, self.values

    @property
    def layer_axes(self) -> int:
        """Leading layer axes of a buffer: 0 (a buffer per layer) or 1 (all layers in one)."""
        return 0 if self.per_layer else 1

    def where(self, layer: int) -> tuple[int, tuple[int, ...]]:
        """(the buffer of `layer`, the layer's index in it)."""
        return (layer, ()) if self.per_layer else (0, (layer,))

    def shapes(
        self, layers: int, batch: int, tokens: int, kv_heads: int, head_dim: int
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """The (keys, values) buffers' shapes of a cache of `layers` layers."""
        count, lead = (layers, ()) if self.per_layer else (1, (layers,))
        return tuple(
            ((*lead, *order.shape(batch, tokens, kv_heads, head_dim)),) * count
            for order in self.orders
        )
