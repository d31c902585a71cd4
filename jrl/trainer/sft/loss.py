"""The SFT objective: cross-entropy of the tokens that the loss mask selects.

An SFT batch reuses the RL layout of `jrl.trainer.update.learner`: ``responses`` are the targets
``input_ids[:, 1:]`` and ``response_mask`` is ``loss_mask[:, 1:]``, so target t is predicted from
position t and the update, packing (``use_remove_padding``) and global token normalisation are
those of the RL trainer. The loss of a batch is the mean over every trained token of the batch
(on all devices and micro-batches together).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jrl.batch import Batch
from jrl.data.sft_dataset import ROW_KEYS
from jrl.models import CausalLM
from jrl.trainer.roles.log_probs import response_log_probs
from jrl.trainer.update.packing import PackLayout


def sft_tensors(batch: Batch) -> dict[str, np.ndarray]:
    """The update's tensors of a collated SFT batch (``loss_mask`` arrives in its meta)."""
    missing = [k for k in ROW_KEYS if k not in batch]
    if missing:
        raise KeyError(
            f"SFT rows lack {missing}; a dataset row must hold {', '.join(ROW_KEYS)} "
            "(int arrays of length data.max_length)"
        )
    ids = np.asarray(batch.tensors["input_ids"], np.int32)
    loss_mask = np.stack([np.asarray(m) for m in batch.meta["loss_mask"]]).astype(np.float32)
    return {
        "input_ids": ids,
        "attention_mask": np.asarray(batch.tensors["attention_mask"], np.int32),
        "position_ids": np.asarray(batch.tensors["position_ids"], np.int32),
        "responses": ids[:, 1:],
        "response_mask": loss_mask[:, 1:],
    }


def target_log_probs(
    model: CausalLM, tensors: dict[str, jax.Array], impl: str, packing: PackLayout | None = None
) -> jax.Array:
    """log p(target) [B, L - 1] of every target of `tensors` under `model`, by the log-prob
    kernel `impl` (``naive`` materialises the logits; ``auto`` is the fused kernel)."""
    log_prob, _ = response_log_probs(
        model, tensors, 1.0, packing, impl=impl, calculate_entropy=False
    )
    return log_prob


@dataclasses.dataclass(frozen=True)
class SFTLoss:
    """Summed negative log-likelihood of a micro-batch's trained tokens divided by the token
    count of the whole batch (``norm['token-mean']``), log-probs by the kernel `impl`. Frozen and
    hashable: the key of the learner's compiled update."""

    impl: str

    def __call__(
        self,
        model: CausalLM,
        micro: dict[str, jax.Array],
        norm: dict[str, jax.Array],
        packing: PackLayout | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        log_prob = target_log_probs(model, micro, self.impl, packing)
        return -jnp.sum(log_prob * micro["response_mask"]) / norm["token-mean"], {}


def row_nll(
    model: CausalLM, tensors: dict[str, jax.Array], impl: str, packing: PackLayout | None = None
) -> jax.Array:
    """Per-row summed negative log-likelihood [B] of the trained tokens (for validation)."""
    log_prob = target_log_probs(model, tensors, impl, packing)
    return -jnp.sum(log_prob * tensors["response_mask"], axis=-1)
