"""Building blocks of the decoder: linear layers (with LoRA), RMSNorm, RoPE, the attention
module, the gated MLP and the layer (the attention kernels are in `jrl.models.attention`, the
mixture-of-experts block in `jrl.models.moe`).

Parameters are stored in `param_dtype` and cast to the compute `dtype` at use; norms, RoPE and
attention scores are computed in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jrl.models.attention import Visibility, attention
from jrl.models.config import ModelConfig, RopeScaling
from jrl.models.dtypes import product_dtype
from jrl.models.moe import SparseMoE
from jrl.parallel.sharding import axes_of, logical_axes

_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
}


class LoRAParam(nnx.Param):
    """A low-rank adapter matrix: the only parameters trained when LoRA is on."""


class Linear(nnx.Linear):
    """`nnx.Linear` (kernel [in, out]) with an optional low-rank adapter.

    With an adapter (`add_adapter`), y = x @ W + b + (x @ A @ B) * alpha / rank, where A [in, r]
    and B [r, out] are `LoRAParam`s; B starts at zero so the output starts unchanged. A and B
    take W's logical axes for `in` and `out`, and ``lora_rank`` (never split) for r.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lora_a = nnx.data(None)
        self.lora_b = nnx.data(None)
        self.lora_scale = 0.0

    @property
    def has_adapter(self) -> bool:
        """Whether this layer carries a LoRA adapter."""
        return self.lora_a is not None

    def add_adapter(self, rank: int, alpha: float, key: jax.Array) -> None:
        """Adds A [in, rank] ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming-uniform) and B = 0."""
        bound = 1.0 / math.sqrt(self.in_features)
        a = jax.random.uniform(
            key, (self.in_features, rank), self.param_dtype, minval=-bound, maxval=bound
        )
        inner, outer = axes_of(self.kernel) or (None, None)
        self.lora_a = LoRAParam(a, **logical_axes(inner, "lora_rank"))
        b = jnp.zeros((rank, self.out_features), self.param_dtype)
        self.lora_b = LoRAParam(b, **logical_axes("lora_rank", outer))
        self.lora_scale = float(alpha) / rank

    def remove_adapter(self) -> None:
        """Drops the adapter (the base layer stays as it is)."""
        self.lora_a = nnx.data(None)
        self.lora_b = nnx.data(None)
        self.lora_scale = 0.0

    def merged_kernel(self) -> jax.Array:
        """W + A @ B * alpha / rank (just W without an adapter), computed in float32 and
        returned in the kernel's dtype."""
        kernel = self.kernel[...]
        if not self.has_adapter:
            return kernel
        a, b = (p[...].astype(jnp.float32) for p in (self.lora_a, self.lora_b))
        return (kernel.astype(jnp.float32) + (a @ b) * self.lora_scale).astype(kernel.dtype)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        y = self._project(inputs)
        if not self.has_adapter:
            return y
        dtype = self.dtype or inputs.dtype
        a, b = (p[...].astype(dtype) for p in (self.lora_a, self.lora_b))
        delta = (inputs.astype(dtype) @ a) @ b
        return y + delta * jnp.asarray(self.lora_scale, dtype)

    def _project(self, inputs: jax.Array) -> jax.Array:
        """x @ W + b; a 16-bit product takes `product_dtype` and is rounded afterwards, then
        the bias is added."""
        dtype, wide = jnp.dtype(self.dtype or inputs.dtype), product_dtype()
        if dtype.itemsize != 2 or wide is None:
            return super().__call__(inputs)
        kernel = self.kernel[...].astype(dtype)
        contract = (((inputs.ndim - 1,), (0,)), ((), ()))
        y = jax.lax.dot_general(
            inputs.astype(dtype), kernel, contract, preferred_element_type=wide
        ).astype(dtype)
        return y if self.bias is None else y + self.bias[...].astype(dtype)


