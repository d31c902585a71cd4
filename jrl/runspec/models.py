"""verl's ``*.model`` keys, read once: how a role's model is loaded (`ModelSettings`) with its
LoRA adapters (`LoraSettings`, `jrl.models.lora`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from flax import nnx

from jrl.models.dtypes import parse_dtype
from jrl.models.layers import LoRAParam
from jrl.models.lora import ALL_LINEAR, LoraSettings
from jrl.models.moe import ROUTERS
from jrl.runspec.reads import KeyReads

# The keys that shape the adapters once ``lora_rank`` > 0 (the critic's section has no
# ``exclude_modules``).
LORA_OPTIONS = ("lora_alpha", "target_modules", "exclude_modules")
# PEFT's targets when target_modules is null, for every decoder family jrl has
PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")
OWN_DECODER = (
    "jrl builds its own decoder from config.json, so no repository code runs (the tokenizer "
    "follows data.trust_remote_code)"
)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """How a ``*.model`` section's model is loaded: from `path` as a `kind` model (causal_lm,
    value or reward), computing in `dtype` over `param_dtype` parameters (the role's
    ``fsdp_config``), with full remat of every decoder layer when `remat`
    (``enable_gradient_checkpointing``) and host offload of what it keeps when
    `activation_offload`; `lora` holds the LoRA adapters' settings (None: no LoRA), initialised
    from `lora_seed`; `key` names the weights' config key in errors. `freeze_moe_router`
    (``override_config.moe_config.freeze_moe_router``) keeps a mixture of experts' routers out
    of training (`trainable`)."""

    path: str
    kind: str
    dtype: Any
    param_dtype: Any
    trust_remote_code: bool
    external_lib: str | None
    override_config: Mapping[str, Any]
    remat: bool
    activation_offload: bool
    lora: LoraSettings | None
    lora_seed: int = 0
    key: str = "actor_rollout_ref.model.path"
    freeze_moe_router: bool = False

    @property
    def trainable(self) -> Any:
        """The parameters an update trains (an NNX filter): the LoRA adapters, else every
        parameter but, with `freeze_moe_router`, the routers."""
        if self.lora is not None:
            return LoRAParam
        return nnx.All(nnx.Param, nnx.Not(ROUTERS)) if self.freeze_moe_router else nnx.Param

    @property
    def section(self) -> str:
        """The ``*.model`` section's key."""
        return self.key.rpartition(".")[0]

    def memory_options(self) -> dict[str, Any]:
        """`set_memory_options` arguments: full remat of every decoder layer with `remat`,
        host offload of what it keeps with `activation_offload`."""
        return {
            "remat_policy": "full" if self.remat else "none",
            "activation_offload": self.activation_offload,
        }


def model_settings(
    model: Any,
    fsdp: Any,
    kind: str = "causal_lm",
    *,
    section: str = "actor_rollout_ref.model",
    path_key: str = "path",
    lora_seed: int = 0,
) -> ModelSettings:
    """The settings of the ``*.model`` section `model` (at `section`) with the role's
    ``fsdp_config`` `fsdp` (``dtype``, ``model_dtype``); `path_key` names the key of the weights
    (SFT: ``partial_pretrain``)."""
    override = model.get("override_config")
    return ModelSettings(
        path=model[path_key],
        kind=kind,
        dtype=parse_dtype(fsdp.get("dtype", "bfloat16")),
        param_dtype=parse_dtype(fsdp.get("model_dtype", "fp32")),
        trust_remote_code=_trusts_code(model, kind),
        external_lib=model.get("external_lib"),
        override_config=MappingProxyType(_override_config(override)),
        remat=bool(model.get("enable_gradient_checkpointing", False)),
        activation_offload=bool(model.get("enable_activation_offload", False)),
        lora=lora_settings(model, section),
        lora_seed=lora_seed,
        key=f"{section}.{path_key}",
        freeze_moe_router=_freezes_router(override),
    )


def _freezes_router(override: Any) -> bool:
    """``override_config.moe_config.freeze_moe_router`` (verl's; False where absent)."""
    moe = None if override is None else override.get("moe_config")
    return bool(moe is not None and moe.get("freeze_moe_router", False))


def _trusts_code(model: Any, kind: str) -> bool:
    """``trust_remote_code`` of a reward model's section (its tokenizer may run the repository's
    code); other models' decoders are jrl's own, so the key is not read for them."""
    if kind == "reward":
        return bool(model.get("trust_remote_code", False))
    KeyReads.of(model).skip("trust_remote_code", OWN_DECODER)
    return False


def attention(model: Any) -> str | None:
    """``override_config.attn_implementation`` of the ``*.model`` section `model` (None: the
    model's own)."""
    override = model.get("override_config")
    return None if override is None else override.get("attn_implementation")


def _override_config(override: Any) -> dict[str, Any]:
    """The entries of ``override_config`` that jrl's models take (all but ``moe_config``, which
    `_freezes_router` reads), sections as plain dicts (a `KeyReads` view's read whole)."""
    if override is None:
        return {}
    found = {key: override[key] for key in override if key != "moe_config"}
    return {key: v.whole() if hasattr(v, "whole") else v for key, v in found.items()}


def lora_rank(section: Any) -> int:
    """``lora_rank`` of a ``*.model`` section; 0 (no LoRA) when null or absent (the reward
    model's section has no LoRA keys)."""
    return int(section.get("lora_rank") or 0)


def lora_settings(section: Any, prefix: str) -> LoraSettings | None:
    """The LoRA adapters of the ``*.model`` section `section` at `prefix`; None when its
    ``lora_rank`` is 0. A null ``target_modules`` takes PEFT's default (q_proj and v_proj), as
    verl hands null to PEFT. ValueError, naming `prefix`, for a rank or alpha out of range."""
    section = KeyReads.of(section, prefix)
    rank = lora_rank(section)
    if rank <= 0:
        section.skip([key for key in LORA_OPTIONS if key in section], f"{prefix}.lora_rank is 0")
        return None
    try:
        return LoraSettings(
            rank=rank,
            alpha=float(section["lora_alpha"] or 0),
            target_modules=_targets(section["target_modules"]),
            exclude_modules=section.get("exclude_modules"),
        )
    except ValueError as err:
        raise ValueError(f"{prefix}: {err}") from err


def _targets(value: Any) -> Any:
    """``target_modules`` as `LoraSettings` takes it: PEFT's default for null, all-linear for an
    empty value."""
    if value is None:
        return PEFT_DEFAULT_TARGETS
    return value or ALL_LINEAR


def lora_problems(section: Any, prefix: str) -> Iterator[str]:
    """The problem of the LoRA keys of the ``*.model`` section at `prefix`, if any."""
    try:
        lora_settings(section, prefix)
    except ValueError as err:
        yield str(err)
