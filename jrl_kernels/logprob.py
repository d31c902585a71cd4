"""Per-token log-prob of given targets and entropy of the tempered next-token distribution, by the
implementation that suits the backend."""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jrl_kernels import chunked, pallas_gpu, pallas_tpu
from jrl_kernels.fused import Kernels, fused_logprob_entropy
from jrl_kernels.reference import naive_logprob_entropy

logger = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "naive", "chunked", "pallas_tpu", "pallas_gpu")
# The kernel `auto` picks on each backend (anything else gets `chunked`).
BACKEND_KERNEL = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}
PALLAS_BACKEND = {"pallas_tpu": ("tpu",), "pallas_gpu": ("gpu", "cuda")}


def kernels_for(impl: str, interpret: bool = False) -> Kernels:
    """The tiled passes of a fused implementation: chunked, pallas_tpu or pallas_gpu."""
    if impl == "chunked":
        return chunked.KERNELS
    module = pallas_tpu if impl == "pallas_tpu" else pallas_gpu
    return module.kernels(interpret)


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def _probe_loss(kernels: Kernels, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Loss and gradients of a tiny problem run (compiled) by `kernels`."""
    hidden, lm_head, targets, g_logprob, g_entropy = arrays

    def loss(h, w):
        logprob, entropy = fused_logprob_entropy(kernels, None, h, w, targets, jnp.float32(0.9))
        return jnp.sum(logprob * g_logprob + entropy * g_entropy)

    fn = jax.value_and_grad(loss, argnums=(0, 1))
    value, grads = jax.jit(fn).lower(hidden, lm_head).compile()(hidden, lm_head)
    return [np.asarray(x, np.float32) for x in (value, *grads)]


@functools.cache
def unavailable_reason(impl: str) -> str | None:
    """Why kernel `impl` cannot be used on the default backend, or None when it can: it is compiled
    and run on a tiny problem (value and gradients) and compared with `chunked`."""
    rng = np.random.default_rng(0)
    arrays = (
        rng.standard_normal((40, 128)).astype(jnp.bfloat16),
        (0.2 * rng.standard_normal((128, 1000))).astype(jnp.bfloat16),
        rng.integers(0, 1000, 40).astype(np.int32),
        rng.standard_normal(40).astype(np.float32),
        rng.standard_normal(40).astype(np.float32),
    )
    try:
        got = _probe_loss(kernels_for(impl, False), arrays)
    except Exception as err:  # any failure to build or run the kernel makes it unavailable
        return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    want = _probe_loss(chunked.KERNELS, arrays)
    for name, a, b in zip(("loss", "d_hidden", "d_lm_head"), got, want, strict=True):
        error = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
        if not error < 2e-2:
            return f"its {name} differs from the chunked implementation's (error {error:.3g})"
    return None


def resolve_impl(
    impl: str = "auto", backend: str | None = None, *, split_rows: bool = False
) -> str:
    """The implementation `impl` stands for on `backend` (default: JAX's default backend).

    `auto` picks pallas_tpu on a TPU, pallas_gpu on a GPU and chunked elsewhere. It falls back to
    chunked, logging why (once), when the kernel fails its probe (`unavailable_reason`) or when
    JAX sees more than one device and the call's rows are not split over them (`split_rows`, as
    `logprob_entropy` does under an ambient mesh): XLA cannot partition a Pallas call itself, so
    it would gather the whole batch onto every device.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown logprob_entropy impl {impl!r}; available: {', '.join(IMPLEMENTATIONS)}"
        )
    if impl != "auto":
        return impl
    backend = backend or jax.default_backend()
    kernel = BACKEND_KERNEL.get(backend)
    if kernel is None:
        return "chunked"
    if jax.device_count() > 1 and not split_rows:
        reason = (
            f"{jax.device_count()} devices and no ambient mesh to split the rows over "
            "(jax.set_mesh): XLA does not partition Pallas calls"
        )
    else:
        reason = unavailable_reason(kernel)
    if reason is None:
        return kernel
    _warn_once(f"logprob_entropy: not using {kernel} on {backend} ({reason}); using chunked")
    return "chunked"