def dense(
    in_features: int,
    out_features: int,
    axes: tuple[str | None, str | None],
    *,
    use_bias: bool,
    std: float,
    dtype: Any,
    param_dtype: Any,
    rngs: nnx.Rngs,
) -> Linear:
    """A linear layer with kernel [in, out], initialised N(0, std) with a zero bias; `axes` are
    the logical axes of (in, out) (the bias takes out's)."""
    return Linear(
        in_features,
        out_features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(std),
        kernel_metadata=logical_axes(*axes),
        bias_metadata=logical_axes(axes[1]),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """Root-mean-square norm with a learned scale w.

    Llama style multiplies the normalised input, cast to the compute dtype, by w (initialised to
    ones). With `unit_offset` (Gemma) the scale is (1 + w), applied in float32 before the cast,
    and w is initialised to zeros.
    """

    def __init__(
        self, dim: int, eps: float, *, unit_offset: bool = False, dtype: Any, param_dtype: Any
    ) -> None:
        init = jnp.zeros if unit_offset else jnp.ones
        self.scale = nnx.Param(init((dim,), param_dtype), **logical_axes("norm"))
        self.eps = eps
        self.unit_offset = unit_offset
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        if self.unit_offset:
            return (x * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)
        return x.astype(self.dtype) * self.scale[...].astype(self.dtype)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse rotary frequencies [head_dim // 2] float32, scaled as `scaling` says."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv_freq.astype(np.float32)
    if scaling.rope_type == "linear":
        return (inv_freq / scaling.factor).astype(np.float32)
    context = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    interpolated = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = np.where(
        wavelen > context / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq
    )
    medium = (wavelen >= context / scaling.high_freq_factor) & (
        wavelen <= context / scaling.low_freq_factor
    )
    return np.where(medium, interpolated, scaled).astype(np.float32)


def rope_tables(position_ids: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin of the rotary angles, each [B, T, head_dim // 2] float32."""
    angles = position_ids.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotates [B, T, H, D] by the half-split convention (first half pairs with second half)."""
    cos, sin = (t[:, :, None, :] for t in rope)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    """Multi-head attention (GQA) of one layer: projections with optional biases, optional
    per-head q/k norms before RoPE, and this layer's window, scale and soft-capping."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        *,
        dtype: Any,
        param_dtype: Any,
        rngs: nnx.Rngs,
    ) -> None:
        c = config
        kw = dict(std=c.initializer_range, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        bias = c.attention_bias
        q_dim, kv_dim, hidden = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size
        self.q_proj = dense(hidden, q_dim, ("embed", "heads"), use_bias=bias, **kw)
        self.k_proj = dense(hidden, kv_dim, ("embed", "kv_heads"), use_bias=bias, **kw)
        self.v_proj = dense(hidden, kv_dim, ("embed", "kv_heads"), use_bias=bias, **kw)
        self.o_proj = dense(q_dim, hidden, ("heads", "embed"), use_bias=c.output_bias, **kw)
        norm_kw = dict(unit_offset=c.family.gemma, dtype=dtype, param_dtype=param_dtype)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **norm_kw) if c.family.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **norm_kw) if c.family.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.window = c.sliding_window if c.is_sliding(layer) else None
        self.scale = c.attention_scale
        self.softcap = c.attn_logit_softcapping
        self.implementation = c.attn_implementation

    def qkv(
        self, x: jax.Array, rope: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Projects [B, T, D] to rotated q [B, T, H, Dh] and k, v [B, T, K, Dh]."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, visibility: Visibility) -> jax.Array:
        """Attention of q over k/v in this layer's window, projected back to [B, T, D]."""
        o = attention(
            q,
            k,
            v,
            visibility,
            scale=self.scale,
            window=self.window,
            softcap=self.softcap,
            implementation=self.implementation,
        )
        return self.o_proj(o.reshape(*o.shape[:2], -1))


class MLP(nnx.Module):
    """Gated feed-forward block: down(act(gate(x)) * up(x)), act from `hidden_act`."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        c = config
        kw = dict(use_bias=False, std=c.initializer_range, dtype=dtype, param_dtype=param_dtype)
        hidden, mlp = c.hidden_size, c.intermediate_size
        self.gate_proj = dense(hidden, mlp, ("embed", "mlp"), rngs=rngs, **kw)
        self.up_proj = dense(hidden, mlp, ("embed", "mlp"), rngs=rngs, **kw)
        self.down_proj = dense(mlp, hidden, ("mlp", "embed"), rngs=rngs, **kw)
        self.act = c.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(_ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm decoder layer.

    Llama style: x + attn(input_norm(x)), then x + mlp(post_attention_norm(x)). Gemma adds norms
    on the outputs: x + post_attention_norm(attn(input_norm(x))), then
    x + post_feedforward_norm(mlp(pre_feedforward_norm(x))).
    """

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        *,
        dtype: Any,
        param_dtype: Any,
        rngs: nnx.Rngs,
    ) -> None:
        c = config
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        norm_kw = dict(unit_offset=c.family.gemma, **kw)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm_kw)
        self.self_attn = Attention(c, layer, rngs=rngs, **kw)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm_kw)
        self.sandwich = c.family.gemma
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm_kw)
            self.post_feedforward_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **norm_kw)
        # the feed-forward block: a gated MLP, or a family's sparse block under its HF name
        self.ffn_name = "mlp"
        if c.is_sparse(layer):
            self.ffn_name = c.family.sparse.block
            router = dense(
                c.hidden_size,
                c.experts.num_experts,
                ("embed", None),
                use_bias=False,
                std=c.initializer_range,
                rngs=rngs,
                **kw,
            )
            activation = _ACTIVATIONS[c.hidden_act]
            setattr(self, self.ffn_name, SparseMoE(c, router, activation, rngs=rngs, **kw))
        else:
            self.mlp = MLP(c, rngs=rngs, **kw)

    def project(
        self, x: jax.Array, rope: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Normalises [B, T, D] and returns the rotated q [B, T, H, Dh] and k, v [B, T, K, Dh]."""
        return self.self_attn.qkv(self.input_layernorm(x), rope)

    def combine(
        self,
        x: jax.Array,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        visibility: Visibility,
        replay: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Adds attention of q over k/v (keys as `visibility` allows) and then the MLP to x;
        returns it with the experts each token used [B, T, k] (None for a dense MLP). A sparse
        block replays `replay` [B, T, k] where given (`SparseMoE.route`)."""
        attn = self.self_attn.attend(q, k, v, visibility)
        ffn = getattr(self, self.ffn_name)
        real = visibility.kv_valid if visibility.self_attention else None

        def feed(h: jax.Array) -> tuple[jax.Array, jax.Array | None]:
            if isinstance(ffn, SparseMoE):  # a full forward records the router's load
                return ffn(h, token_mask=real, replay=replay)
            return ffn(h), None

        if self.sandwich:
            x = x + self.post_attention_layernorm(attn)
            out, used = feed(self.pre_feedforward_layernorm(x))
            return x + self.post_feedforward_layernorm(out), used
        x = x + attn
        out, used = feed(self.post_attention_layernorm(x))
        return x + out, used
