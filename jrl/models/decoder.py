"""The decoder backbone and its heads: causal LM (with KV-cached forward) and value model."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import Recompute, checkpoint_name

from jrl.models.attention import Visibility
from jrl.models.config import ModelConfig
from jrl.models.dtypes import cache_dtype
from jrl.models.kv_layout import AxisOrder, KVLayout
from jrl.models.layers import DecoderLayer, RMSNorm, dense, rope_frequencies, rope_tables
from jrl.parallel.devices import mesh_platform
from jrl.parallel.mesh import constrain_activations, sequence_mesh, sequence_parallel_size
from jrl.parallel.sharding import logical_axes

MODEL_KINDS = ("causal_lm", "value", "reward")
# The checkpoint name of each decoder layer's input (what full remat keeps, or offloads).
LAYER_INPUT = "decoder_layer_input"
OFFLOAD_BACKENDS = ("gpu", "cuda", "rocm", "tpu")


# cos and sin [positions, head_dim // 2] by (base frequency, scaling) (`Decoder.position_tables`).
RopeByPosition = dict[tuple[float, Any], tuple[jax.Array, jax.Array]]


class DecoderOut(NamedTuple):
    """What the backbone returns: final-normed hidden states [B, T, D], the updated cache (None
    without one), and the experts each token used in each sparse layer [B, T, sparse layers, k]
    int32 (None for a dense model)."""

    hidden: jax.Array
    cache: KVCache | None
    routes: jax.Array | None


class KVCache(NamedTuple):
    """Keys and values, each a tuple of buffers [batch, max_len, num_kv_heads, head_dim] in the
    axis order `config.kv_layout` gives the platform: one buffer per layer, or one buffer
    [layers, ...] for all (`jrl.models.kv_layout`)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def default_position_ids(attention_mask: jax.Array) -> jax.Array:
    """Positions that skip left padding: clip(cumsum(mask) - 1, 0)."""
    return jnp.clip(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


@functools.cache
def host_offload_supported(backend: str) -> bool:
    """Whether activations can be offloaded to pinned host memory on `backend` (GPU, TPU).

    Warns once per backend where they cannot (on CPU the device memory is host memory already).
    """
    if backend in OFFLOAD_BACKENDS:
        return True
    warnings.warn(
        f"enable_activation_offload: the {backend!r} backend has no separate device memory to "
        "offload from; activations stay where they are and layers are only rematerialised",
        stacklevel=2,
    )
    return False


def layer_checkpoint_policy(remat_policy: str, activation_offload: bool) -> Callable[..., Any]:
    """The `jax.checkpoint` policy of a rematerialised decoder layer ('full' or 'dots').

    'full' saves nothing inside the layer (only its input survives); 'dots' also saves the
    outputs of matmuls without batch dimensions. With `activation_offload` (where the backend
    allows it) the layer input and those outputs go to pinned host memory instead.
    """
    policies = jax.checkpoint_policies
    if not (activation_offload and host_offload_supported(mesh_platform())):
        if remat_policy == "dots":
            return policies.dots_with_no_batch_dims_saveable
        return policies.nothing_saveable
    offload_input = policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[LAYER_INPUT],
        offload_src="device",
        offload_dst="pinned_host",
    )
    if remat_policy == "full":
        return offload_input
    offload_dots = policies.offload_dot_with_no_batch_dims("device", "pinned_host")

    def offload_input_and_dots(prim: Any, *args: Any, **params: Any) -> Any:
        decision = offload_input(prim, *args, **params)
        return offload_dots(prim, *args, **params) if decision is Recompute else decision

    return offload_input_and_dots


