"""Attention kernels: who sees whom (`Visibility`), the eager reference, cuDNN (``sdpa`` /
``flash_attention_2`` on GPU) and the Pallas splash kernel (TPU), picked per call from the
platform of the ambient mesh's devices (`mesh_platform`), and Ulysses sequence parallelism
around them (all-to-all over the mesh's ``sequence`` axis). Scores are computed in float32.

XLA cannot partition a Pallas kernel, and cuDNN's own partitioning rejects (only when compiling)
a split sequence or q, k, v split differently, so under an ambient mesh of several devices the
splash and cuDNN kernels run per device inside a `jax.shard_map` (`per_device`): rows over the
batch axes, heads over ``tensor``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jrl.models.dtypes import product_dtype
from jrl.parallel.devices import mesh_platform
from jrl.parallel.mesh import (
    SEQUENCE_AXIS,
    batch_axes,
    row_axes,
    sequence_mesh,
    sequence_parallel_size,
)

# Masked attention scores get this (finite) value so that rows without any valid key stay NaN-free.
MASKED_SCORE = -1e30
# Sequence lengths must be a multiple of this block for the Pallas splash kernel.
SPLASH_BLOCK = 128
# The config key that sets the sequence-parallel size (named in errors).
SP_KEY = "ulysses_sequence_parallel_size"
# The mesh axis that splits attention heads in tensor parallelism.
TENSOR_AXIS = "tensor"
# Queries per block where the eager kernel skips the key columns after a block's last query.
CAUSAL_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Visibility:
    """Which key slots each query may attend.

    Query t sits at slot q_slots[t] ([T] int32, or [B, T] per row); key column s holds slot
    kv_slots[b, s] ([B, S] int32; its column index s when None). Key column s is visible to query
    t iff kv_valid[b, s] ([B, S] bool) and its slot <= q_slots[t], and in a sliding-window layer
    also q_slots[t] - slot < window. A query always sees its own slot, so rows of padding never
    have an empty softmax. `self_attention` marks the full forward, where the queries are the keys
    (q_slots = arange(S)). `segment_ids` ([B, S] int, self-attention only) holds packed sequences:
    a key is then visible only to queries of the same segment. `branch_ids` ([B, S] int, with
    `segment_ids`) hold answers sharing their prompt: a key of branch 0 (the prompt) is visible to
    its whole segment, any other key only to queries of its own branch. The answers' slots then
    no longer count the distance from the prompt, so a sliding window counts `positions` ([B, S]
    int, the tokens' position ids) instead. `first_query_slot` (static; set by a cached
    prefill) says that query t sits at slot first_query_slot + t and key columns at their
    index: then no query sees a column after its own slot, which the eager kernel uses to skip
    them (`causal_blocks`). The full forward leaves it unset: set there too, CI's two SmolLM2
    training tests ran 34-40 s longer (packed rows, a block per 128 tokens, both directions).
    """

    kv_valid: jax.Array
    q_slots: jax.Array
    self_attention: bool
    segment_ids: jax.Array | None = None
    kv_slots: jax.Array | None = None
    branch_ids: jax.Array | None = None
    positions: jax.Array | None = None
    first_query_slot: int | None = None

    def mask(self, window: int | None) -> jax.Array:
        """The bool mask [B, T, S]."""
        if self.kv_slots is None:
            kv = jnp.arange(self.kv_valid.shape[1], dtype=jnp.int32)[None, None, :]
        else:
            kv = self.kv_slots[:, None, :]
        q = self.q_slots[..., :, None]
        visible = kv <= q
        if window is not None and self.positions is not None:
            visible &= self.positions[:, :, None] - self.positions[:, None, :] < window
        elif window is not None:
            visible &= q - kv < window
        allowed = visible & self.kv_valid[:, None, :]
        if self.segment_ids is not None:
            allowed &= self.segment_ids[:, :, None] == self.segment_ids[:, None, :]
        if self.branch_ids is not None:
            key_branch = self.branch_ids[:, None, :]
            allowed &= (key_branch == 0) | (key_branch == self.branch_ids[:, :, None])
        return allowed | (kv == q)

    def segments(self) -> jax.Array:
        """Segment ids [B, S] int32: the packed ones, else 1 for valid keys and 0 for padding."""
        if self.segment_ids is not None:
            return self.segment_ids.astype(jnp.int32)
        return self.kv_valid.astype(jnp.int32)


def eager_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    *,
    scale: float,
    softcap: float | None = None,
) -> jax.Array:
    """Grouped-query softmax attention as plain einsums.

    q [B, T, H, D]; k, v [B, S, K, D] with H a multiple of K (query head h uses kv head h // (H/K));
    mask [B, T, S] bool. Scores are scale * q.k, soft-capped to softcap * tanh(score / softcap)
    when `softcap` is set. Returns [B, T, H, D] in q's dtype. k and v may be held wider than q
    (a cache of bfloat16 values kept in float32): the products accumulate in float32 either way
    and the probabilities take q's dtype, so the result is the same.
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, h // kv_heads, d)
    one_query_on_cpu = t == 1 and mesh_platform() == "cpu"
    if not one_query_on_cpu:
        k, v = _as_query_dtype(q, k, v)
    scores = _scores(q, k, summed=one_query_on_cpu) * scale  # [B, K, T, G, S]
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    scores = jnp.where(mask[:, None, :, None, :], scores, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = _weighted_values(probs, v, summed=one_query_on_cpu and q.dtype != jnp.float32)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, t, h, d).astype(q.dtype)


def _as_query_dtype(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """k and v in q's dtype: a float32 cache of bfloat16 values (the CPU's) goes back to
    bfloat16 exactly, and then XLA:CPU multiplies on its bfloat16 matrix units (AMX) instead of
    in float32 (SmolLM2's bfloat16 prefill of 512 tokens: its value product fused with the
    softmax took a quarter of the call)."""
    return k.astype(q.dtype), v.astype(q.dtype)


def _scores(q: jax.Array, k: jax.Array, *, summed: bool) -> jax.Array:
    """q.k in float32: q [B, T, K, G, D], k [B, S, K, D] -> [B, K, T, G, S].

    `summed` (one query per row, a decode step, on CPU) spells it q * k summed over D: XLA:CPU
    fuses that into one pass over the cache, where the product runs as B * K products
    [G, D] @ [D, S] of a few rows each. The quickstart model's decode is 3.5% (float32, AMD
    EPYC) to 7% (bfloat16, Xeon) faster; float32 tokens are the same.
    """
    if summed:
        by_head = q.astype(jnp.float32).transpose(0, 2, 1, 3, 4)[..., None]  # [B, K, T, G, D, 1]
        keys = k.astype(jnp.float32).transpose(0, 2, 3, 1)[:, :, None, None]  # [B, K, 1, 1, D, S]
        return jnp.sum(by_head * keys, axis=4)
    batch = ((0, 2), (0, 2))  # (B, K) of q [B, T, K, G, D] and of k [B, S, K, D]
    return jax.lax.dot_general(q, k, (((4,), (3,)), batch), preferred_element_type=jnp.float32)


def _weighted_values(probs: jax.Array, v: jax.Array, *, summed: bool) -> jax.Array:
    """probs @ v: probs [B, K, T, G, S], v [B, S, K, D] -> [B, K, T, G, D], accumulated in
    float32.

    Batched over (B, K) with the queries' rows first. (Spelled as an einsum, XLA:CPU computed
    it as v^T @ probs^T through a slower kernel: a sixth of the decode step of a 135M model.)
    `summed` spells it probs * v summed over S, in float32: for 16-bit probabilities against a
    float32 cache on CPU, 2% faster than the product (SmolLM2 bfloat16 decode, Xeon); with float32
    probabilities the product is faster.
    """
    if summed:
        values = v.astype(jnp.float32).transpose(0, 2, 1, 3)[:, :, None, None]  # [B, K, 1, 1, S, D]
        return jnp.sum(probs.astype(jnp.float32)[..., None] * values, axis=4)
    dims = (((4,), (1,)), ((0, 1), (0, 2)))
    return jax.lax.dot_general(probs, v, dims, preferred_element_type=product_dtype())


def causal_blocks(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    *,
    first_query_slot: int,
    scale: float,
    softcap: float | None = None,
) -> jax.Array:
    """`eager_attention` of `CAUSAL_BLOCK` queries at a time, each block over the key columns
    up to its last query's slot (first_query_slot + t; later columns are masked for all of the
    block's queries, so the result is the same). A prefill of T tokens then computes about
    (T / CAUSAL_BLOCK + 1) / (2 T / CAUSAL_BLOCK) of the scores: 62% at 512."""
    blocks = []
    for start in range(0, q.shape[1], CAUSAL_BLOCK):
        stop = min(start + CAUSAL_BLOCK, q.shape[1])
        seen = min(first_query_slot + stop, k.shape[1])
        block = eager_attention(
            q[:, start:stop],
            k[:, :seen],
            v[:, :seen],
            mask[:, start:stop, :seen],
            scale=scale,
            softcap=softcap,
        )
        blocks.append(block)
    return jnp.concatenate(blocks, axis=1)


def _splash_module() -> Any:
    """The Pallas TPU splash-attention package, or None when it cannot be imported."""
    try:
        from jax.experimental.pallas.ops.tpu import splash_attention
    except ImportError:
        return None
    return splash_attention


def _splash_kernel(
    length: int, groups: int, window: int | None, softcap: float | None, interpret: bool
) -> Any:
    """A causal (or causal local-window) splash kernel for `groups` query heads per kv head.

    Built per call: its mask tables become arrays of the trace it is called in (inside a
    `shard_map`, tracers tied to its mesh), so a cached kernel would leak them into later traces;
    the costly mask processing is cached by the splash package itself."""
    splash = _splash_module()
    shape = (length, length)
    if window is None:
        mask = splash.CausalMask(shape)
    else:
        mask = splash.LocalMask(shape, (window - 1, 0), offset=0)
    return splash.make_splash_mqa_single_device(
        splash.MultiHeadMask([mask] * groups),
        attn_logits_soft_cap=softcap,
        interpret=interpret,
    )


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segments: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Causal self-attention through the Pallas TPU splash kernel (`interpret` runs it anywhere).

    q [B, T, H, D]; k, v [B, T, K, D]; segments [B, T] int or bool (a valid mask is segment 1,
    padding 0). T must be a multiple of SPLASH_BLOCK. Tokens attend tokens of their own segment
    only; padding attends padding, so its rows are not those of the other implementations (their
    outputs are never used).
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[2]
    kernel = _splash_kernel(t, h // kv_heads, window, softcap, interpret)
    segment_ids = _splash_module().SegmentIds
    q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    q = q.reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)
    k, v = (x.transpose(0, 2, 1, 3) for x in (k, v))

    def one_row(q: jax.Array, k: jax.Array, v: jax.Array, row: jax.Array) -> jax.Array:
        ids = segment_ids(row.astype(jnp.int32), row.astype(jnp.int32))
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(q, k, v)

    out = jax.vmap(one_row)(q, k, v, segments)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _cudnn_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float
) -> jax.Array:
    """cuDNN flash attention (`jax.nn.dot_product_attention`) under the bool mask [B, T, S]."""
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask[:, None], scale=scale, implementation="cudnn"
    )


