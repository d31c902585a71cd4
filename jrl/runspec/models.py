"""verl's LoRA keys of a ``*.model`` section, read once into `LoraSettings`
(`jrl.models.lora`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jrl.models.lora import ALL_LINEAR, LoraSettings

# The keys that shape the adapters once ``lora_rank`` > 0 (the critic's section has no
# ``exclude_modules``).
LORA_OPTIONS = ("lora_alpha", "target_modules", "exclude_modules")


def lora_rank(section: Any) -> int:
    """``lora_rank`` of a ``*.model`` section; 0 (no LoRA) when null or absent (the reward
    model's section has no LoRA keys)."""
    return int(section.get("lora_rank") or 0)


def lora_settings(section: Any, prefix: str) -> LoraSettings | None:
    """The LoRA adapters of the ``*.model`` section `section` at `prefix`; None when its
    ``lora_rank`` is 0. ValueError, naming `prefix`, for a rank or alpha out of range."""
    rank = lora_rank(section)
    if rank <= 0:
        return None
    try:
        return LoraSettings(
            rank=rank,
            alpha=float(section["lora_alpha"] or 0),
            target_modules=section["target_modules"] or ALL_LINEAR,
            exclude_modules=section.get("exclude_modules"),
        )
    except ValueError as err:
        raise ValueError(f"{prefix}: {err}") from err


def lora_problems(section: Any, prefix: str) -> Iterator[str]:
    """The problem of the LoRA keys of the ``*.model`` section at `prefix`, if any."""
    try:
        lora_settings(section, prefix)
    except ValueError as err:
        yield str(err)
