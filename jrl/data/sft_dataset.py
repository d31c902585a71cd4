"""`SFTDataset`: parquet rows of (prompt, response) or chat conversations -> right-padded token ids
with a loss mask (verl's SFTDataset and MultiTurnSFTDataset).

Single turn: the prompt is read from ``data.prompt_key`` (a dotted path such as
``extra_info.question`` walks into a struct column; ``data.prompt_dict_keys`` walk further, as
verl's GSM8K example does with ``prompt_key=extra_info prompt_dict_keys=[question]``), the response
from ``data.response_key`` / ``data.response_dict_keys`` alike. A prompt is a string (one user
message) or chat messages. The sequence is the chat template with the generation prompt, then the
response and the tokenizer's EOS token; the loss covers every response token, the EOS included.

Multi-turn (``data.multiturn.enable``): ``data.multiturn.messages_key`` holds a conversation; the
loss covers what the chat template writes for each assistant message (its content and its
end-of-turn tokens), not the other messages nor the assistant header that opens each reply. A
message with its own ``loss_mask`` (0 or 1) sets it for every token it adds, its header included
(a run of tool messages follows its first one), as verl's multi-turn dataset does. Tools
(``tools_key``: a list of JSON schemas, or its JSON text) and ``enable_thinking``
(``enable_thinking_key``) columns, when present, are passed to the template.

Each row is ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` (int32
[data.max_length]); ``loss_mask[t]`` is 1 when token t is trained on (predicted from position
t - 1). Sequences longer than ``data.max_length`` fail (``truncation=error``) or keep their last
(``left``) or first (``right``) tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from jrl.data.extern import accepts_keyword, load_object
from jrl.data.files import file_list
from jrl.data.prompts import chat_messages, position_ids_from_mask, render_prompt
from jrl.data.rl_dataset import ParquetRows, check_sized
from jrl.data.settings import SFTDataSettings

ROW_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def key_path(key: str, dict_keys: Sequence[str] | None) -> list[str]:
    """The walk from a column to a value: the dotted `key` split, then `dict_keys`."""
    return [*key.split("."), *(dict_keys or [])]


def read_field(row: Mapping[str, Any], path: Sequence[str], where: str, what: str) -> Any:
    """The value at `path` in `row` (a column, then keys of nested structs; a one-item list on
    the way is read as its item, as verl's ``series_to_item`` does); `what` names the config keys
    that chose the path in errors."""
    value: Any = row
    for depth, name in enumerate(path):
        while isinstance(value, list | tuple | np.ndarray) and len(value) == 1:
            value = value[0]
        if not isinstance(value, Mapping) or name not in value:
            walked = ".".join(path[: depth + 1])
            found = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise KeyError(f"{where}: no field {walked!r} ({what}); found {found}")
        value = value[name]
    return value


def message_loss_mask(message: Mapping[str, Any], where: str, index: int) -> int | None:
    """A message's own ``loss_mask`` (0 or 1: every token the message adds, an assistant's
    header included, is trained on or not, as verl overrides it), or None where it has none."""
    value = message.get("loss_mask")
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"{where}: message {index} has loss_mask={value!r}; use 0, 1 or null")
    return int(value)


class SFTDataset(ParquetRows):
    """Rows for supervised fine-tuning, indexed like a sequence (``dataset[i]`` is a dict).

    Args:
      data_files: one parquet path or a list of them; local, ``file://`` or any fsspec URL.
      tokenizer: a Hugging Face tokenizer with a chat template, an EOS and a pad token.
      config: `SFTDataSettings`, or anything with the same attributes (verl's ``data``
        section, as a user's subclass gets it): prompt_key, response_key, prompt_dict_keys,
        response_dict_keys, multiturn, max_length, truncation, apply_chat_template_kwargs,
        cache_dir.
      max_samples: keep the first `max_samples` rows (-1: all).
      config_key: the config key the files came from, named in error messages.
    """

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        config: SFTDataSettings | Any,
        max_samples: int = -1,
        *,
        config_key: str = "data.train_files",
    ):
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs an EOS and a pad token for SFT")
        self.tokenizer = tokenizer
        self.max_length = int(config.max_length)
        self.truncation = config.truncation
        self.template_kwargs = dict(config.apply_chat_template_kwargs or {})
        multiturn = config.multiturn
        self.multiturn = bool(multiturn.enable)
        if self.multiturn:
            self.messages_path = [multiturn.messages_key]
            self.tools_key, self.thinking_key = multiturn.tools_key, multiturn.enable_thinking_key
            first_columns = {"data.multiturn.messages_key": multiturn.messages_key}
        else:
            self.prompt_path = key_path(config.prompt_key, config.prompt_dict_keys)
            self.response_path = key_path(config.response_key, config.response_dict_keys)
            first_columns = {
                "data.prompt_key": self.prompt_path[0],
                "data.response_key": self.response_path[0],
            }

        def check(origin: str, table: pa.Table) -> None:
            for key, column in first_columns.items():
                if column not in table.column_names:
                    raise KeyError(
                        f"{config_key}: {origin} has no column {column!r} ({key}); its columns "
                        f"are {', '.join(table.column_names)}"
                    )

        tables = self._read_tables(data_files, config_key, config.cache_dir, check)
        self.rows = [row for _, table in tables for row in table.to_pylist()]
        if 0 < max_samples < len(self.rows):
            self.rows, self.origins = self.rows[:max_samples], self.origins[:max_samples]

    def _single_turn(self, row: Mapping[str, Any], where: str) -> tuple[list[int], list[int]]:
        prompt = read_field(row, self.prompt_path, where, "data.prompt_key / prompt_dict_keys")
        response = read_field(
            row, self.response_path, where, "data.response_key / response_dict_keys"
        )
        if not isinstance(response, str):
            raise TypeError(
                f"{where}: the response ({'.'.join(self.response_path)}) must be a string, got "
                f"{type(response).__name__}: {str(response)[:200]}"
            )
        messages = chat_messages(prompt, where, ".".join(self.prompt_path))
        prompt_ids = render_prompt(self.tokenizer, messages, self.template_kwargs)[1]
        response_ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        response_ids = [*response_ids, self.tokenizer.eos_token_id]
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    def _render(self, messages: list[dict[str, Any]], generation: bool, extra: dict) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation, tokenize=False, **extra
        )

    def _multi_turn(self, row: Mapping[str, Any], where: str) -> tuple[list[int], list[int]]:
        key = self.messages_path[0]
        messages = chat_messages(read_field(row, self.messages_path, where, key), where, key)
        extra = dict(self.template_kwargs)
        tools = row.get(self.tools_key)
        if tools is not None:
            extra["tools"] = json.loads(tools) if isinstance(tools, str) else tools
        if row.get(self.thinking_key) is not None:
            extra["enable_thinking"] = bool(row[self.thinking_key])
        ids: list[int] = []
        trained: list[int] = []
        previous = ""

        def add(text: str, loss: int, index: int) -> None:
            nonlocal previous
            if not text.startswith(previous):
                raise ValueError(
                    f"{where}: the chat template rewrites earlier text when message {index} is "
                    "added, so the conversation cannot be split into turns; use a template whose "
                    "rendering of the first k messages is a prefix of that of k + 1"
                )
            piece = self.tokenizer(text[len(previous) :], add_special_tokens=False)["input_ids"]
            ids.extend(piece)
            trained.extend([loss] * len(piece))
            previous = text

        override = None
        for index, message in enumerate(messages):
            start = len(ids)
            if message["role"] == "assistant":
                add(self._render(messages[:index], True, extra), 0, index)
                add(self._render(messages[: index + 1], False, extra), 1, index)
            else:
                add(self._render(messages[: index + 1], False, extra), 0, index)
            if index == 0 or message["role"] != "tool" or messages[index - 1]["role"] != "tool":
                override = message_loss_mask(message, where, index)  # a run of tools: the first's
            if override is not None:
                trained[start:] = [override] * (len(ids) - start)
        return ids, trained

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Row `index`: token ids, masks and positions, right-padded to data.max_length."""
        where = self._where(index)
        row = self.rows[index]
        ids, trained = (self._multi_turn if self.multiturn else self._single_turn)(row, where)
        length = self.max_length
        if len(ids) > length:
            if self.truncation == "error":
                raise ValueError(
                    f"{where} has {len(ids)} tokens ({len(ids) - sum(trained)} not trained on, "
                    f"{sum(trained)} trained on), more than data.max_length={length}. Raise "
                    "data.max_length or set data.truncation to left (keep the end) or right "
                    "(keep the start)"
                )
            keep = slice(len(ids) - length, None) if self.truncation == "left" else slice(length)
            ids, trained = ids[keep], trained[keep]
        pad = length - len(ids)
        mask = np.asarray([1] * len(ids) + [0] * pad, np.int32)
        return {
            "input_ids": np.asarray(ids + [self.tokenizer.pad_token_id] * pad, np.int32),
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
            "loss_mask": np.asarray(trained + [0] * pad, np.int32),
        }


def create_sft_dataset(
    data_files: str | Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    config: SFTDataSettings | Any,
    max_samples: int = -1,
    *,
    config_key: str = "data.train_files",
) -> Sequence[dict[str, Any]]:
    """`SFTDataset`, or the class named by ``data.custom_cls.path`` / ``.name``, called as verl
    calls it: ``cls(parquet_files=<list of paths>, tokenizer=..., config=<data section>,
    max_samples=...)``, without ``max_samples`` for a class that does not take it (verl
    v0.6.0's signature). Its rows must hold `ROW_KEYS` (int arrays of length data.max_length)."""
    custom = getattr(config, "custom_cls", None)
    path, name = getattr(custom, "path", None), getattr(custom, "name", None)
    if not path and not name:
        return SFTDataset(data_files, tokenizer, config, max_samples, config_key=config_key)
    cls = load_object(path, name, "data.custom_cls")
    kwargs = dict(
        parquet_files=file_list(data_files, config_key),
        tokenizer=tokenizer,
        config=getattr(custom, "config", config),  # a UserDataset's section, verl's convention
    )
    if accepts_keyword(cls, "max_samples"):  # current verl passes it; v0.6.0's classes lack it
        kwargs["max_samples"] = max_samples
    dataset = cls(**kwargs)
    check_sized(dataset, name, path)
    return dataset
