"""Per-token log-probs (and entropy) of the responses under a causal LM, by the log-prob kernel a
config selects: verl's ``use_fused_kernels`` / ``fused_kernel_options.impl_backend`` mapped onto
`jrl_kernels.logprob_entropy`'s implementations. Used by the policy roles and by SFT."""

from __future__ import annotations

from typing import Any

import jax

from jrl.models import CausalLM
from jrl.trainer.update.packing import PackLayout, response_window
from jrl_kernels import logprob_entropy

# `jrl_kernels.logprob_entropy` implementation of each ``fused_kernel_options.impl_backend``:
# triton -> the Pallas kernel of the backend (auto: Pallas TPU / GPU where it runs, else chunked),
# torch -> the chunked XLA loop (portable).
FUSED_KERNEL_IMPLS = {"triton": "auto", "torch": "chunked"}


def logprob_impl(arr: Any, role: str) -> str:
    """The `jrl_kernels.logprob_entropy` implementation of `role` (actor or ref) under the
    ``actor_rollout_ref`` section `arr`: ``naive`` (materialised logits) unless the role's
    ``use_fused_kernels`` (which follows ``model.use_fused_kernels``) is on, else
    `FUSED_KERNEL_IMPLS` of ``model.fused_kernel_options.impl_backend``."""
    fused = arr[role].get("use_fused_kernels")
    if not (arr.model.use_fused_kernels if fused is None else fused):
        return "naive"
    options = arr.model.get("fused_kernel_options") or {}
    backend = options.get("impl_backend") or "torch"
    try:
        return FUSED_KERNEL_IMPLS[backend]
    except KeyError:
        raise ValueError(
            f"actor_rollout_ref.model.fused_kernel_options.impl_backend={backend!r} is not "
            f"supported; use one of "
            f"{', '.join(FUSED_KERNEL_IMPLS)}"
        ) from None


def response_log_probs(
    model: CausalLM,
    tensors: dict[str, jax.Array],
    temperature: float,
    packing: PackLayout | None = None,
    *,
    impl: str = "naive",
    calculate_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """Per-token log-prob and entropy [B, R] of `responses` under `model` at `temperature` by
    the `jrl_kernels.logprob_entropy` implementation `impl` (entropy None unless
    `calculate_entropy`); with `packing` the model runs on packed rows (see
    `jrl.trainer.update.packing`)."""
    width = tensors["responses"].shape[1]
    hidden = response_window(model.hidden, tensors, width, packing)
    log_prob, entropy = logprob_entropy(
        hidden,
        model.lm_head_kernel(),
        tensors["responses"],
        temperature,
        impl=impl,
        softcap=model.config.final_logit_softcapping,
    )
    return log_prob, (entropy if calculate_entropy else None)