def set_memory_options(
    model: nnx.Module, *, remat_policy: str, activation_offload: bool = False
) -> None:
    """Sets how `model`'s decoder layers trade compute for memory in training (in place).

    See `ModelConfig.remat_policy` and `ModelConfig.activation_offload`; call it before
    `nnx.split`, since the options are static data of the module graph.
    """
    config = dataclasses.replace(
        model.config, remat_policy=remat_policy, activation_offload=activation_offload
    )
    model.config = config
    model.model.config = config


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
            embedding_metadata=logical_axes("vocab", "embed"),
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
        rope: RopeByPosition | None = None,
        replay: jax.Array | None = None,
    ) -> DecoderOut:
        """Final-normed hidden states [B, T, D], the updated cache when one is given, and the
        experts the sparse layers used.

        Without a cache, the keys are this chunk's tokens; with one, they are the cache slots, and
        this chunk's k/v are written at `cache_offset` first. `visibility` says which keys each
        query sees. The rotary tables come from `rope` (`position_tables`) where given, else
        from the positions. `replay` [B, T, sparse layers, k] gives the sparse layers routes to
        replay (`jrl.models.moe`: entries `ROUTE_NONE` route afresh).
        """
        c = self.config
        x = self.embed_tokens(input_ids)
        if c.family.gemma:
            x = x * jnp.asarray(c.hidden_size**0.5, x.dtype)
        ropes: dict[tuple[float, Any], tuple[jax.Array, jax.Array]] = {}
        if cache is None:
            x = constrain_activations(x)
        run_layer = self._layer_fn(visibility)
        layout = c.kv_layout(mesh_platform())
        sparse = {layer: j for j, layer in enumerate(c.sparse_layers)}
        routes = []
        for i, layer in enumerate(self.layers):
            rope_key = c.layer_rope(i)
            if rope_key not in ropes:
                ropes[rope_key] = (
                    rope_tables(position_ids, rope_frequencies(c.head_dim, *rope_key))
                    if rope is None
                    else tuple(table[position_ids] for table in rope[rope_key])
                )
            routed = None if replay is None or i not in sparse else replay[:, :, sparse[i]]
            if cache is None:
                x, used = run_layer(layer, x, ropes[rope_key], routed)
                x = constrain_activations(x)
            else:
                q, k, v = layer.project(x, ropes[rope_key])
                cache = _write_kv(cache, layout, i, cache_offset, k, v)
                buffer, index = layout.where(i)
                k = layout.keys.take(cache.k[buffer][index])  # as stored: attention takes any dtype
                v = layout.values.take(cache.v[buffer][index])
                x, used = layer.combine(x, q, k, v, visibility, routed)
            if used is not None:
                routes.append(used)
        return DecoderOut(self.norm(x), cache, jnp.stack(routes, axis=2) if routes else None)

    def position_tables(self, positions: int) -> RopeByPosition:
        """cos and sin [positions, head_dim // 2] of positions 0 .. positions-1 for each rotary
        embedding the layers use, to index by position (`rope`): a decode loop that takes them
        from outside evaluates no cos or sin (XLA:CPU evaluated them anew in every layer's q and
        k fusions, for every head: a tenth of a decode step of SmolLM2-135M)."""
        c = self.config
        every = jnp.arange(positions, dtype=jnp.int32)
        return {
            key: rope_tables(every, rope_frequencies(c.head_dim, *key))
            for key in dict.fromkeys(c.layer_rope(i) for i in range(c.num_layers))
        }

    def _layer_fn(
        self, visibility: Visibility
    ) -> Callable[..., tuple[jax.Array, jax.Array | None]]:
        """One layer of the cache-free forward (layer, x, rope, replay) -> (x, experts used),
        rematerialised as `config.remat_policy` says."""

        def run(
            layer: DecoderLayer,
            x: jax.Array,
            rope: tuple[jax.Array, jax.Array],
            replay: jax.Array | None,
        ) -> tuple[jax.Array, jax.Array | None]:
            x = checkpoint_name(x, LAYER_INPUT)
            q, k, v = layer.project(x, rope)
            return layer.combine(x, q, k, v, visibility, replay)

        c = self.config
        if c.remat_policy == "none":
            return run
        return nnx.remat(run, policy=layer_checkpoint_policy(c.remat_policy, c.activation_offload))


