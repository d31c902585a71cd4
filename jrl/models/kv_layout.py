"""The KV cache's axis order: each layer's [batch, tokens, kv_heads, head_dim] (tokens-major) or
[batch, kv_heads, tokens, head_dim] (heads-major), chosen from head_dim and the platform.

A TPU tiles an array's two minor dimensions as (sublanes, 128 lanes). When the decode loop wants
the cache laid out otherwise than the program's entry parameter, the compiler copies the whole
cache into and out of the loop, per layer. Tokens-major puts (kv_heads, head_dim) minor; heads-major
puts (tokens, head_dim) minor, which pads nothing when head_dim is a multiple of 128 but pads a
head_dim of 64 to 128 lanes. So the cache is heads-major exactly when head_dim is a multiple of
128, and then a slot's column count is rounded up to a multiple of the bf16 sublane tile (16):
with an odd count (prompt + response - 1) the entry was laid out unpadded and the loop padded.
A tokens-major cache keeps the exact count. A GPU follows the TPU's rule.

On a CPU the cache is heads-major for every head_dim, unrounded: XLA:CPU's dots read one layer's
keys and values [batch, kv_heads, tokens, head_dim] as they lie, where a tokens-major layer was
transposed into a copy at every decode step (SmolLM2-135M, head_dim 64, fp32, 128 slots of 95
tokens: a quarter of the decode loop's time, 7.5 of 30.5 CPU seconds).

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
    # What a slot's column count is rounded up to: the TPU's sublane tile (16 rows of bf16, 8 of
    # fp32) where (tokens, head_dim) are the minor dimensions for the TPU's sake, else 1.
    token_multiple: int = 1

    @classmethod
    def for_model(cls, head_dim: int, platform: str) -> KVLayout:
        """The layout of a model with this head_dim on `platform` ('cpu', 'gpu', 'tpu'; see the
        module docstring)."""
        if head_dim % TPU_LANES == 0:
            return cls(heads_major=True, token_multiple=TPU_SUBLANES)
        return cls(heads_major=platform == "cpu")

    @property
    def token_axis(self) -> int:
        """The tokens' axis in one layer's cache [batch, ...]."""
        return 2 if self.heads_major else 1

    @property
    def heads_axis(self) -> int:
        """The kv heads' axis in one layer's cache [batch, ...]."""
        return 1 if self.heads_major else 2

    def shape(self, batch: int, tokens: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """One layer's cache shape."""
        middle = (kv_heads, tokens) if self.heads_major else (tokens, kv_heads)
        return (batch, *middle, head_dim)

    def reorder(self, x: jax.Array) -> jax.Array:
        """One layer's [B, T, K, Dh] <-> the cache's order of it (the swap is its own inverse)."""
        return x.swapaxes(1, 2) if self.heads_major else x

    def first_tokens(self, batch: jax.Array, tokens: int) -> tuple[object, ...]:
        """The index of one layer's cache columns 0 .. tokens-1 of the rows `batch`."""
        between = (slice(None),) * (self.token_axis - 1)
        return (batch, *between, slice(None, tokens))
