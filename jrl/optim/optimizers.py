"""The optax optimizers of the RL roles (`make_optimizer`) and of SFT (`make_sft_optimizer`),
each with an injectable learning rate (`set_learning_rate`); clipping and non-finite skips live
in the update step.

SFT's families: ``adamw`` (decoupled weight decay), ``adam`` and ``sgd`` (weight decay added to
the gradient, as torch does). torchao / bitsandbytes variants map to the same optax optimizer
with float32 state: optax has no 8-bit, 4-bit or fp8 optimizer state, so a warning says so.
"""

from __future__ import annotations

import warnings
from typing import Any

import optax

from jrl.optim.settings import OptimizerSettings, SFTOptimizerSettings


def make_optimizer(settings: OptimizerSettings) -> optax.GradientTransformation:
    """AdamW of an RL role's `settings`.

    ``optimizer: adam`` is AdamW too, with ``weight_decay`` decoupled from the gradient: verl
    0.6.0's FSDP workers build torch's AdamW whatever the name says, and Megatron's ``adam``
    decouples weight decay the same way."""
    b1, b2 = settings.betas
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=float(settings.lr),
        b1=float(b1),
        b2=float(b2),
        weight_decay=float(settings.weight_decay),
    )


def set_learning_rate(opt_state: Any, lr: Any) -> Any:
    """Writes `lr` into an `inject_hyperparams` optimizer state (the update step does, before
    each optimizer step)."""
    opt_state.hyperparams["learning_rate"] = lr
    return opt_state


def _adam(learning_rate, b1, b2, eps, weight_decay, decoupled):
    if decoupled:
        return optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay)
    adam = optax.adam(learning_rate, b1, b2, eps)
    return optax.chain(optax.add_decayed_weights(weight_decay), adam)


def _sgd(learning_rate, momentum, nesterov, weight_decay):
    sgd = optax.sgd(learning_rate, momentum or None, nesterov)
    return optax.chain(optax.add_decayed_weights(weight_decay), sgd)


def make_sft_optimizer(settings: SFTOptimizerSettings) -> optax.GradientTransformation:
    """The optax optimizer of SFT's `settings`: its family with torch's keyword arguments
    (`SFTOptimizerSettings.options`)."""
    family = settings.family
    if settings.low_precision:
        warnings.warn(
            f"optim.optimizer={settings.optimizer!r} ({settings.impl}) keeps low-precision "
            f"optimizer state; jrl uses optax's {family} with float32 state, which needs more "
            "memory",
            stacklevel=2,
        )
    options = settings.options()
    lr, decay = float(options["lr"]), float(options["weight_decay"])
    if family == "sgd":
        return optax.inject_hyperparams(_sgd, static_args=("momentum", "nesterov"))(
            learning_rate=lr,
            momentum=float(options["momentum"]),
            nesterov=bool(options["nesterov"]),
            weight_decay=decay,
        )
    b1, b2 = (float(b) for b in options["betas"])
    return optax.inject_hyperparams(_adam, static_args=("decoupled",))(
        learning_rate=lr,
        b1=b1,
        b2=b2,
        eps=float(options["eps"]),
        weight_decay=decay,
        decoupled=family == "adamw",
    )
