"""Loss aggregation over tokens (`loss_agg_mode`), exact under micro-batch/device splits.

For one batch, `agg_loss` reduces a per-token loss matrix as verl does. For gradient accumulation,
each micro-batch contributes the numerator from `agg_loss_terms`, and the mini-batch divides their
sum by `global_denominator` of the whole mini-batch mask; the result equals `agg_loss` on the whole
mini-batch for every mode, however it is split.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jrl.algos.numerics import MEAN_EPS, masked_mean, masked_sum, safe_divide

TOKEN_MEAN = "token-mean"
SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
LOSS_AGG_MODES = (TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM, SEQ_MEAN_TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM_NORM)


class LossTerms(NamedTuple):
    """Per-token pieces of a loss, before any reduction.

    `loss_mat` is the per-token loss; `metrics` maps a metric name to a per-token matrix whose
    masked mean is the metric; `loss_agg_mode` is set when the loss fixes its own aggregation;
    `loss_mask` is set when the loss drops tokens itself (bypass-mode rejection sampling): the
    loss's numerator then sums over it, while the normaliser stays the batch's response mask's
    (verl's `global_batch_info`).
    """

    loss_mat: jax.Array
    metrics: dict[str, jax.Array]
    loss_agg_mode: str | None = None
    loss_mask: jax.Array | None = None


def check_loss_agg_mode(loss_agg_mode: str) -> None:
    """Raise a clear error for an unknown aggregation mode."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"Invalid loss_agg_mode {loss_agg_mode!r} (actor/critic `loss_agg_mode`); "
            f"choose one of {', '.join(LOSS_AGG_MODES)}"
        )


def global_denominator(
    loss_mask: jax.Array, loss_agg_mode: str, loss_scale_factor: float | None = None
) -> jax.Array:
    """The divisor of `loss_agg_mode` for this mask.

    token-mean: number of valid tokens; seq-mean-*: number of rows with at least one valid token;
    seq-mean-token-sum-norm: `loss_scale_factor`, by default the padded length `mask.shape[-1]`.
    Pass the whole mini-batch mask to normalise accumulated micro-batch numerators.
    """
    check_loss_agg_mode(loss_agg_mode)
    if loss_agg_mode == TOKEN_MEAN:
        return jnp.sum(loss_mask).astype(jnp.float32)
    if loss_agg_mode == SEQ_MEAN_TOKEN_SUM_NORM:
        factor = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if isinstance(factor, int | float) and factor <= 0:
            raise ValueError(f"loss_scale_factor must be positive (or null for R), got {factor}")
        return jnp.asarray(factor, jnp.float32)
    return jnp.sum(jnp.sum(loss_mask, axis=-1) > 0).astype(jnp.float32)


def agg_loss_terms(
    loss_mat: jax.Array,
    loss_mask: jax.Array,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(numerator, denominator) of `agg_loss` on this batch.

    The denominator is `global_denominator(loss_mask, ...)`: for token-mean and the seq-mean modes
    it adds up over micro-batches; for seq-mean-token-sum-norm it is the fixed factor.
    """
    denominator = global_denominator(loss_mask, loss_agg_mode, loss_scale_factor)
    if loss_agg_mode == SEQ_MEAN_TOKEN_MEAN:
        row_lengths = jnp.sum(loss_mask, axis=-1)
        row_losses = masked_sum(loss_mat, loss_mask, axis=-1) / (row_lengths + MEAN_EPS)
        return jnp.sum(jnp.where(row_lengths > 0, row_losses, 0.0)), denominator
    return masked_sum(loss_mat, loss_mask), denominator


def agg_loss(
    loss_mat: jax.Array,
    loss_mask: jax.Array,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> jax.Array:
    """Aggregate a [B, R] per-token loss over one batch (verl's `agg_loss`, single batch).

    token-mean: Σ(l·m)/Σm. seq-mean-token-sum: mean over non-empty rows of Σ_t l·m.
    seq-mean-token-mean: mean over non-empty rows of Σ_t l·m / (Σ_t m + 1e-8).
    seq-mean-token-sum-norm: Σ(l·m) / loss_scale_factor (default R). An all-masked batch gives 0.
    """
    return safe_divide(*agg_loss_terms(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor))


def reduce_loss_terms(
    terms: LossTerms,
    response_mask: jax.Array,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of one batch from its per-token terms: the loss over the loss's own mask
    when it sets one (as verl's loss function alone, without `global_batch_info`), the metrics
    over `response_mask`."""
    mode = terms.loss_agg_mode or loss_agg_mode
    mask = response_mask if terms.loss_mask is None else terms.loss_mask
    loss = agg_loss(terms.loss_mat, mask, mode, loss_scale_factor)
    metrics = {name: masked_mean(mat, response_mask) for name, mat in terms.metrics.items()}
    return loss, metrics
