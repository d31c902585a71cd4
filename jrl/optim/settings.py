"""What an optimizer and its learning-rate schedule are made of: the names they take, every
default, and the frozen settings with their checks beside their fields. Plain values only (no
optax here), so the resolver (`jrl.runspec.optim`) reads it without jax.

An RL role (`OptimizerSettings`) trains with AdamW (``Adam`` is AdamW too, as in verl 0.6.0's FSDP
roles) under a constant or cosine schedule. SFT (`SFTOptimizerSettings`) names a torch optimizer
class of a torch module (``optimizer`` of ``optimizer_impl``) that maps to an optax family
(`optimizer_family`), with torch's keyword arguments (`SFTOptimizerSettings.options`), under a
cosine or warmup-stable-decay schedule. Both warm up linearly (`ScheduleSettings.warmup`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

# The RL roles' ``optim.optimizer`` (matched case-insensitively) and ``lr_scheduler_type``.
RL_OPTIMIZERS = ("AdamW", "Adam")
LR_SCHEDULER_TYPES = ("constant", "cosine")
# SFT's ``optim.lr_scheduler``, its ``optim.optimizer_impl`` modules and the optax families their
# optimizer classes map to.
SFT_LR_SCHEDULERS = ("cosine", "wsd")
SFT_OPTIMIZER_IMPLS = ("torch.optim", "torchao.optim", "bitsandbytes.optim")
SFT_FAMILIES = ("adamw", "adam", "sgd")
# Name suffixes of torchao / bitsandbytes variants that keep low-precision optimizer state.
LOW_PRECISION = ("8bit", "4bit", "fp8")
# torch's keyword arguments of each family, and torch's defaults of those verl does not pass.
FAMILY_OPTIONS = {
    "adamw": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "adam": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "sgd": ("lr", "momentum", "nesterov", "dampening", "weight_decay"),
}
TORCH_DEFAULTS = {
    "eps": 1e-8,
    "amsgrad": False,
    "momentum": 0.0,
    "nesterov": False,
    "dampening": 0.0,
}
# torch's execution flags and torchao / bitsandbytes quantisation options: accepted, no effect.
IGNORED_OPTIONS = frozenset(
    {
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
)
# verl's cosine defaults (``get_cosine_schedule_with_warmup``) and WSD's stable share.
COSINE_MIN_LR_RATIO = 0.0
COSINE_CYCLES = 0.5
WSD_STABLE_RATIO = 0.9


class InvalidSettings(ValueError):
    """Every broken rule of one settings object, each naming its key and the fix."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def _raise_any(problems: list[str]) -> None:
    if problems:
        raise InvalidSettings(problems)


def not_one_of(key: str, value: Any, allowed: Sequence[str]) -> str:
    """The problem of `key` set to `value`, which is none of `allowed`."""
    return f"{key}={value!r} is not supported; use one of {', '.join(allowed)}"


