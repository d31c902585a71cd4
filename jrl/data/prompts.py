"""Prompts: chat messages from a row, the chat template, truncation and left padding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TRUNCATION_MODES = ("error", "left", "right", "middle")

Messages = list[dict[str, Any]]


def chat_messages(value: Any, where: str, prompt_key: str) -> Messages:
    """A row's prompt as chat messages; a plain string becomes one user message.

    Anything else must be a non-empty list of ``{"role": str, "content": str}`` dicts.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, np.ndarray):
        value = value.tolist()
    hint = (
        f"column {prompt_key!r} (data.prompt_key) must hold a string or chat messages (a list "
        "of {'role': str, 'content': str} dicts)"
    )
    if not isinstance(value, list) or not value:
        raise TypeError(f"{where}: {hint}, got {type(value).__name__}: {str(value)[:200]}")
    for i, message in enumerate(value):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise TypeError(f"{where}: {hint}; message {i} is {str(message)[:200]}")
    return value


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: Messages, template_kwargs: Mapping[str, Any]
) -> tuple[str, list[int]]:
    """(templated text, its token ids): the chat template with the generation prompt, tokenised
    without special tokens."""
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **template_kwargs
    )
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


def untemplated_ids(tokenizer: PreTrainedTokenizerBase, messages: Messages) -> list[int]:
    """Token ids of the messages' contents (joined by newlines) without any chat template."""
    text = "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def truncate(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """`ids` cut to `max_length`: keep the last (left), the first (right) or both ends (middle:
    the first ``max_length // 2`` and the rest from the end).

    Mode ``error`` returns `ids` unchanged; the caller decides how to report an over-long prompt.
    """
    ids = list(ids)
    if len(ids) <= max_length or mode == "error":
        return ids
    if mode == "left":
        return ids[len(ids) - max_length :]
    if mode == "right":
        return ids[:max_length]
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def left_pad(
    ids: Sequence[int], max_length: int, pad_token_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both int32 [max_length], with padding on the left."""
    pad = max_length - len(ids)
    input_ids = np.asarray([pad_token_id] * pad + list(ids), dtype=np.int32)
    mask = np.concatenate([np.zeros(pad, np.int32), np.ones(len(ids), np.int32)])
    return input_ids, mask


def position_ids_from_mask(mask: np.ndarray) -> np.ndarray:
    """clip(cumsum(mask) - 1, 0): left pads get position 0, real tokens count from 0."""
    return np.clip(np.cumsum(mask, axis=-1) - 1, 0, None).astype(np.int32)
