"""LoRA: low-rank adapters on chosen linear layers, trained while the base weights stay frozen.

A targeted layer computes x @ W + (x @ A @ B) * alpha / rank with A [in, rank] and B [rank, out]
(`layers.Linear`). The adapters are `LoRAParam`s, so a filter on that type separates them from the
base weights: the optimizer sees only them, the reference policy is the base without them, and an
export folds them into W.

Module selection follows PEFT. `target_modules="all-linear"` takes every linear layer of the
decoder (the attention and MLP projections) but not the output heads (`lm_head`, `score`). A list
of names (or a comma-separated string of names) takes the linear layers whose dotted path equals a
name or ends with "." + name, e.g. ``["q_proj", "v_proj"]`` or ``"layers.0.mlp.up_proj"``.
`exclude_modules` removes layers from that set: names as for `target_modules`, or a string that is
not a plain name list, which is a regular expression matched against the whole dotted path.
`LoraSettings` holds these choices with the rank and alpha. A mixture of experts' stacked expert
weights are not linear layers here: they get no adapters (with a warning).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Sequence
from typing import Any

from flax import nnx

from jrl.models.layers import Linear, LoRAParam
from jrl.models.moe import ExpertStack

ALL_LINEAR = "all-linear"
HEAD_NAMES = ("lm_head", "score")
_NAME_LIST = re.compile(r"[\w.,\s]*")

__all__ = [
    "ALL_LINEAR",
    "LoRAParam",
    "LoraSettings",
    "adapted_modules",
    "apply_lora",
    "linear_layers",
    "lora_targets",
    "remove_adapters",
]


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters of `rank` scaled by `alpha` / `rank` on the layers that `target_modules`
    selects less those `exclude_modules` selects (names as a string or a sequence, kept as a
    tuple; see the module's docstring)."""

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...] = ALL_LINEAR
    exclude_modules: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        rank, alpha = self.rank, self.alpha
        if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
            raise ValueError(f"lora_rank must be a positive integer, got {rank!r}")
        if not alpha or alpha <= 0:
            raise ValueError(f"lora_alpha must be positive, got {alpha!r}")
        for name in ("target_modules", "exclude_modules"):
            value = getattr(self, name)
            if isinstance(value, Sequence) and not isinstance(value, str):
                object.__setattr__(self, name, tuple(value))


def linear_layers(model: nnx.Module) -> dict[str, Linear]:
    """Every linear layer of `model` by its dotted path (e.g. 'model.layers.0.self_attn.q_proj')."""
    return {
        ".".join(str(p) for p in path): module
        for path, module in nnx.iter_modules(model)
        if isinstance(module, Linear)
    }


def _names(spec: str | Sequence[str]) -> list[str]:
    """A list of module names from a list or a comma-separated string."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return [str(item).strip() for item in items if str(item).strip()]


def _matches_name(path: str, names: Sequence[str]) -> bool:
    return any(path == name or path.endswith("." + name) for name in names)


def _selector(spec: str | Sequence[str], key: str) -> Any:
    """A predicate on dotted paths: names (list or plain comma-separated string) or a regex."""
    if isinstance(spec, str) and not _NAME_LIST.fullmatch(spec):
        try:
            pattern = re.compile(spec)
        except re.error as err:
            raise ValueError(f"{key}={spec!r} is not a valid regular expression: {err}") from None
        return lambda path: pattern.fullmatch(path) is not None
    if not isinstance(spec, str | Sequence):
        raise ValueError(f"{key} must be a string or a list of module names, got {spec!r}")
    names = _names(spec)
    if not names:
        raise ValueError(f"{key}={spec!r} names no module; give module names such as q_proj")
    return lambda path: _matches_name(path, names)


def lora_targets(
    model: nnx.Module,
    target_modules: str | Sequence[str] = ALL_LINEAR,
    exclude_modules: str | Sequence[str] | None = None,
) -> list[str]:
    """Dotted paths of the linear layers that `target_modules` and `exclude_modules` select.

    Raises ValueError when nothing is selected, listing the linear layer names that exist.
    """
    layers = linear_layers(model)
    if target_modules == ALL_LINEAR:
        chosen = [p for p in layers if p.split(".")[0] not in HEAD_NAMES]
    else:
        select = _selector(target_modules, "target_modules")
        chosen = [p for p in layers if select(p)]
    if exclude_modules:
        exclude = _selector(exclude_modules, "exclude_modules")
        chosen = [p for p in chosen if not exclude(p)]
    if not chosen:
        known = sorted({p.rsplit(".", 1)[-1] for p in layers})
        raise ValueError(
            f"target_modules={target_modules!r} with exclude_modules={exclude_modules!r} selects "
            f"no linear layer; linear layers are named {', '.join(known)} (or use 'all-linear')"
        )
    return chosen


def apply_lora(model: nnx.Module, settings: LoraSettings, *, seed: int = 0) -> nnx.Module:
    """Adds the adapters of `settings` to the layers of `model` they select (in place) and
    returns it. A is drawn from `seed` (one key per layer, in path order), B is zero, so the
    model's outputs are unchanged until B is trained."""
    layers = linear_layers(model)
    stacks = sum(isinstance(module, ExpertStack) for _, module in nnx.iter_modules(model))
    if stacks:
        warnings.warn(
            f"LoRA adapts linear layers only: the experts of the {stacks} mixture-of-experts "
            "layers (stacked weights) get no adapters, while PEFT on transformers' per-expert "
            "Linear layers adapts each expert's projections",
            stacklevel=2,
        )
    rngs = nnx.Rngs(seed)
    targets = lora_targets(model, settings.target_modules, settings.exclude_modules)
    for path in targets:
        layers[path].add_adapter(settings.rank, settings.alpha, rngs.params())
    return model


def adapted_modules(model: nnx.Module) -> list[str]:
    """Dotted paths of the layers that carry an adapter."""
    return [path for path, layer in linear_layers(model).items() if layer.has_adapter]


def remove_adapters(model: nnx.Module) -> nnx.Module:
    """Drops every adapter from `model` (in place), leaving the base model; returns it."""
    for layer in linear_layers(model).values():
        layer.remove_adapter()
    return model
