"""Per-token log-prob of given targets and entropy of the tempered next-token distribution."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def logprob_entropy(
    hidden: jax.Array,
    lm_head: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    impl: str = "naive",
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """log p(target) and entropy H for logits = hidden @ lm_head / temperature.

    hidden: [..., D]; lm_head: [D, V]; targets: [...] int. With `softcap` (Gemma 2's final logit
    soft-capping) the logits become softcap * tanh(logits / softcap) before the temperature.
    Returns two float32 arrays shaped like `targets`. `impl='naive'` materialises the logits of
    these positions (the reference).
    """
    if impl not in ("naive", "auto"):
        raise ValueError(f"unknown logprob_entropy impl {impl!r}; available: naive, auto")
    logits = jnp.einsum("...d,dv->...v", hidden, lm_head.astype(hidden.dtype))
    logits = logits.astype(jnp.float32)
    if softcap:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)
    probs = jax.nn.softmax(logits, axis=-1)
    entropy = lse - jnp.sum(probs * logits, axis=-1)
    return target_logit[..., 0] - lse, entropy
