"""`RLDataset`: parquet rows of chat prompts -> left-padded token ids (verl's RLHFDataset).

Each row's `data.prompt_key` column holds chat messages (a list of ``{role, content}``). The
prompt is the chat template applied with the generation prompt, tokenised without special tokens,
then cut (per `data.truncation`) and left-padded to `data.max_prompt_length`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

TRUNCATION_MODES = ("error", "left", "right", "middle")


def truncate(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """`ids` cut to `max_length`: keep the last (left), the first (right) or both ends (middle).

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


def read_parquet(files: str | Sequence[str], config_key: str) -> list[tuple[Path, pa.Table]]:
    """(path, table) for each parquet file given (one path or a list; ``~`` expanded)."""
    paths = [files] if isinstance(files, str | os.PathLike) else list(files)
    if not paths:
        raise ValueError(f"{config_key} is empty; give at least one parquet file")
    tables = []
    for path in paths:
        local = Path(path).expanduser()
        if not local.is_file():
            raise FileNotFoundError(
                f"{config_key}: parquet file {str(local)!r} does not exist. Point {config_key} "
                "at an existing file, or make GSM8K-style data with "
                "`python -m jrl.data.gsm8k --local_dir <dir> --offline`"
            )
        tables.append((local, pq.read_table(local)))
    return tables


class RLDataset:
    """Prompt rows for RL, indexed like a sequence: ``dataset[i]`` is one tokenised row (a dict).

    Args:
      files: one parquet path or a list of them.
      tokenizer: a Hugging Face tokenizer with a chat template and a pad token.
      data_config: the ``data`` section (attribute access): prompt_key, max_prompt_length,
        truncation, filter_overlong_prompts, return_raw_chat, return_full_prompt, shuffle, seed,
        apply_chat_template_kwargs (optional).
      max_samples: keep this many rows (-1: all); a seeded random subset if data.shuffle, else the
        first rows.
      config_key: the config key the files came from, named in error messages.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        data_config: Any,
        max_samples: int = -1,
        *,
        config_key: str = "data.train_files",
    ):
        self.tokenizer = tokenizer
        self.prompt_key: str = data_config.prompt_key
        self.max_prompt_length = int(data_config.max_prompt_length)
        self.truncation: str = data_config.truncation
        self.return_raw_chat = bool(getattr(data_config, "return_raw_chat", False))
        self.return_full_prompt = bool(getattr(data_config, "return_full_prompt", False))
        self.chat_template_kwargs = dict(
            getattr(data_config, "apply_chat_template_kwargs", None) or {}
        )
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(
                f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}"
            )
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; load it with jrl.data.load_tokenizer")

        tables = read_parquet(files, config_key)
        for path, table in tables:
            if self.prompt_key not in table.column_names:
                raise KeyError(
                    f"{path}: no column {self.prompt_key!r} (data.prompt_key); its columns are "
                    f"{', '.join(table.column_names)}. Set data.prompt_key to the column that "
                    "holds the chat messages"
                )
        self.rows = pa.concat_tables([t for _, t in tables], promote_options="default").to_pylist()
        self.origins = [(path, i) for path, table in tables for i in range(table.num_rows)]
        shuffle = bool(getattr(data_config, "shuffle", True))
        keep = _subsample(len(self.rows), max_samples, shuffle, getattr(data_config, "seed", None))
        if getattr(data_config, "filter_overlong_prompts", False):
            fits = [i for i in keep if len(self._prompt_ids(i)[1]) <= self.max_prompt_length]
            print(
                f"jrl: {config_key}: kept {len(fits)} of {len(keep)} rows with prompts of at most "
                f"{self.max_prompt_length} tokens (data.filter_overlong_prompts)"
            )
            keep = fits
        if not keep:
            raise ValueError(
                f"{config_key}: no rows left in {', '.join(str(p) for p, _ in tables)} (empty "
                "files, or every prompt longer than data.max_prompt_length with "
                "data.filter_overlong_prompts=True)"
            )
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]

    def __len__(self) -> int:
        return len(self.rows)

    def _where(self, index: int) -> str:
        path, row = self.origins[index]
        return f"{path} row {row}"

    def _prompt_ids(self, index: int) -> tuple[str, list[int]]:
        messages = self.rows[index][self.prompt_key]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(
                f"{self._where(index)}: column {self.prompt_key!r} must hold chat messages "
                f"(a list of {{'role', 'content'}} dicts), got {type(messages).__name__}: "
                f"{str(messages)[:200]}"
            )
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        return text, self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row `index`: its columns (less the prompt column) plus the tokenised prompt fields."""
        text, ids = self._prompt_ids(index)
        if len(ids) > self.max_prompt_length and self.truncation == "error":
            raise ValueError(
                f"{self._where(index)} has a prompt of {len(ids)} tokens, more than "
                f"data.max_prompt_length={self.max_prompt_length}. Raise data.max_prompt_length, "
                "set data.truncation to left/right/middle, or set data.filter_overlong_prompts=True"
            )
        ids = truncate(ids, self.max_prompt_length, self.truncation)
        input_ids, mask = left_pad(ids, self.max_prompt_length, self.tokenizer.pad_token_id)
        row = dict(self.rows[index])
        messages = row.pop(self.prompt_key)
        row.update(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            raw_prompt_ids=ids,
        )
        if self.return_raw_chat:
            row["raw_prompt"] = messages
        if self.return_full_prompt:
            row["full_prompts"] = text
        row["index"] = (row.get("extra_info") or {}).get("index", 0)
        return row


def _subsample(total: int, max_samples: int, shuffle: bool, seed: int | None) -> list[int]:
    """Row indices kept by `max_samples`: a seeded random subset if shuffling, else the first."""
    if max_samples <= 0 or max_samples >= total:
        return list(range(total))
    if not shuffle:
        return list(range(max_samples))
    return np.random.default_rng(seed).choice(total, size=max_samples, replace=False).tolist()