def _fall_back(requested: str, reason: str, picked: str) -> str:
    warnings.warn(
        f"attn_implementation={requested!r}: {reason}; using {picked!r} instead", stacklevel=3
    )
    return picked


def _repeat_kv(k: jax.Array, v: jax.Array, devices: int) -> tuple[jax.Array, jax.Array]:
    """k, v [B, S, K, D] with each kv head repeated devices / K times when K (a divisor of
    `devices`) does not split over them, so each query head keeps its kv head."""
    kv_heads = k.shape[2]
    if kv_heads % devices == 0:
        return k, v
    return jnp.repeat(k, devices // kv_heads, axis=2), jnp.repeat(v, devices // kv_heads, axis=2)


def per_device(
    kernel: Callable[..., jax.Array],
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *row_arrays: jax.Array,
    requested: str,
) -> jax.Array:
    """`kernel(q, k, v, *row_arrays)` run by each device on its own rows and heads, for a kernel
    XLA cannot partition (Pallas, cuDNN) under an ambient mesh whose non-manual axes hold several
    devices.

    The `jax.shard_map` is manual over the ambient mesh's axes not manual yet (none inside
    `ulysses_attention`, whose kernels run directly). Its specs: q [B, T, H, D], k, v
    [B, S, K, D] and the output [B, T, H, D] are P(rows, None, heads, None), each of
    `row_arrays` [B, ...] is P(rows); rows are the batch axes when B splits over them (else
    None), heads is `tensor` when H and K split over it (kv heads fewer than the `tensor`
    devices are repeated first). Heads that do not split run whole on every `tensor` device,
    with a warning naming `requested` (the attn_implementation). Axes named by no spec (e.g.
    `sequence` in cached decoding) hold whole copies.
    """
    mesh = jax.sharding.get_abstract_mesh()
    free = () if mesh.empty else tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    if math.prod(mesh.shape[a] for a in free) == 1:
        return kernel(q, k, v, *row_arrays)
    rows = tuple(a for a in batch_axes() if a in free)
    if q.shape[0] % math.prod(mesh.shape[a] for a in rows):
        rows = ()
    heads = None
    tensor = mesh.shape[TENSOR_AXIS] if TENSOR_AXIS in free else 1
    num_heads, kv_heads = q.shape[2], k.shape[2]
    kv_split = kv_heads % tensor == 0 or tensor % kv_heads == 0
    if tensor > 1 and num_heads % tensor == 0 and kv_split:
        k, v = _repeat_kv(k, v, tensor)
        heads = TENSOR_AXIS
    elif tensor > 1:
        warnings.warn(
            f"attn_implementation={requested!r}: {num_heads} query heads and {kv_heads} kv heads "
            f"do not split over the {tensor} '{TENSOR_AXIS}' devices (the query heads must be a "
            "multiple of them and the kv heads a multiple or a divisor); every device runs the "
            "kernel on all heads",
            stacklevel=3,
        )
    split = PartitionSpec(rows or None, None, heads, None)
    return jax.shard_map(
        kernel,
        mesh=mesh,
        in_specs=(split, split, split, *[PartitionSpec(rows or None)] * len(row_arrays)),
        out_specs=split,
        axis_names=set(free),
        check_vma=False,
    )(q, k, v, *row_arrays)


def _flash_kernel(
    backend: str, *, softcap: float | None, dtype: Any, visibility: Visibility
) -> tuple[str, str | None]:
    """(kernel, why it is not a flash kernel or None) for flash_attention_2 on `backend`."""
    portable = "eager" if softcap is not None else "sdpa"
    if backend == "tpu":
        length = visibility.kv_valid.shape[1]
        if _splash_module() is None:
            return portable, "Pallas splash attention is not importable"
        if not visibility.self_attention:
            return portable, "the splash kernel runs full sequences, not cached decoding"
        if visibility.branch_ids is not None:
            return portable, "the splash kernel has no mask for prompts shared by several answers"
        if length % SPLASH_BLOCK:
            return portable, f"the splash kernel needs a multiple of {SPLASH_BLOCK} tokens"
        return "splash", None
    if backend in ("gpu", "cuda", "rocm"):
        if softcap is not None:
            return "eager", "cuDNN attention has no logit soft-capping"
        if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
            return "sdpa", f"cuDNN flash attention needs bfloat16/float16, not {jnp.dtype(dtype)}"
        return "cudnn", None
    return portable, f"it needs a GPU (cuDNN) or TPU (Pallas) and the backend is {backend!r}"


def _pick_kernel(
    requested: str, *, softcap: float | None, dtype: Any, visibility: Visibility
) -> str:
    """The kernel that runs: 'eager', 'sdpa', 'cudnn' or 'splash' (warns when it differs)."""
    if requested == "eager":
        return "eager"
    if requested == "sdpa":
        if softcap is None:
            return "sdpa"
        return _fall_back(requested, "jax.nn.dot_product_attention has no soft-capping", "eager")
    backend = mesh_platform()
    kernel, reason = _flash_kernel(backend, softcap=softcap, dtype=dtype, visibility=visibility)
    return kernel if reason is None else _fall_back(requested, reason, kernel)


def check_sequence_heads(
    num_heads: int, num_kv_heads: int, sequence_parallel: int, key: str = SP_KEY
) -> None:
    """Fails unless Ulysses can split the heads over `sequence_parallel` devices: the query heads
    must be a multiple of it and the kv heads a multiple or a divisor of it (smaller kv-head
    counts are repeated). `key` names the config key for the message."""

    def splits(sp: int) -> bool:
        return num_heads % sp == 0 and (num_kv_heads % sp == 0 or sp % num_kv_heads == 0)

    if sequence_parallel <= 1 or splits(sequence_parallel):
        return
    sp = sequence_parallel
    fits = ", ".join(str(d) for d in range(1, num_heads + 1) if splits(d))
    raise ValueError(
        f"{key}={sp}: sequence parallelism splits attention heads over {sp} devices, so "
        f"num_attention_heads ({num_heads}) must be a multiple of it and num_key_value_heads "
        f"({num_kv_heads}) a multiple or a divisor of it; use one of {fits}"
    )


def ulysses_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, visibility: Visibility, **kwargs: Any
) -> jax.Array:
    """`attention` of self-attention q [B, S, H, D], k, v [B, S, K, D] whose S is split over the
    ambient mesh's `sequence` axis, as DeepSpeed-Ulysses does.

    Per device, an all-to-all trades the sequence split for a head split (q, k, v become
    [B, S, H/sp, D] with whole sequences), attention runs locally with any kernel, and a second
    all-to-all returns the output [B, S, H, D] split over S again. Kv heads fewer than the
    devices are repeated first (each query head keeps its kv head). `kwargs` as `attention`.
    """
    if visibility.branch_ids is not None:
        raise ValueError("prompts shared by several answers do not pack under sequence parallelism")
    mesh = sequence_mesh()
    sp = sequence_parallel_size(mesh)
    check_sequence_heads(q.shape[2], k.shape[2], sp)
    k, v = _repeat_kv(k, v, sp)
    rows = row_axes(mesh, q.shape[0])
    split = PartitionSpec(rows, SEQUENCE_AXIS, None, None)
    whole = PartitionSpec(rows, None)
    segments = visibility.segments()

    def local(
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        kv_valid: jax.Array,
        segment_ids: jax.Array,
        q_slots: jax.Array,
    ) -> jax.Array:
        q, k, v = (jax.lax.all_to_all(x, SEQUENCE_AXIS, 2, 1, tiled=True) for x in (q, k, v))
        packed = segment_ids if visibility.segment_ids is not None else None
        out = _local_attention(q, k, v, Visibility(kv_valid, q_slots, True, packed), **kwargs)
        return jax.lax.all_to_all(out, SEQUENCE_AXIS, 1, 2, tiled=True)

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(split, split, split, whole, whole, PartitionSpec(None)),
        out_specs=split,
        check_vma=False,  # the Pallas kernels inside carry no varying-axes types
    )(q, k, v, visibility.kv_valid, segments, visibility.q_slots)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    visibility: Visibility,
    *,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    implementation: str = "eager",
) -> jax.Array:
    """Grouped-query attention of q [B, T, H, D] over k, v [B, S, K, D] -> [B, T, H, D].

    `implementation` is 'eager' (einsums), 'sdpa' (`jax.nn.dot_product_attention`, XLA) or
    'flash_attention_2' (cuDNN on GPU, Pallas splash on TPU). Where the requested kernel cannot
    run (soft-capping, dtype, backend, shape) a warning names the fallback that runs instead.
    Self-attention traced under a mesh whose `sequence` axis has several devices
    (`jrl.parallel.on_mesh`) runs as `ulysses_attention`.
    """
    kwargs = dict(scale=scale, window=window, softcap=softcap, implementation=implementation)
    if visibility.self_attention and sequence_mesh() is not None:
        return ulysses_attention(q, k, v, visibility, **kwargs)
    return _local_attention(q, k, v, visibility, **kwargs)


