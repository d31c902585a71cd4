"""Per-token log-prob of given targets and entropy of the tempered next-token distribution, by the
implementation that suits the devices the call is compiled for (vocabulary-parallel under a
mesh)."""

from __future__ import annotations

import concurrent.futures
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
from jrl_kernels.platform import mesh_platform, platform_name
from jrl_kernels.reference import naive_logprob_entropy
from jrl_kernels.vocab_parallel import vocab_parallel_logprob_entropy

logger = logging.getLogger(__name__)

IMPLEMENTATIONS = ("auto", "naive", "chunked", "pallas_tpu", "pallas_gpu")
# The kernel `auto` picks on each backend (anything else gets `chunked`).
BACKEND_KERNEL = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu"}
PALLAS_BACKEND = {"pallas_tpu": ("tpu",), "pallas_gpu": ("gpu", "cuda")}
# The name `lowering_platforms` takes for a platform.
LOWERING_PLATFORM = {"gpu": "cuda"}


def kernels_for(impl: str, interpret: bool = False) -> Kernels:
    """The tiled passes of a fused implementation: chunked, pallas_tpu or pallas_gpu."""
    if impl == "chunked":
        return chunked.KERNELS
    module = pallas_tpu if impl == "pallas_tpu" else pallas_gpu
    return module.kernels(interpret)


@functools.cache
def _log_once(level: int, message: str) -> None:
    logger.log(level, message)


# The probe problem: hidden [PROBE_ROWS, PROBE_DIM] and lm_head [PROBE_DIM, PROBE_VOCAB], bf16.
PROBE_ROWS, PROBE_DIM, PROBE_VOCAB = 40, 128, 1000


def _probe_arrays() -> tuple[np.ndarray, ...]:
    """hidden, lm_head, targets and two cotangents of the probe problem."""
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((PROBE_ROWS, PROBE_DIM)).astype(jnp.bfloat16),
        (0.2 * rng.standard_normal((PROBE_DIM, PROBE_VOCAB))).astype(jnp.bfloat16),
        rng.integers(0, PROBE_VOCAB, PROBE_ROWS).astype(np.int32),
        rng.standard_normal(PROBE_ROWS).astype(np.float32),
        rng.standard_normal(PROBE_ROWS).astype(np.float32),
    )


def _probe_fn(kernels: Kernels, targets: Any, g_logprob: Any, g_entropy: Any) -> Any:
    """(h, w) -> (loss, (d h, d w)) of sum(log p · g_logprob + H · g_entropy) by `kernels`."""

    def loss(h, w):
        logprob, entropy = fused_logprob_entropy(kernels, None, h, w, targets, jnp.float32(0.9))
        return jnp.sum(logprob * g_logprob + entropy * g_entropy)

    return jax.value_and_grad(loss, argnums=(0, 1))


