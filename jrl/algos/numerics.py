"""Masked reductions and whitening over response tokens (verl's torch_functional helpers).

A mask holds 1 for tokens that count and 0 for padding; values under a 0 are ignored even when they
are NaN or inf. These functions trace under `jax.jit`, so none of them raises on data: where verl
raises (a variance over fewer than two tokens) they return a finite value instead, as documented.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MEAN_EPS = 1e-8
WHITEN_EPS = 1e-8


def masked_sum(values: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Sum of `values` where `mask` is non-zero, each weighted by the mask."""
    return jnp.sum(jnp.where(mask.astype(bool), values, 0.0) * mask, axis=axis)


def masked_mean(values: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Σ(values·mask) / (Σmask + 1e-8); 0 for an all-masked input."""
    return masked_sum(values, mask, axis) / (jnp.sum(mask, axis=axis) + MEAN_EPS)


def masked_var(values: jax.Array, mask: jax.Array, unbiased: bool = True) -> jax.Array:
    """Variance over all masked elements, Bessel-corrected when `unbiased`.

    verl raises when fewer than two elements are valid; here the correction is skipped in that
    case, so the result is the (near-zero) biased variance and stays finite under `jit`.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean(jnp.square(values - mean), mask)
    if not unbiased:
        return variance
    count = jnp.sum(mask)
    bessel = jnp.where(count > 1, count / jnp.where(count > 1, count - 1, 1.0), 1.0)
    return variance * bessel


def masked_whiten(values: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
    """(values - μ) · rsqrt(var + 1e-8) with μ and unbiased var over all masked elements.

    Every position is transformed, masked ones included. With `shift_mean=False` μ is added back.
    With fewer than two valid elements the variance is ~0 (see `masked_var`), so the valid element
    maps to ~0.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * jax.lax.rsqrt(masked_var(values, mask) + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


def safe_divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator, or 0 where the denominator is 0 (an all-masked batch)."""
    nonzero = denominator != 0
    return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1), 0.0)
