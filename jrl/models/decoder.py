"""The decoder backbone and its heads: causal LM (with KV-cached forward) and value model."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jrl.models.config import ModelConfig
from jrl.models.layers import (
    DecoderLayer,
    RMSNorm,
    Visibility,
    dense,
    rope_frequencies,
    rope_tables,
)

MODEL_KINDS = ("causal_lm", "value")


class KVCache(NamedTuple):
    """Per-layer keys and values, each [num_layers, batch, max_len, num_kv_heads, head_dim]."""

    k: jax.Array
    v: jax.Array


def default_position_ids(attention_mask: jax.Array) -> jax.Array:
    """Positions that skip left padding: clip(cumsum(mask) - 1, 0)."""
    return jnp.clip(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


class Decoder(nnx.Module):
    """Token embedding, the decoder layers and the final norm."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        c = config
        self.embed_tokens = nnx.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=dtype,
            param_dtype=param_dtype,
            embedding_init=nnx.initializers.normal(c.initializer_range),
            rngs=rngs,
        )
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([DecoderLayer(c, i, rngs=rngs, **kw) for i in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=c.family.gemma, **kw)
        self.config = config

    def __call__(
        self,
        input_ids: jax.Array,
        position_ids: jax.Array,
        visibility: Visibility,
        cache: KVCache | None = None,
        cache_offset: jax.Array | int = 0,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states [B, T, D] (and the updated cache when one is given).

        Without a cache, the keys are this chunk's tokens; with one, they are the cache slots, and
        this chunk's k/v are written at `cache_offset` first. `visibility` says which keys each
        query sees.
        """
        c = self.config
        x = self.embed_tokens(input_ids)
        if c.family.gemma:
            x = x * jnp.asarray(c.hidden_size**0.5, x.dtype)
        ropes: dict[tuple[float, Any], tuple[jax.Array, jax.Array]] = {}
        for i, layer in enumerate(self.layers):
            rope_key = c.layer_rope(i)
            if rope_key not in ropes:
                ropes[rope_key] = rope_tables(position_ids, rope_frequencies(c.head_dim, *rope_key))
            q, k, v = layer.project(x, ropes[rope_key])
            if cache is not None:
                cache = _write_kv(cache, i, cache_offset, k, v)
                k, v = cache.k[i].astype(k.dtype), cache.v[i].astype(v.dtype)
            x = layer.combine(x, q, k, v, visibility)
        return self.norm(x), cache


def _write_kv(
    cache: KVCache, layer: int, offset: jax.Array | int, k: jax.Array, v: jax.Array
) -> KVCache:
    """Writes k, v [B, T, K, Dh] into cache slots offset .. offset+T-1 of `layer`."""
    start = (layer, 0, offset, 0, 0)
    return KVCache(
        jax.lax.dynamic_update_slice(cache.k, k[None].astype(cache.k.dtype), start),
        jax.lax.dynamic_update_slice(cache.v, v[None].astype(cache.v.dtype), start),
    )


class _DecoderModel(nnx.Module):
    """A backbone under the HF name `model`, shared by the heads."""

    def __init__(
        self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.model = Decoder(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def _head(self, features: int, use_bias: bool, rngs: nnx.Rngs) -> nnx.Module:
        """An output projection from the hidden size, initialised as HF does."""
        return dense(
            self.config.hidden_size,
            features,
            use_bias=use_bias,
            std=self.config.initializer_range,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            rngs=rngs,
        )

    def hidden(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Final-normed hidden states [B, T, D]; padding (attention_mask 0) is never attended."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        if position_ids is None:
            position_ids = default_position_ids(attention_mask)
        slots = jnp.arange(input_ids.shape[1], dtype=jnp.int32)
        visibility = Visibility(attention_mask.astype(jnp.bool_), slots, self_attention=True)
        return self.model(input_ids, position_ids, visibility)[0]


class CausalLM(_DecoderModel):
    """Decoder with a language-model head (tied to the embedding or separate)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ) -> None:
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.lm_head = (
            None if config.tie_word_embeddings else self._head(config.vocab_size, False, rngs)
        )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Logits [B, T, V] in float32."""
        return self.logits(self.hidden(input_ids, attention_mask, position_ids))

    def lm_head_kernel(self) -> jax.Array:
        """The output projection [D, V] (the embedding transposed when tied)."""
        if self.lm_head is None:
            return self.model.embed_tokens.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Projects hidden states [..., D] to float32 logits [..., V] (soft-capped to
        c * tanh(logits / c) when the config sets final_logit_softcapping c)."""
        kernel = self.lm_head_kernel().astype(self.dtype)
        logits = jnp.dot(hidden.astype(self.dtype), kernel, preferred_element_type=jnp.float32)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def init_cache(self, batch_size: int, max_len: int, dtype: Any = None) -> KVCache:
        """An all-zero KV cache (in the compute dtype unless `dtype` is given)."""
        c = self.config
        shape = (c.num_layers, batch_size, max_len, c.num_kv_heads, c.head_dim)
        dtype = dtype or self.dtype
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def forward_cached(
        self,
        input_ids: jax.Array,
        position_ids: jax.Array,
        cache: KVCache,
        cache_offset: jax.Array | int,
        kv_mask: jax.Array,
    ) -> tuple[jax.Array, KVCache]:
        """Runs a chunk [B, T] against the cache (prefill: offset 0; decode: T = 1).

        The chunk's k/v go to slots cache_offset .. cache_offset+T-1 (the caller keeps
        cache_offset + T <= max_len). Query t attends slot s iff s <= cache_offset + t and
        kv_mask[b, s] ([B, max_len] bool, marking every valid slot including this chunk's), and in
        sliding-window layers also cache_offset + t - s < sliding_window. Slots count tokens, so
        for rows whose valid tokens occupy consecutive slots (left padding, then generated tokens)
        the window spans the same positions as in the full forward.
        Returns (final-normed hidden [B, T, D], updated cache).
        """
        offset = jnp.asarray(cache_offset, jnp.int32)
        slots = offset + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
        visibility = Visibility(kv_mask.astype(jnp.bool_), slots, self_attention=False)
        return self.model(input_ids, position_ids, visibility, cache, offset)


class ValueModel(_DecoderModel):
    """Critic: decoder plus a one-output linear head `score` (HF token-classification layout)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ) -> None:
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.score = self._head(1, True, rngs)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Per-token values [B, T] in float32."""
        hidden = self.hidden(input_ids, attention_mask, position_ids).astype(self.dtype)
        kernel = self.score.kernel[...].astype(self.dtype)
        values = jnp.dot(hidden, kernel, preferred_element_type=jnp.float32)
        return values[..., 0] + self.score.bias[...].astype(jnp.float32)[0]


def model_class(kind: str) -> type[CausalLM] | type[ValueModel]:
    """The module class for a model kind ('causal_lm' or 'value')."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; use one of {MODEL_KINDS}")
    return CausalLM if kind == "causal_lm" else ValueModel


def init_random(
    config: ModelConfig,
    *,
    kind: str = "causal_lm",
    seed: int = 0,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
) -> CausalLM | ValueModel:
    """A randomly initialised model (N(0, initializer_range) weights, unit norms, zero biases)."""
    cls = model_class(kind)
    return cls(config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))
