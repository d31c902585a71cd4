"""The engine's limits (verl's `max_num_seqs`, `max_num_batched_tokens`, `gpu_memory_utilization`,
`free_cache_engine`) and the slot plan they give one generate call: how many sequences decode
together, how many prompts one prefill takes, and how much KV cache that is. No JAX here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from jrl.config.errors import check_settings

if TYPE_CHECKING:
    import jax

    from jrl.models import ModelConfig

_CONFIG_PATH = "actor_rollout_ref.rollout"  # named in the KV budget's error
# Float32 [slots, vocab] buffers that one sampling step keeps alive (logits, scaled logits,
# sorted or noised logits, probabilities): the working memory that grows with the slot count.
_VOCAB_BUFFERS = 4
# Prompts are admitted in groups of slots / this: waiting for a group idles at most that share
# of the slots, and a group prefill pays the fixed cost of a forward pass once for all its rows.
_ADMISSION_SHARE = 8


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """How much the engine may take at once.

    `max_num_seqs` caps the sequences decoding together (per data-parallel replica) and
    `max_num_batched_tokens` the tokens one step feeds the model (a prefill takes at most that
    many prompt tokens; a decode step takes one token per sequence). The KV cache may take
    `gpu_memory_utilization` of the device memory that is free when the engine first measures it
    (where the device reports its memory; on CPU only the two counts above apply).
    `free_cache_engine` drops the cache after each generate call; otherwise it is kept and reused.
    """

    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.5
    free_cache_engine: bool = True

    def __post_init__(self) -> None:
        kinds = {field.name: type(field.default) for field in dataclasses.fields(self)}
        kind_rules = {
            name: (_number_of(getattr(self, name), kind), f"must be a {kind.__name__}")
            for name, kind in kinds.items()
        }
        check_settings(self, kind_rules)
        for name, kind in kinds.items():
            object.__setattr__(self, name, kind(getattr(self, name)))
        rules = {
            "max_num_seqs": (self.max_num_seqs >= 1, "must be at least 1"),
            "max_num_batched_tokens": (self.max_num_batched_tokens >= 1, "must be at least 1"),
            "gpu_memory_utilization": (0 < self.gpu_memory_utilization <= 1, "must be in (0, 1]"),
        }
        check_settings(self, rules)


def _number_of(value: Any, kind: type) -> bool:
    """Whether `value` can be a field of type `kind`: a bool for a bool, any other number for an
    int or a float."""
    return isinstance(value, int | float) and isinstance(value, bool) == (kind is bool)


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """Static shape of one generate call on one data-parallel replica.

    `slots` sequences decode together, each in its own KV-cache row of `prompt_length +
    max_new_tokens - 1` tokens; one prefill admits `prefill_rows` waiting prompts into as many
    free slots (fewer only for the last prompts). Every `shared_prefill` consecutive rows of a
    prefill hold the same prompt (the n answers of a prompt): it runs once for them, and its keys
    and values fill their slots.

    With `slot_per_row` (slots >= rows) row i takes slot i, where the next call of a multi-turn
    rollout finds its keys and values. With `resume_chunk` C > 0 each slot's prompt columns
    already hold its history's keys and values (`jrl.rollout.kept_turns`): a prefill runs only
    the prompts' last C columns against them.
    """

    slots: int
    prefill_rows: int
    shared_prefill: int = 1
    slot_per_row: bool = False
    resume_chunk: int = 0


def floor_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (int(n).bit_length() - 1)


def ceil_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def ceil_bucket(n: int) -> int:
    """The smallest power of two or three halves of one (1, 2, 3, 4, 6, 8, 12, 16, 24, ...)
    >= n: a size that pads at most a third, in few distinct shapes."""
    power = ceil_pow2(n)
    return power * 3 // 4 if power >= 4 and power * 3 // 4 >= n else power


def kv_bytes_per_token(config: ModelConfig, dtype: Any, tensor_parallel: int) -> int:
    """Keys and values of one token over all layers, on one device of a tensor-parallel group."""
    heads = config.num_kv_heads
    if heads % tensor_parallel == 0:
        heads //= tensor_parallel
    itemsize = np.dtype(dtype).itemsize
    return 2 * config.num_layers * heads * config.head_dim * itemsize


def slot_bytes(config: ModelConfig, dtype: Any, tensor_parallel: int, tokens: int) -> int:
    """Device memory one slot costs: its KV cache of `tokens` plus its sampling buffers."""
    vocab = config.vocab_size
    if vocab % tensor_parallel == 0:
        vocab //= tensor_parallel
    cache = tokens * kv_bytes_per_token(config, dtype, tensor_parallel)
    return cache + _VOCAB_BUFFERS * 4 * vocab


def free_device_bytes(device: jax.Device) -> int | None:
    """Bytes the device can still allocate, or None where it does not report its memory."""
    stats = device.memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def plan_slots(
    limits: EngineLimits,
    *,
    rows: int,
    prompt_length: int,
    budget_bytes: int | None,
    bytes_per_slot: int,
) -> SlotPlan:
    """The slot plan for `rows` sequences (per replica) of prompts `prompt_length` wide.

    Slots: as many as the limits, the budget and the rows allow. Prefill rows: an eighth of the
    slots, or all of them when the slots hold every row (one wave: no prompt waits for a slot to
    free); at most `max_num_batched_tokens` prompt tokens, at least one. Both are powers of two,
    so few distinct plans (and compilations) arise.
    """
    cap = min(limits.max_num_seqs, limits.max_num_batched_tokens, max(rows, 1))
    if budget_bytes is not None:
        fits = budget_bytes // bytes_per_slot
        if fits < 1:
            raise ValueError(
                f"the KV cache budget ({budget_bytes / 2**20:.1f} MiB = "
                f"{_CONFIG_PATH}.gpu_memory_utilization={limits.gpu_memory_utilization} of the "
                f"free device memory) cannot hold one sequence ({bytes_per_slot / 2**20:.1f} MiB); "
                "raise gpu_memory_utilization or lower data.max_prompt_length / "
                "data.max_response_length"
            )
        cap = min(cap, fits)
    slots = floor_pow2(cap)
    per_prefill = limits.max_num_batched_tokens // max(prompt_length, 1)
    group = slots if rows <= slots else slots // _ADMISSION_SHARE
    return SlotPlan(slots, floor_pow2(max(1, min(group, per_prefill))))
