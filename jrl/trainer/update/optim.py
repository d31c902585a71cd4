"""Optimizers and learning-rate schedules, for the RL roles and for SFT.

verl steps its LR scheduler once per training step (not per mini-batch), so the learning rate is a
host-side function of the scheduler step, injected into the optax state before each update.

RL roles (``actor.optim``, ``critic.optim``): AdamW / Adam, constant or cosine schedule with
``lr_warmup_steps`` (or ``lr_warmup_steps_ratio``) linear warmup (`make_optimizer`,
`lr_multiplier`).

SFT (verl's SFT ``optim``, `make_sft_optimizer`, `sft_lr`): ``optim.optimizer`` names a class of
``optim.optimizer_impl`` (verl builds ``getattr(import_module(optimizer_impl), optimizer)``); jrl
builds its optax equivalent:

- ``torch.optim``: AdamW (decoupled weight decay), Adam and SGD (weight decay added to the
  gradient, as torch does).
- ``torchao.optim`` / ``bitsandbytes.optim``: their variants of these (``AdamW8bit``,
  ``PagedAdamW``, ``_AdamW``, ``SGD8bit``, ...) map to the same optax optimizer with float32
  state: optax has no 8-bit, 4-bit or fp8 optimizer state, so a warning says so.

The keyword arguments are those verl passes (``lr``, ``weight_decay`` and, for the Adam family,
``betas``) updated by ``optim.override_optimizer_config``, with torch's names: ``eps``, ``betas``,
``weight_decay``, ``amsgrad`` (False only) for Adam; ``momentum``, ``nesterov``, ``dampening`` (0
only) for SGD. torch's execution flags (``foreach``, ``fused``, ``capturable``, ...) and the
quantisation options of torchao/bitsandbytes are accepted and have no effect. The SFT schedule
(``optim.lr_scheduler``) is verl's cosine or WSD (warmup, stable, cosine decay) with
``int(lr_warmup_steps_ratio * total_steps)`` linear warmup steps.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import optax

from jrl.config.choices import LR_SCHEDULER_TYPES, RL_OPTIMIZERS, SFT_LR_SCHEDULERS


def warmup_steps(optim_cfg: Any, total_training_steps: int) -> int:
    """`lr_warmup_steps` when >= 0, else int(lr_warmup_steps_ratio * total_training_steps)."""
    steps = optim_cfg.get("lr_warmup_steps", -1)
    if steps is None or steps < 0:
        steps = int(optim_cfg.get("lr_warmup_steps_ratio", 0.0) * total_training_steps)
    return int(steps)


def scheduler_type(optim_cfg: Any) -> str:
    """`lr_scheduler_type` (or its older alias `warmup_style`)."""
    name = optim_cfg.get("warmup_style") or optim_cfg.get("lr_scheduler_type", "constant")
    if name not in LR_SCHEDULER_TYPES:
        raise ValueError(
            f"optim.lr_scheduler_type={name!r} is not supported; use one of "
            f"{', '.join(LR_SCHEDULER_TYPES)}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule resolved from an ``optim`` section: after `step` scheduler steps
    (0 for the first update) the rate is ``lr * multiplier(step)``. The multiplier rises linearly
    over `warmup` steps (step / warmup), then follows `style`:

    - ``constant``: 1;
    - ``cosine`` (verl's): max(m, (1 - m) cos(2 pi c p) / 2 + (1 + m) / 2) with m = `min_lr_ratio`,
      c = `num_cycles`, p = (step - warmup) / (total - warmup);
    - ``wsd``: `wsd_multiplier`.
    """

    lr: float
    total: int
    warmup: int
    style: str
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5

    @classmethod
    def rl(cls, optim_cfg: Any, total_training_steps: int) -> Schedule:
        """The schedule of an RL role's ``optim`` (``lr_scheduler_type``: constant or cosine)."""
        return cls(
            lr=float(optim_cfg.get("lr", 1.0)),
            total=int(total_training_steps),
            warmup=warmup_steps(optim_cfg, total_training_steps),
            style=scheduler_type(optim_cfg),
            min_lr_ratio=float(optim_cfg.get("min_lr_ratio", 0.0) or 0.0),
            num_cycles=float(optim_cfg.get("num_cycles", 0.5)),
        )

    @classmethod
    def sft(cls, optim_cfg: Any, total_steps: int) -> Schedule:
        """The schedule of the SFT ``optim`` (``lr_scheduler``: cosine or wsd)."""
        if optim_cfg.lr_scheduler not in SFT_LR_SCHEDULERS:
            raise ValueError(
                f"optim.lr_scheduler={optim_cfg.lr_scheduler!r} is not supported; use one of "
                f"{', '.join(SFT_LR_SCHEDULERS)}"
            )
        warmup = warmup_steps(optim_cfg, total_steps)
        return cls(float(optim_cfg.lr), int(total_steps), warmup, optim_cfg.lr_scheduler)

    def multiplier(self, step: int) -> float:
        """The factor of `lr` after `step` scheduler steps."""
        if self.style == "wsd":
            return wsd_multiplier(step, self.warmup, self.total)
        if step < self.warmup:
            return step / max(1, self.warmup)
        if self.style == "constant":
            return 1.0
        m = self.min_lr_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        cosine = math.cos(math.pi * self.num_cycles * 2.0 * progress)
        return max(m, cosine * (1.0 - m) * 0.5 + (1.0 + m) * 0.5)

    def __call__(self, step: int) -> float:
        """The learning rate after `step` scheduler steps."""
        return self.lr * self.multiplier(step)


