"""Warnings for a step whose metrics say the model is not training: every parameter's gradient
zero while the loss is not, or the policy's entropy exactly that of a uniform distribution over
the vocabulary (what zeroed or corrupted weights give). Each names the step and the metric."""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)
# (gradient norm, the losses of the same update): a gradient of zero while one is non-zero.
_UPDATES = (
    ("actor/grad_norm", ("actor/pg_loss", "actor/kl_loss")),
    ("critic/grad_norm", ("critic/vf_loss",)),
)
_UNIFORM_TOLERANCE = 1e-4  # nats


def garbage_warnings(metrics: dict[str, float], step: int, vocab_size: int) -> list[str]:
    """What looks wrong in `step`'s metrics (empty when nothing does)."""
    found = []
    for grad, losses in _UPDATES:
        moving = [k for k in losses if metrics.get(k, 0.0) != 0.0]
        if metrics.get(grad) == 0.0 and moving:
            found.append(
                f"step {step}: {grad} is 0 while {moving[0]}={metrics[moving[0]]:.4g}: no "
                "parameter moved; the model may be corrupted or mis-loaded (check its "
                "checkpoint with python -m jrl.merge verify)"
            )
    entropy = metrics.get("actor/entropy")
    if entropy is not None and abs(entropy - math.log(vocab_size)) < _UNIFORM_TOLERANCE:
        found.append(
            f"step {step}: actor/entropy={entropy:.4f} is ln({vocab_size}), a uniform policy "
            "over the whole vocabulary: the weights may be zeroed or corrupted"
        )
    return found


def warn_on_garbage(metrics: dict[str, float], step: int, vocab_size: int) -> None:
    """Logs each of `garbage_warnings` as a warning."""
    for line in garbage_warnings(metrics, step, vocab_size):
        log.warning(line)