def _write_kv(
    cache: KVCache,
    layout: KVLayout,
    layer: int,
    offset: jax.Array | int,
    k: jax.Array,
    v: jax.Array,
) -> KVCache:
    """Writes k, v [B, T, K, Dh] into cache slots offset .. offset+T-1 of `layer`; an
    `offset` [B] gives each row its own (columns past the cache are dropped)."""
    buffer, index = layout.where(layer)
    per_row = jnp.ndim(offset) == 1

    def write(
        buffers: tuple[jax.Array, ...], order: AxisOrder, new: jax.Array
    ) -> tuple[jax.Array, ...]:
        target = buffers[buffer]
        if per_row:
            # Row b, column offset[b] + t; (kv_heads, head_dim) keep their order in every
            # AxisOrder, so the indexed value is the logical [B, T, K, Dh] as it is.
            columns = offset[:, None] + jnp.arange(new.shape[1], dtype=jnp.int32)
            at: list[Any] = [*index, jnp.arange(new.shape[0])[:, None], *[slice(None)] * 3]
            at[len(index) + order.token_axis] = columns
            updated = target.at[tuple(at)].set(new.astype(target.dtype), mode="drop")
        else:
            start: list[jax.Array | int] = [*index, 0, 0, 0, 0]
            start[len(index) + order.token_axis] = offset
            new = order.put(new)[(None,) * len(index)].astype(target.dtype)
            updated = jax.lax.dynamic_update_slice(target, new, start)
        return (*buffers[:buffer], updated, *buffers[buffer + 1 :])

    return KVCache(write(cache.k, layout.keys, k), write(cache.v, layout.values, v))