def lr_multiplier(optim_cfg: Any, step: int, total_training_steps: int) -> float:
    """The LR factor of an RL ``optim`` section after `step` scheduler steps, as verl's
    schedulers (`Schedule.rl`)."""
    return Schedule.rl(optim_cfg, total_training_steps).multiplier(step)


def make_optimizer(optim_cfg: Any) -> optax.GradientTransformation:
    """AdamW with an injectable learning rate (clipping and non-finite skips live in the step).

    ``optimizer: adam`` is AdamW too, with ``weight_decay`` decoupled from the gradient: verl
    0.6.0's FSDP workers build torch's AdamW whatever the name says, and Megatron's ``adam``
    decouples weight decay the same way."""
    name = str(optim_cfg.get("optimizer", "AdamW")).lower()
    if name not in (o.lower() for o in RL_OPTIMIZERS):
        raise ValueError(
            f"optim.optimizer={name!r} is not supported; use one of {', '.join(RL_OPTIMIZERS)}"
        )
    b1, b2 = optim_cfg.get("betas", (0.9, 0.999))
    decay = float(optim_cfg.get("weight_decay", 0.0))
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=float(optim_cfg.lr), b1=float(b1), b2=float(b2), weight_decay=decay
    )


def set_learning_rate(opt_state: Any, lr: Any) -> Any:
    """Writes `lr` into an `inject_hyperparams` optimizer state (the update step does, before
    each optimizer step)."""
    opt_state.hyperparams["learning_rate"] = lr
    return opt_state


IMPLS = ("torch.optim", "torchao.optim", "bitsandbytes.optim")
FAMILIES = ("adamw", "adam", "sgd")
_LOW_PRECISION = ("8bit", "4bit", "fp8")
_IGNORED = {
    "foreach",
    "fused",
    "capturable",
    "differentiable",
    "maximize_dtype",
    "block_size",
    "bf16_stochastic_round",
    "optim_bits",
    "percentile_clipping",
    "min_8bit_size",
    "is_paged",
    "max_unorm",
}
_OPTIONS = {
    "adamw": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "adam": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "sgd": ("lr", "momentum", "nesterov", "dampening", "weight_decay"),
}
WSD_STABLE_RATIO = 0.9


def optimizer_family(optimizer: str, impl: str) -> tuple[str, bool]:
    """(optax family, whether the named variant keeps low-precision state) of a verl
    ``optim.optimizer`` / ``optim.optimizer_impl`` pair; ValueError for anything else."""
    if impl not in IMPLS:
        raise ValueError(
            f"optim.optimizer_impl={impl!r} is not supported; use one of {', '.join(IMPLS)}"
        )
    name = optimizer.lower()
    low_precision = False
    if impl != "torch.optim":
        name = name.lstrip("_").removeprefix("paged")
        for suffix in (*_LOW_PRECISION, "32bit"):
            if name.endswith(suffix):
                name, low_precision = name.removesuffix(suffix), suffix in _LOW_PRECISION
                break
    if name not in FAMILIES:
        variants = "" if impl == "torch.optim" else " (or their 8bit/4bit/fp8/paged variants)"
        raise ValueError(
            f"optim.optimizer={optimizer!r} of optim.optimizer_impl={impl!r} has no optax "
            f"equivalent in jrl; use AdamW, Adam or SGD{variants}"
        )
    return name, low_precision