def _local_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    visibility: Visibility,
    *,
    scale: float,
    window: int | None,
    softcap: float | None,
    implementation: str,
) -> jax.Array:
    """`attention` without the sequence-parallel dispatch: the kernel on the arrays as given
    (whole, or one device's part inside `ulysses_attention`)."""
    kernel = _pick_kernel(implementation, softcap=softcap, dtype=q.dtype, visibility=visibility)
    if kernel != "eager":  # the kernels take k, v in q's dtype (a cache may hold them wider)
        k, v = k.astype(q.dtype), v.astype(q.dtype)
    if kernel == "splash":
        splash = functools.partial(splash_attention, scale=scale, window=window, softcap=softcap)
        return per_device(splash, q, k, v, visibility.segments(), requested=implementation)
    mask = visibility.mask(window)
    if kernel == "cudnn":
        cudnn = functools.partial(_cudnn_attention, scale=scale)
        try:
            return per_device(cudnn, q, k, v, mask, requested=implementation)
        except (ValueError, NotImplementedError, RuntimeError) as err:
            kernel = _fall_back(implementation, f"cuDNN rejected the call ({err})", "sdpa")
    if kernel == "sdpa":
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale)
    first = visibility.first_query_slot
    if first is not None and q.shape[1] > CAUSAL_BLOCK:
        return causal_blocks(q, k, v, mask, first_query_slot=first, scale=scale, softcap=softcap)
    return eager_attention(q, k, v, mask, scale=scale, softcap=softcap)
