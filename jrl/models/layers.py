"""Building blocks of the decoder: RMSNorm, RoPE, attention, SwiGLU MLP and the decoder layer.

Parameters are stored in `param_dtype` and cast to the compute `dtype` at use; norms, RoPE and
attention scores are computed in float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jrl.models.config import ModelConfig

# Masked attention scores get this (finite) value so that rows without any valid key stay NaN-free.
MASKED_SCORE = -1e30


def dense(
    in_features: int,
    out_features: int,
    *,
    use_bias: bool,
    std: float,
    dtype: Any,
    param_dtype: Any,
    rngs: nnx.Rngs,
) -> nnx.Linear:
    """A linear layer with kernel [in, out], initialised N(0, std) with a zero bias."""
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(std),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """Root-mean-square norm with a learned scale (initialised to ones)."""

    def __init__(self, dim: int, eps: float, *, dtype: Any, param_dtype: Any) -> None:
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        return x.astype(self.dtype) * self.scale[...].astype(self.dtype)


def rope_tables(
    position_ids: jax.Array, head_dim: int, theta: float
) -> tuple[jax.Array, jax.Array]:
    """cos and sin of the rotary angles, each [B, T, head_dim // 2] float32."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = position_ids.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotates [B, T, H, D] by the half-split convention (first half pairs with second half)."""
    cos, sin = (t[:, :, None, :] for t in rope)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    q [B, T, H, D]; k, v [B, S, K, D] with H a multiple of K (query head h uses kv head h // (H/K));
    mask [B, T, S] bool, True where query t may attend key s. Returns [B, T, H, D] in q's dtype.
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, h // kv_heads, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores * d**-0.5, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d).astype(q.dtype)


class Attention(nnx.Module):
    """Multi-head attention projections (GQA) with optional q/k/v (and o) biases."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        c = config
        kw = dict(std=c.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = dense(
            c.hidden_size, c.num_heads * c.head_dim, use_bias=c.attention_bias, **kw
        )
        self.k_proj = dense(
            c.hidden_size, c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, **kw
        )
        self.v_proj = dense(
            c.hidden_size, c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, **kw
        )
        self.o_proj = dense(c.num_heads * c.head_dim, c.hidden_size, use_bias=c.output_bias, **kw)
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim

    def qkv(
        self, x: jax.Array, rope: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Projects [B, T, D] to rotated q [B, T, H, Dh] and k, v [B, T, K, Dh]."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def output(self, o: jax.Array) -> jax.Array:
        """Projects attention output [B, T, H, Dh] back to [B, T, D]."""
        return self.o_proj(o.reshape(*o.shape[:2], -1))


class MLP(nnx.Module):
    """SwiGLU feed-forward block: down(silu(gate(x)) * up(x))."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        c = config
        kw = dict(use_bias=False, std=c.initializer_range, dtype=dtype, param_dtype=param_dtype)
        self.gate_proj = dense(c.hidden_size, c.intermediate_size, rngs=rngs, **kw)
        self.up_proj = dense(c.hidden_size, c.intermediate_size, rngs=rngs, **kw)
        self.down_proj = dense(c.intermediate_size, c.hidden_size, rngs=rngs, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = Attention(config, rngs=rngs, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = MLP(config, rngs=rngs, **kw)

    def project(
        self, x: jax.Array, rope: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Normalises [B, T, D] and returns the rotated q [B, T, H, Dh] and k, v [B, T, K, Dh]."""
        return self.self_attn.qkv(self.input_layernorm(x), rope)

    def combine(
        self, x: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
    ) -> jax.Array:
        """Adds attention of q over k/v (masked by `mask` [B, T, S]) and then the MLP to x."""
        x = x + self.self_attn.output(attention(q, k, v, mask))
        return x + self.mlp(self.post_attention_layernorm(x))