class _DecoderModel(nnx.Module):
    """A backbone under the HF name `model`, shared by the heads."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.model = Decoder(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self._init_head(rngs)

    def _init_head(self, rngs: nnx.Rngs) -> None:
        """Creates the head on top of the backbone (each model kind has its own)."""
        raise NotImplementedError

    def _head(self, features: int, axis: str | None, use_bias: bool, rngs: nnx.Rngs) -> nnx.Module:
        """An output projection from the hidden size to `features` (logical axis `axis`),
        initialised as HF does."""
        return dense(
            self.config.hidden_size,
            features,
            ("embed", axis),
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
        segment_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Final-normed hidden states [B, T, D] (`routed_hidden`'s)."""
        inputs = (input_ids, attention_mask, position_ids, segment_ids, branch_ids)
        return self.routed_hidden(*inputs)[0]

    def routed_hidden(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
        replay: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Final-normed hidden states [B, T, D] and the experts each token used in each sparse
        layer [B, T, sparse layers, k] (None for a dense model); padding (attention_mask 0) is
        never attended. `replay` [B, T, sparse layers, k] gives routes to replay
        (`Decoder.__call__`).

        Packed rows give `segment_ids` [B, T] instead of `attention_mask`: each token attends the
        earlier tokens of its own segment only, 0 marks padding, and `position_ids` (required)
        count from 0 within each segment; `branch_ids` [B, T] (prompts shared by several answers,
        `Visibility`) narrow that to the segment's branch-0 tokens and the token's own branch.
        Under sequence parallelism (`jrl.parallel.on_mesh`) rows are right-padded to a multiple
        of the `sequence` axis and cut back afterwards.
        """
        mesh, length = sequence_mesh(), input_ids.shape[1]
        multiple = 1 if mesh is None else sequence_parallel_size(mesh)
        if length % multiple:
            pad = functools.partial(_pad_length, length=length + -length % multiple)
            inputs = (input_ids, attention_mask, position_ids, segment_ids, branch_ids, replay)
            hidden, routes = self.routed_hidden(*map(pad, inputs))
            return hidden[:, :length], None if routes is None else routes[:, :length]
        if segment_ids is not None:
            if attention_mask is not None or position_ids is None:
                raise ValueError(
                    "packed rows take segment_ids and position_ids, without attention_mask"
                )
            attention_mask = segment_ids != 0
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        if position_ids is None:
            position_ids = default_position_ids(attention_mask)
        slots = jnp.arange(input_ids.shape[1], dtype=jnp.int32)
        visibility = Visibility(
            attention_mask.astype(jnp.bool_),
            slots,
            self_attention=True,
            segment_ids=segment_ids,
            branch_ids=branch_ids,
            positions=None if branch_ids is None else position_ids,
        )
        out = self.model(input_ids, position_ids, visibility, replay=replay)
        return out.hidden, out.routes


def _pad_length(x: jax.Array | None, length: int) -> jax.Array | None:
    """[B, T, ...] right-padded with zeros to [B, length, ...] (None stays None)."""
    if x is None:
        return None
    return jnp.pad(x, ((0, 0), (0, length - x.shape[1])) + ((0, 0),) * (x.ndim - 2))


class CausalLM(_DecoderModel):
    """Decoder with a language-model head (tied to the embedding or separate)."""

    def _init_head(self, rngs: nnx.Rngs) -> None:
        """The LM head `lm_head` [D, V] (None when tied to the embedding)."""
        c = self.config
        tied = c.tie_word_embeddings
        self.lm_head = None if tied else self._head(c.vocab_size, "vocab", False, rngs)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Logits [B, T, V] in float32."""
        return self.logits(self.hidden(input_ids, attention_mask, position_ids))

    def _output_projection(self) -> tuple[jax.Array, int]:
        """(the output projection as stored, its axis of D): the embedding [V, D] when tied,
        else `lm_head`'s kernel [D, V]."""
        if self.lm_head is None:
            return self.model.embed_tokens.embedding[...], 1
        return self.lm_head.kernel[...], 0

    def lm_head_kernel(self) -> jax.Array:
        """The output projection [D, V] (the embedding transposed when tied)."""
        kernel, contracted = self._output_projection()
        return kernel.T if contracted else kernel

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Projects hidden states [..., D] to float32 logits [..., V] (soft-capped to
        c * tanh(logits / c) when the config sets final_logit_softcapping c). The projection
        is contracted as it lies: a transposed embedding made XLA:CPU copy it, in float32, at
        every decode step."""
        kernel, contracted = self._output_projection()
        dims = (((hidden.ndim - 1,), (contracted,)), ((), ()))
        logits = jax.lax.dot_general(
            hidden.astype(self.dtype),
            kernel.astype(self.dtype),
            dims,
            preferred_element_type=jnp.float32,
        )
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def init_cache(self, batch_size: int, max_len: int, dtype: Any = None) -> KVCache:
        """An all-zero KV cache for values in the compute dtype unless `dtype` is given, held as
        `cache_dtype` says."""
        c = self.config
        layout = c.kv_layout(mesh_platform())
        shapes = layout.shapes(c.num_layers, batch_size, max_len, c.num_kv_heads, c.head_dim)
        dtype = cache_dtype(layout, dtype or self.dtype)
        return KVCache(*(tuple(jnp.zeros(shape, dtype) for shape in part) for part in shapes))

    def forward_cached(
        self,
        input_ids: jax.Array,
        position_ids: jax.Array,
        cache: KVCache,
        cache_offset: jax.Array | int,
        kv_mask: jax.Array,
        slots: tuple[jax.Array, jax.Array] | None = None,
        rope: RopeByPosition | None = None,
    ) -> DecoderOut:
        """Runs a chunk [B, T] against the cache (prefill: offset 0; decode: T = 1).

        The chunk's k/v go to columns cache_offset .. cache_offset+T-1 (the caller keeps
        cache_offset + T <= max_len; a `cache_offset` [B] gives each row its own). A column's
        slot is its index, a query's slot the column it writes, unless `slots` = (query slots
        [B, T], column slots [B, max_len]) gives them (a cache whose columns do not hold the
        tokens in order). Query t attends column s iff kv_mask[b, s] ([B, max_len] bool, marking
        every valid column including this chunk's) and the column's slot is not after the
        query's, and in sliding-window layers also the slots differ by less than sliding_window.
        Slots count tokens, so for rows whose valid tokens occupy consecutive slots (left
        padding, then generated tokens) the window spans the same positions as in the full
        forward.
        `rope` gives the rotary tables by position (`Decoder.position_tables`, covering every
        position of the chunk). Returns `DecoderOut`: final-normed hidden [B, T, D], the updated
        cache, the experts each token used (None for a dense model).
        """
        offset = jnp.asarray(cache_offset, jnp.int32)
        valid = kv_mask.astype(jnp.bool_)
        if slots is None:
            queries = offset[..., None] + jnp.arange(input_ids.shape[1], dtype=jnp.int32)
            first = cache_offset if isinstance(cache_offset, int) else None
            visibility = Visibility(valid, queries, False, first_query_slot=first)
        else:
            visibility = Visibility(valid, slots[0], self_attention=False, kv_slots=slots[1])
        return self.model(input_ids, position_ids, visibility, cache, offset, rope)


class _ScoreModel(_DecoderModel):
    """A backbone with a one-output linear head `score` (with a bias when `score_bias`)."""

    score_bias: ClassVar[bool]

    def _init_head(self, rngs: nnx.Rngs) -> None:
        """The one-output head `score`."""
        self.score = self._head(1, None, self.score_bias, rngs)

    def _score(self, hidden: jax.Array) -> jax.Array:
        """The one-output `score` head at every position: [B, T] float32."""
        kernel = self.score.kernel[...].astype(self.dtype)
        out = jnp.dot(hidden.astype(self.dtype), kernel, preferred_element_type=jnp.float32)[..., 0]
        if self.score.bias is not None:
            out = out + self.score.bias[...].astype(jnp.float32)[0]
        return out


class ValueModel(_ScoreModel):
    """Critic: decoder plus a one-output linear head `score` (HF token-classification layout)."""

    score_bias = True

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Per-token values [B, T] in float32 (of packed rows when `segment_ids` is given; see
        `hidden` for `branch_ids`)."""
        hidden = self.hidden(input_ids, attention_mask, position_ids, segment_ids, branch_ids)
        return self._score(hidden)


def model_class(kind: str) -> type[CausalLM] | type[ValueModel] | type[RewardModel]:
    """The module class for a model kind ('causal_lm', 'value' or 'reward')."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; use one of {MODEL_KINDS}")
    return {"causal_lm": CausalLM, "value": ValueModel, "reward": RewardModel}[kind]


def init_random(
    config: ModelConfig,
    *,
    kind: str = "causal_lm",
    seed: int = 0,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
) -> CausalLM | ValueModel | RewardModel:
    """A randomly initialised model (N(0, initializer_range) weights, unit norms, zero biases)."""
    cls = model_class(kind)
    return cls(config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))


def last_valid_index(attention_mask: jax.Array) -> jax.Array:
    """Per row [B], the index of the rightmost token with attention_mask 1 (0 for an empty row)."""
    positions = jnp.arange(attention_mask.shape[-1], dtype=jnp.int32)
    return jnp.argmax(positions * attention_mask.astype(jnp.int32), axis=-1)


class RewardModel(_ScoreModel):
    """Reward model: decoder plus a bias-free one-output head `score` (HF sequence-classification
    layout with num_labels=1).

    The reward of a row is the score at its rightmost token with attention_mask 1, so left and right
    padding both work. transformers instead takes the rightmost token whose id differs from
    pad_token_id: the same token under either padding, unless a valid token's id equals
    pad_token_id (e.g. pad = eos and the row ends with eos), where transformers scores an earlier
    token and this model scores the masked-in one.
    """

    score_bias = False

    def token_scores(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """The head's output at every position [B, T] in float32."""
        return self._score(self.hidden(input_ids, attention_mask, position_ids))

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Rewards [B] in float32: the score at each row's last valid token."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        scores = self.token_scores(input_ids, attention_mask, position_ids)
        last = last_valid_index(attention_mask)
        return jnp.take_along_axis(scores, last[:, None], axis=-1)[:, 0]