def row_split(rows: int) -> tuple[Any, tuple[str, ...]] | None:
    """(ambient mesh, the axes to split `rows` tokens over) for a per-device kernel: the longest
    leading run of the mesh's axes (`jax.set_mesh`) whose devices divide `rows`, the other axes
    computing the same rows; None without an ambient mesh of several devices, inside a
    `shard_map`, or when no split is even."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1 or mesh.manual_axes:
        return None
    names = tuple(mesh.axis_names)
    for count in range(len(names), 0, -1):
        size = math.prod(mesh.shape[name] for name in names[:count])
        if size > 1 and rows % size == 0:
            return mesh, names[:count]
    return None


def _per_device(fn: Any, mesh: Any, axes: tuple[str, ...]) -> Any:
    """`fn(hidden, lm_head, targets, temperature)` run on each device's share of the rows (split
    over `axes`), the LM head whole on every device; its gradient is summed over the devices."""
    rows = P(axes)
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(P(axes, None), P(), rows, P()),
        out_specs=(rows, rows),
        check_vma=False,
    )


def _check(hidden: jax.Array, lm_head: jax.Array, targets: jax.Array, mask: jax.Array | None):
    if hidden.ndim < 1 or lm_head.ndim != 2 or lm_head.shape[0] != hidden.shape[-1]:
        raise ValueError(
            f"logprob_entropy needs hidden [..., D] and lm_head [D, V]; got hidden "
            f"{hidden.shape} and lm_head {lm_head.shape} (pass the LM head as [D, V], e.g. the "
            "tied embedding transposed)"
        )
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"logprob_entropy: targets {targets.shape} must have hidden's leading shape "
            f"{hidden.shape[:-1]}"
        )
    if mask is not None and mask.shape != targets.shape:
        raise ValueError(
            f"logprob_entropy: mask {mask.shape} must have the targets' shape {targets.shape}"
        )


def logprob_entropy(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: float | jax.Array = 1.0,
    impl: str = "auto",
    softcap: float | None = None,
    *,
    mask: jax.Array | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy H of softmax(logits), logits = hidden @ lm_head / temperature.

    hidden: [..., D] (bf16 or f32; the LM head is cast to its dtype, accumulation is float32);
    lm_head: [D, V], any V; targets: [...] int in [0, V). With `softcap` (Gemma 2's final logit
    soft-capping) the logits are softcap * tanh(z / softcap) before the temperature. Returns two
    float32 arrays shaped like `targets`; both are differentiable with respect to `hidden` and
    `lm_head`.

    Padding: positions where `mask` is false (or 0) get log-prob and entropy 0 and add nothing
    to any gradient, whatever their target; without `mask` every position counts.

    impl: `naive` materialises the [tokens, V] logits (the reference); `chunked` loops over
    vocabulary chunks in XLA (any backend, one chunk of logits alive at a time); `pallas_tpu` /
    `pallas_gpu` are the fused kernels; `auto` picks by backend (see `resolve_impl`).
    `interpret=True` runs a Pallas kernel in the Pallas interpreter (any backend; for tests).

    Under an ambient mesh (`jax.set_mesh`, as the trainer's steps run) a Pallas kernel runs in a
    `shard_map`: each device takes its share of the tokens (split over the mesh axes that divide
    them, `row_split`) with the whole LM head, and the LM head's gradient is summed over the
    devices. The XLA implementations are partitioned by XLA itself.
    """
    _check(hidden, lm_head, targets, mask)
    split = row_split(math.prod(targets.shape))
    impl = resolve_impl(impl, split_rows=split is not None)
    backend = jax.default_backend()
    if impl in PALLAS_BACKEND and not interpret and backend not in PALLAS_BACKEND[impl]:
        raise ValueError(
            f"logprob_entropy impl {impl!r} needs a {PALLAS_BACKEND[impl][0].upper()} backend, "
            f"not {backend!r}; use impl='auto' or 'chunked' (or interpret=True)"
        )
    shape = targets.shape
    dim = hidden.shape[-1]
    flat_targets = targets.reshape(-1).astype(jnp.int32)
    if mask is not None:
        keep = mask.reshape(-1).astype(bool)
        flat_targets = jnp.where(keep, flat_targets, 0)
    hidden = hidden.reshape(-1, dim)
    softcap = float(softcap) if softcap else None
    temperature = jnp.asarray(temperature, jnp.float32)
    if hidden.shape[0] == 0:
        empty = jnp.zeros(shape, jnp.float32)
        return empty, empty
    if impl == "naive":
        logprob, entropy = naive_logprob_entropy(
            hidden, lm_head, flat_targets, temperature, softcap
        )
    else:
        fused = functools.partial(fused_logprob_entropy, kernels_for(impl, interpret), softcap)
        if impl in PALLAS_BACKEND and split is not None:
            fused = _per_device(fused, *split)
        logprob, entropy = fused(hidden, lm_head, flat_targets, temperature)
    if mask is not None:
        logprob = jnp.where(keep, logprob, 0.0)
        entropy = jnp.where(keep, entropy, 0.0)
    return logprob.reshape(shape), entropy.reshape(shape)