def _probe_run(kernels: Kernels, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    """Loss and gradients of the probe problem, compiled and run on the host backend."""
    hidden, lm_head, *rest = arrays
    fn = jax.jit(_probe_fn(kernels, *rest))
    value, grads = fn.lower(hidden, lm_head).compile()(hidden, lm_head)
    return [np.asarray(x, np.float32) for x in (value, *grads)]


def _probe_lower(kernels: Kernels, platform: str) -> None:
    """Lowers the probe problem's forward and backward for `platform` (no device needed)."""
    targets = jnp.zeros((PROBE_ROWS,), jnp.int32)
    cotangent = jnp.ones((PROBE_ROWS,), jnp.float32)
    shapes = (
        jax.ShapeDtypeStruct((PROBE_ROWS, PROBE_DIM), jnp.bfloat16),
        jax.ShapeDtypeStruct((PROBE_DIM, PROBE_VOCAB), jnp.bfloat16),
    )
    fn = jax.jit(_probe_fn(kernels, targets, cotangent, cotangent))
    fn.trace(*shapes).lower(lowering_platforms=(LOWERING_PLATFORM.get(platform, platform),))


def _on_fresh_thread(fn: Any, *args: Any) -> Any:
    """`fn(*args)` on a new thread: outside any trace and any ambient mesh (both are
    thread-local), so that the probe is a one-device program whatever the caller traces."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def _probe(impl: str, platform: str) -> str | None:
    """`unavailable_reason` without the catch, on the current thread."""
    if platform != jax.default_backend():
        _probe_lower(kernels_for(impl, False), platform)
        return None
    arrays = _probe_arrays()
    got = _probe_run(kernels_for(impl, False), arrays)
    want = _probe_run(chunked.KERNELS, arrays)
    for name, a, b in zip(("loss", "d_hidden", "d_lm_head"), got, want, strict=True):
        error = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
        if not error < 2e-2:
            return f"its {name} differs from the chunked implementation's (error {error:.3g})"
    return None


@functools.cache
def unavailable_reason(impl: str, platform: str | None = None) -> str | None:
    """Why kernel `impl` cannot be used on `platform` (default: JAX's default backend), or None
    when it can.

    On the host's own backend the kernel is compiled and run on a tiny problem (value and
    gradients) and compared with `chunked`. On another platform (a mesh of TPU devices compiled
    for from a CPU host) nothing can run here: the problem's forward and backward are only
    lowered for that platform (the Pallas -> Mosaic / Triton lowering, which rejects what the
    kernel cannot express there), and the kernel compiler proper is trusted to accept what
    lowered. Either probe runs on a fresh thread, outside the caller's trace and mesh.
    """
    platform = platform_name(platform) if platform else jax.default_backend()
    try:
        return _on_fresh_thread(_probe, impl, platform)
    except Exception as err:  # any failure to build or run the kernel makes it unavailable
        return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def _devices() -> int:
    """Devices of the ambient mesh, else all JAX devices."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.device_count() if mesh.empty else mesh.size


def resolve_impl(
    impl: str = "auto", backend: str | None = None, *, split_rows: bool = False
) -> str:
    """The implementation `impl` stands for on platform `backend` (default `mesh_platform()`:
    that of the ambient mesh's devices, else JAX's default backend).

    `auto` picks pallas_tpu for TPUs, pallas_gpu for GPUs and chunked elsewhere, logging the
    choice and why (once). It falls back to chunked, logging why (once, as a warning), when the
    kernel fails its probe (`unavailable_reason`) or when the mesh (or JAX) has more than one
    device and the call does not run per device (`split_rows`: `logprob_entropy` under an
    ambient mesh whose axes split the rows, `row_split`): XLA cannot partition a Pallas call
    itself, so it would gather the whole batch onto every device.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown logprob_entropy impl {impl!r}; available: {', '.join(IMPLEMENTATIONS)}"
        )
    if impl != "auto":
        return impl
    platform = backend or mesh_platform()
    kernel = BACKEND_KERNEL.get(platform)
    if kernel is None:
        _log_once(
            logging.INFO, f"logprob_entropy: auto is chunked (no fused kernel for {platform})"
        )
        return "chunked"
    devices = _devices()
    if devices > 1 and not split_rows:
        reason = (
            f"{devices} devices and no ambient mesh axes that split the rows "
            "(jax.set_mesh): XLA does not partition Pallas calls"
        )
    else:
        reason = unavailable_reason(kernel, platform)
    if reason is None:
        how = "compiled and run" if platform == jax.default_backend() else "lowered"
        _log_once(
            logging.INFO,
            f"logprob_entropy: auto is {kernel} (the devices are {platform}; its probe {how})",
        )
        return kernel
    _log_once(
        logging.WARNING,
        f"logprob_entropy: not using {kernel} on {platform} ({reason}); using chunked",
    )
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
    over `axes`), the LM head whole on every device (P()); its gradient is summed over the
    devices. For a vocabulary that does not split evenly (`splits_vocab`)."""
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


def splits_vocab(split: tuple[Any, tuple[str, ...]], vocab: int) -> bool:
    """Whether the vocabulary of `vocab` columns divides evenly over the devices of the row split
    `split` (mesh, axes), as the vocabulary-parallel op needs; logs why not (debug)."""
    mesh, axes = split
    devices = math.prod(mesh.shape[name] for name in axes)
    if vocab % devices == 0:
        return True
    logger.debug(
        "logprob_entropy: V=%d does not divide over the %d devices of mesh axes %s; not "
        "splitting the vocabulary (a Pallas kernel takes the whole LM head on every device, "
        "chunked is left to XLA's partitioner)",
        vocab,
        devices,
        axes,
    )
    return False


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
    `pallas_gpu` are the fused kernels; `auto` picks by the mesh's devices (see `resolve_impl`).
    `interpret=True` runs a Pallas kernel in the Pallas interpreter (any backend; for tests).

    Under an ambient mesh of several devices (`jax.set_mesh`, as the trainer's steps run) the
    fused implementations run vocabulary-parallel (`vocab_parallel`): the tokens split over the
    mesh axes that divide them (`row_split`) and the LM head's columns over the same devices, so
    that no device holds the whole head or its gradient. When V does not divide over those
    devices a Pallas kernel takes each device's tokens with the whole LM head (its gradient summed
    over the devices) and chunked is partitioned by XLA. One device: the plain fused op.
    """
    return _logprob_entropy(
        hidden, lm_head, targets, temperature, impl, softcap, mask, interpret, vocab_parallel=True
    )


def _logprob_entropy(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: float | jax.Array,
    impl: str,
    softcap: float | None,
    mask: jax.Array | None,
    interpret: bool,
    *,
    vocab_parallel: bool,
) -> tuple[jax.Array, jax.Array]:
    """`logprob_entropy`; `vocab_parallel=False` keeps the LM head whole on every device under a
    mesh (the earlier path, for benchmarks)."""
    _check(hidden, lm_head, targets, mask)
    split = row_split(math.prod(targets.shape))
    impl = resolve_impl(impl, split_rows=split is not None)
    platform = mesh_platform()
    if impl in PALLAS_BACKEND and not interpret and platform not in PALLAS_BACKEND[impl]:
        raise ValueError(
            f"logprob_entropy impl {impl!r} needs a {PALLAS_BACKEND[impl][0].upper()} backend, "
            f"not {platform!r}; use impl='auto' or 'chunked' (or interpret=True)"
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
        kernels = kernels_for(impl, interpret)
        if split is not None and vocab_parallel and splits_vocab(split, lm_head.shape[1]):
            fused = functools.partial(vocab_parallel_logprob_entropy, kernels, softcap, *split)
        elif impl in PALLAS_BACKEND and split is not None:
            fused = _per_device(functools.partial(fused_logprob_entropy, kernels, softcap), *split)
        else:
            fused = functools.partial(fused_logprob_entropy, kernels, softcap)
        logprob, entropy = fused(hidden, lm_head, flat_targets, temperature)
    if mask is not None:
        logprob = jnp.where(keep, logprob, 0.0)
        entropy = jnp.where(keep, entropy, 0.0)
    return logprob.reshape(shape), entropy.reshape(shape)