def optimizer_kwargs(optim_cfg: Any, family: str) -> dict[str, Any]:
    """torch keyword arguments as verl passes them: lr, weight_decay, betas (Adam family), then
    ``override_optimizer_config``; execution and quantisation flags dropped."""
    kwargs: dict[str, Any] = {"lr": optim_cfg.lr, "weight_decay": optim_cfg.weight_decay}
    if family != "sgd":
        kwargs["betas"] = list(optim_cfg.betas)
    kwargs.update(dict(optim_cfg.get("override_optimizer_config") or {}))
    unknown = sorted(set(kwargs) - set(_OPTIONS[family]) - _IGNORED)
    if unknown:
        raise ValueError(
            f"optim.override_optimizer_config: {unknown} are not options of {family} in jrl; "
            f"use {', '.join(_OPTIONS[family])}"
        )
    return {k: v for k, v in kwargs.items() if k not in _IGNORED}


def _adam(learning_rate, b1, b2, eps, weight_decay, decoupled):
    if decoupled:
        return optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay)
    adam = optax.adam(learning_rate, b1, b2, eps)
    return optax.chain(optax.add_decayed_weights(weight_decay), adam)


def _sgd(learning_rate, momentum, nesterov, weight_decay):
    sgd = optax.sgd(learning_rate, momentum or None, nesterov)
    return optax.chain(optax.add_decayed_weights(weight_decay), sgd)


def make_sft_optimizer(optim_cfg: Any) -> optax.GradientTransformation:
    """The optax optimizer of an SFT ``optim`` section, with an injectable learning rate
    (clipping at ``clip_grad`` and non-finite skips live in the update step)."""
    family, low_precision = optimizer_family(optim_cfg.optimizer, optim_cfg.optimizer_impl)
    if low_precision:
        warnings.warn(
            f"optim.optimizer={optim_cfg.optimizer!r} ({optim_cfg.optimizer_impl}) keeps "
            f"low-precision optimizer state; jrl uses optax's {family} with float32 state, which "
            "needs more memory",
            stacklevel=2,
        )
    kwargs = optimizer_kwargs(optim_cfg, family)
    lr, decay = float(kwargs["lr"]), float(kwargs.get("weight_decay", 0.0))
    if family == "sgd":
        if float(kwargs.get("dampening", 0.0)) != 0.0:
            raise ValueError("optim.override_optimizer_config.dampening must be 0 in jrl")
        return optax.inject_hyperparams(_sgd, static_args=("momentum", "nesterov"))(
            learning_rate=lr,
            momentum=float(kwargs.get("momentum", 0.0)),
            nesterov=bool(kwargs.get("nesterov", False)),
            weight_decay=decay,
        )
    if kwargs.get("amsgrad"):
        raise ValueError("optim.override_optimizer_config.amsgrad=True is not supported in jrl")
    b1, b2 = (float(b) for b in kwargs["betas"])
    return optax.inject_hyperparams(_adam, static_args=("decoupled",))(
        learning_rate=lr,
        b1=b1,
        b2=b2,
        eps=float(kwargs.get("eps", 1e-8)),
        weight_decay=decay,
        decoupled=family == "adamw",
    )


def wsd_multiplier(step: int, warmup: int, total: int) -> float:
    """verl's warmup-stable-decay factor: linear warmup, then 1 for 90% of the remaining steps,
    then a half cosine to 0."""
    if step < warmup:
        return step / max(1, warmup)
    remaining = max(0, total - warmup)
    stable = int(remaining * WSD_STABLE_RATIO)
    if step < warmup + stable:
        return 1.0
    if step >= total:
        return 0.0
    progress = (step - warmup - stable) / max(1, remaining - stable)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def sft_lr(optim_cfg: Any, step: int, total_steps: int) -> float:
    """The SFT learning rate after `step` scheduler steps (0 for the first update)."""
    return Schedule.sft(optim_cfg, total_steps)(step)
