"""The KV cache's axis order: [layers, batch, tokens, kv_heads, head_dim] (tokens-major) or
[layers, batch, kv_heads, tokens, head_dim] (heads-major), chosen from head_dim.

A TPU tiles an array's two minor dimensions as (sublanes, 128 lanes). When the decode loop wants
the cache laid out otherwise than the program's entry parameter, the compiler copies the whole
cache into and out of the loop, per layer. Tokens-major puts (kv_heads, head_dim) minor; heads-major
puts (tokens, head_dim) minor, which pads nothing when head_dim is a multiple of 128 but pads a
head_dim of 64 to 128 lanes. So the cache is heads-major exactly when head_dim is a multiple of
128, and then a slot's column count is rounded up to a multiple of the bf16 sublane tile (16):
with an odd count (prompt + response - 1) the entry was laid out unpadded and the loop padded.
A tokens-major cache keeps the exact count. The other backends do not care and follow the rule.

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


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """Where a cache of this model keeps its tokens and kv heads."""

    heads_major: bool

    @classmethod
    def for_head_dim(cls, head_dim: int) -> KVLayout:
        return cls(heads_major=head_dim % TPU_LANES == 0)

    @property
    def token_multiple(self) -> int:
        """What a slot's column count is rounded up to: the sublane tile (16 rows of bf16, 8 of
        fp32) when (tokens, head_dim) are the minor dimensions, else 1 (see the module
        docstring)."""
        return TPU_SUBLANES if self.heads_major else 1

    @property
    def token_axis(self) -> int:
        """The tokens' axis in the whole cache [layers, batch, ...]."""
        return 3 if self.heads_major else 2

    @property
    def heads_axis(self) -> int:
        """The kv heads' axis in the whole cache [layers, batch, ...]."""
        return 2 if self.heads_major else 3

    def shape(
        self, layers: int, batch: int, tokens: int, kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """The whole cache's shape."""
        middle = (kv_heads, tokens) if self.heads_major else (tokens, kv_heads)
        return (layers, batch, *middle, head_dim)

    def reorder(self, x: jax.Array) -> jax.Array:
        """One layer's [B, T, K, Dh] <-> the cache's order of it (the swap is its own inverse)."""
        return x.swapaxes(1, 2) if self.heads_major else x

    def first_tokens(self, batch: jax.Array, tokens: int) -> tuple[object, ...]:
        """The index of the whole cache's columns 0 .. tokens-1 of the rows `batch`, all layers."""
        between = (slice(None),) * (self.token_axis - 2)
        return (slice(None), batch, *between, slice(None, tokens))