def two_decay_rates(betas: Sequence[Any]) -> bool:
    """Whether `betas` is Adam's (beta1, beta2): two numbers in [0, 1)."""
    numbers = [b for b in betas if isinstance(b, int | float) and not isinstance(b, bool)]
    return len(betas) == 2 and len(numbers) == 2 and all(0 <= b < 1 for b in numbers)


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """A learning-rate schedule: `kind` (constant, cosine or wsd) after a linear warm-up of
    `warmup_steps` steps, or of int(`warmup_ratio` * total steps) when `warmup_steps` is None;
    cosine's floor `min_lr_ratio` (a fraction of the learning rate) and `num_cycles`. `key` names
    the key that chose `kind`, in errors."""

    kind: str
    warmup_steps: int | None
    warmup_ratio: float
    min_lr_ratio: float = COSINE_MIN_LR_RATIO
    num_cycles: float = COSINE_CYCLES
    key: str = dataclasses.field(default="schedule", compare=False)

    def warmup(self, total_steps: int) -> int:
        """The warm-up steps of a run of `total_steps` scheduler steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(self.warmup_ratio * total_steps)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """An RL role's optimizer: AdamW (`optimizer`: one of `RL_OPTIMIZERS`) at learning rate `lr`
    with Adam's `betas` and decoupled `weight_decay`, under `schedule` (one of
    `LR_SCHEDULER_TYPES`). `key` names the section in errors."""

    optimizer: str
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    schedule: ScheduleSettings
    key: str = dataclasses.field(default="optim", compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.schedule.kind not in LR_SCHEDULER_TYPES:
            problems.append(not_one_of(self.schedule.key, self.schedule.kind, LR_SCHEDULER_TYPES))
        if self.optimizer.lower() not in (name.lower() for name in RL_OPTIMIZERS):
            problems.append(not_one_of(f"{self.key}.optimizer", self.optimizer, RL_OPTIMIZERS))
        if not two_decay_rates(self.betas):
            betas = list(self.betas)
            problems.append(f"{self.key}.betas={betas!r} must be two decay rates in [0, 1)")
        floor = self.schedule.min_lr_ratio
        if self.schedule.kind == "cosine" and not 0.0 <= floor <= 1.0:
            problems.append(
                f"{self.key}.min_lr_ratio={floor} must be in [0, 1] for a cosine schedule (a "
                "fraction of the learning rate)"
            )
        _raise_any(problems)


def optimizer_family(optimizer: str, impl: str) -> tuple[str, bool]:
    """(optax family, whether the named variant keeps low-precision state) of a verl SFT
    ``optim.optimizer`` / ``optim.optimizer_impl`` pair; ValueError for anything else."""
    if impl not in SFT_OPTIMIZER_IMPLS:
        raise ValueError(not_one_of("optim.optimizer_impl", impl, SFT_OPTIMIZER_IMPLS))
    name = optimizer.lower()
    low_precision = False
    if impl != "torch.optim":
        name = name.lstrip("_").removeprefix("paged")
        for suffix in (*LOW_PRECISION, "32bit"):
            if name.endswith(suffix):
                name, low_precision = name.removesuffix(suffix), suffix in LOW_PRECISION
                break
    if name not in SFT_FAMILIES:
        variants = "" if impl == "torch.optim" else " (or their 8bit/4bit/fp8/paged variants)"
        raise ValueError(
            f"optim.optimizer={optimizer!r} of optim.optimizer_impl={impl!r} has no optax "
            f"equivalent in jrl; use AdamW, Adam or SGD{variants}"
        )
    return name, low_precision


@dataclasses.dataclass(frozen=True)
class SFTOptimizerSettings:
    """SFT's optimizer (verl's SFT ``optim``): the torch class `optimizer` of the module `impl`
    (its optax family: `optimizer_family`) with torch's keyword arguments as verl passes them
    (`lr`, `weight_decay`, `betas` for the Adam family) updated by `overrides`
    (``override_optimizer_config``); gradients clipped at `clip_grad`; under `schedule` (one of
    `SFT_LR_SCHEDULERS`)."""

    optimizer: str
    impl: str
    lr: float
    betas: tuple[float, ...]
    weight_decay: float
    clip_grad: float
    schedule: ScheduleSettings
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.schedule.kind not in SFT_LR_SCHEDULERS:
            problems.append(not_one_of(self.schedule.key, self.schedule.kind, SFT_LR_SCHEDULERS))
        try:
            self.options()
        except ValueError as err:
            problems.append(str(err))
        _raise_any(problems)

    @property
    def family(self) -> str:
        """The optax family: adamw, adam or sgd."""
        return optimizer_family(self.optimizer, self.impl)[0]

    @property
    def low_precision(self) -> bool:
        """Whether the named variant keeps low-precision state (jrl keeps float32)."""
        return optimizer_family(self.optimizer, self.impl)[1]

    def options(self) -> dict[str, Any]:
        """torch's keyword arguments of the family: torch's defaults, then ``lr``,
        ``weight_decay``, ``betas`` (Adam family) and the overrides; execution and quantisation
        flags dropped. ValueError for an option jrl cannot honour."""
        family = self.family
        given: dict[str, Any] = {"lr": self.lr, "weight_decay": self.weight_decay}
        if family != "sgd":
            given["betas"] = list(self.betas)
        given.update(self.overrides)
        unknown = sorted(set(given) - set(FAMILY_OPTIONS[family]) - IGNORED_OPTIONS)
        if unknown:
            raise ValueError(
                f"optim.override_optimizer_config: {unknown} are not options of {family} in jrl; "
                f"use {', '.join(FAMILY_OPTIONS[family])}"
            )
        defaults = {k: v for k, v in TORCH_DEFAULTS.items() if k in FAMILY_OPTIONS[family]}
        options = {**defaults, **{k: v for k, v in given.items() if k not in IGNORED_OPTIONS}}
        if family == "sgd" and float(options["dampening"]) != 0.0:
            raise ValueError("optim.override_optimizer_config.dampening must be 0 in jrl")
        if family != "sgd" and options["amsgrad"]:
            raise ValueError("optim.override_optimizer_config.amsgrad=True is not supported in jrl")
        return options
