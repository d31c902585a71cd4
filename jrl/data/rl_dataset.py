"""`RLDataset`: parquet rows of prompts -> left-padded token ids (verl's RLHFDataset).

Each row's `data.prompt_key` column holds chat messages (a list of ``{role, content}``) or a plain
string (one user message). The prompt is the chat template applied with the generation prompt,
tokenised without special tokens, then cut (per `data.truncation`) and left-padded to
`data.max_prompt_length`. Every other column (``data_source``, ``reward_model``, ``extra_info``,
...) is carried through to the batch's meta.

`create_rl_dataset` builds the dataset the settings (`RLDataSettings`) ask for: `RLDataset`, or the
user class named by ``data.custom_cls.path`` / ``.name``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from jrl.data.extern import accepts_keyword, load_object
from jrl.data.files import file_list, local_path, read_parquet
from jrl.data.filtering import prompt_lengths
from jrl.data.prompts import (
    TRUNCATION_MODES,
    chat_messages,
    left_pad,
    position_ids_from_mask,
    render_prompt,
    truncate,
    untemplated_ids,
)
from jrl.data.settings import RLDataSettings


class ParquetRows:
    """Rows read from parquet files, each remembering its file and row (for error messages)."""

    rows: list[dict[str, Any]]
    origins: list[tuple[str, int]]

    def _read_tables(
        self,
        data_files: str | Sequence[str],
        config_key: str,
        cache_dir: str | None,
        check: Callable[[str, pa.Table], None],
    ) -> list[tuple[str, pa.Table]]:
        """(file, table) of each of `data_files`, after `check(file, table)`; sets `origins`."""
        tables = []
        for origin in file_list(data_files, config_key):
            table = read_parquet(local_path(origin, cache_dir, config_key), origin, config_key)
            check(origin, table)
            tables.append((origin, table))
        self.origins = [(origin, i) for origin, table in tables for i in range(table.num_rows)]
        return tables

    def __len__(self) -> int:
        return len(self.rows)

    def _where(self, index: int) -> str:
        origin, row = self.origins[index]
        return f"{origin} row {row}"


def check_sized(dataset: Any, name: str | None, path: str | None) -> None:
    """Raises TypeError unless `dataset`, made by the data.custom_cls `name` from `path`, is
    indexable and sized."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(
            f"data.custom_cls {name!r} from {path!r} made a {type(dataset).__name__}, which "
            "lacks __len__ or __getitem__; a dataset must be indexable and sized"
        )


class RLDataset(ParquetRows):
    """Prompt rows for RL, indexed like a sequence: ``dataset[i]`` is one tokenised row (a dict).

    Args:
      data_files: one parquet path or a list of them; local, ``file://`` or any fsspec URL
        (``hdfs://``, ``gs://``, ``s3://``, ...), remote files copied first to data.cache_dir.
      tokenizer: a Hugging Face tokenizer with a chat template and a pad token.
      config: `RLDataSettings`, or anything with the same attributes (verl's ``data`` section, as
        a user's subclass gets it): prompt_key, max_prompt_length, truncation,
        filter_overlong_prompts, return_raw_input_ids, return_raw_chat,
        return_full_prompt, shuffle, seed, image_key, cache_dir, apply_chat_template_kwargs.
      max_samples: keep this many rows (-1: all); a seeded random subset if data.shuffle, else the
        first rows. Applied before filtering, as verl.
      config_key: the config key the files came from, named in error messages.

    A row holds its columns (less the prompt column) plus ``input_ids``, ``attention_mask``,
    ``position_ids`` (int32 [max_prompt_length]), ``raw_prompt_ids`` (the unpadded, truncated
    ids), ``index`` (extra_info.index, or 0) and, when asked, ``raw_prompt`` (the messages),
    ``full_prompts`` (the templated text) and ``raw_input_ids`` (ids of the message contents
    without the chat template, truncated alike).
    """

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: PreTrainedTokenizerBase,
        config: RLDataSettings | Any,
        max_samples: int = -1,
        *,
        config_key: str = "data.train_files",
    ):
        self.tokenizer = tokenizer
        self.prompt_key: str = config.prompt_key
        self.max_prompt_length = int(config.max_prompt_length)
        self.truncation: str = config.truncation
        self.return_raw_input_ids = bool(getattr(config, "return_raw_input_ids", False))
        self.return_raw_chat = bool(getattr(config, "return_raw_chat", False))
        self.return_full_prompt = bool(getattr(config, "return_full_prompt", False))
        self.chat_template_kwargs = dict(getattr(config, "apply_chat_template_kwargs", None) or {})
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(
                f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}"
            )
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; load it with jrl.data.load_tokenizer")

        image_key = getattr(config, "image_key", None)
        tables = self._read_tables(
            data_files,
            config_key,
            getattr(config, "cache_dir", None),
            lambda origin, table: self._check_columns(origin, table, image_key, config_key),
        )
        self.rows = pa.concat_tables([t for _, t in tables], promote_options="default").to_pylist()
        self.messages = [
            chat_messages(row[self.prompt_key], self._where(i), self.prompt_key)
            for i, row in enumerate(self.rows)
        ]
        shuffle = bool(getattr(config, "shuffle", True))
        keep = _subsample(len(self.rows), max_samples, shuffle, getattr(config, "seed", None))
        if getattr(config, "filter_overlong_prompts", False):
            lengths = prompt_lengths(
                tokenizer,
                [self.messages[i] for i in keep],
                self.chat_template_kwargs,
                workers=int(getattr(config, "filter_overlong_prompts_workers", 1) or 1),
            )
            fits = [i for i, n in zip(keep, lengths, strict=True) if n <= self.max_prompt_length]
            print(
                f"jrl: {config_key}: kept {len(fits)} of {len(keep)} rows with prompts of at most "
                f"{self.max_prompt_length} tokens (data.filter_overlong_prompts)"
            )
            if not fits:
                raise ValueError(
                    f"{config_key}: every prompt in {', '.join(o for o, _ in tables)} is longer "
                    f"than data.max_prompt_length={self.max_prompt_length}; raise it, or set "
                    "data.filter_overlong_prompts=False with data.truncation=left"
                )
            keep = fits
        self.rows = [self.rows[i] for i in keep]
        self.origins = [self.origins[i] for i in keep]
        self.messages = [self.messages[i] for i in keep]

    def _check_columns(
        self, origin: str, table: pa.Table, image_key: str | None, config_key: str
    ) -> None:
        if self.prompt_key not in table.column_names:
            raise KeyError(
                f"{config_key}: {origin} has no column {self.prompt_key!r} (data.prompt_key); "
                f"its columns are {', '.join(table.column_names)}. Set data.prompt_key to the "
                "column that holds the prompts"
            )
        if not image_key or image_key not in table.column_names:
            return
        for i, images in enumerate(table.column(image_key).to_pylist()):
            if images is not None and (not isinstance(images, list | str | bytes) or images):
                raise ValueError(
                    f"{config_key}: {origin} row {i} has images in column {image_key!r} "
                    "(data.image_key), but jrl's models are text-only; drop the column or "
                    "use text-only data"
                )

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Row `index`: its columns (less the prompt column) plus the tokenised prompt fields."""
        messages = self.messages[index]
        text, ids = render_prompt(self.tokenizer, messages, self.chat_template_kwargs)
        if len(ids) > self.max_prompt_length and self.truncation == "error":
            raise ValueError(
                f"{self._where(index)} has a prompt of {len(ids)} tokens, more than "
                f"data.max_prompt_length={self.max_prompt_length}. Raise data.max_prompt_length, "
                "set data.truncation to left/right/middle, or set data.filter_overlong_prompts=True"
            )
        ids = truncate(ids, self.max_prompt_length, self.truncation)
        input_ids, mask = left_pad(ids, self.max_prompt_length, self.tokenizer.pad_token_id)
        row = dict(self.rows[index])
        del row[self.prompt_key]
        row.update(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            raw_prompt_ids=ids,
        )
        if self.return_raw_input_ids:
            raw = untemplated_ids(self.tokenizer, messages)
            row["raw_input_ids"] = truncate(raw, self.max_prompt_length, self.truncation)
        if self.return_raw_chat:
            row["raw_prompt"] = messages
        if self.return_full_prompt:
            row["full_prompts"] = text
        return {**row, **verl_row_fields(row.get("extra_info"))}


def verl_row_fields(extra_info: Any) -> dict[str, Any]:
    """The fields verl's dataset adds to every row: ``extra_info`` ({} where missing or None),
    and ``index``, ``tools_kwargs`` and ``interaction_kwargs`` taken from it (0, {}, {})."""
    extra = {} if extra_info is None else extra_info
    lookup = extra if isinstance(extra, Mapping) else {}
    return {
        "extra_info": extra,
        "index": lookup.get("index", 0),
        "tools_kwargs": lookup.get("tools_kwargs", {}),
        "interaction_kwargs": lookup.get("interaction_kwargs", {}),
    }


def create_rl_dataset(
    data_files: str | Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    config: RLDataSettings | Any,
    max_samples: int = -1,
    *,
    config_key: str = "data.train_files",
) -> Sequence[dict[str, Any]]:
    """`RLDataset`, or the class named by ``data.custom_cls.path`` / ``data.custom_cls.name``
    (`config.custom_cls`: a `UserDataset`, or the ``custom_cls`` section of a ``data`` section).

    A custom class is called as ``cls(data_files=<list of paths as given>, tokenizer=...,
    config=<the data section>, max_samples=...)`` (plus ``config_key=`` when it takes one, as
    subclasses of `RLDataset` do). It must support ``len(dataset)`` and ``dataset[i]``, each row
    a dict with int ``input_ids``, ``attention_mask`` and ``position_ids`` of length
    data.max_prompt_length and any other fields (carried to the batch's meta).
    """
    custom = getattr(config, "custom_cls", None)
    path, name = getattr(custom, "path", None), getattr(custom, "name", None)
    if not path and not name:
        return RLDataset(data_files, tokenizer, config, max_samples, config_key=config_key)
    cls = load_object(path, name, "data.custom_cls")
    if not callable(cls):
        raise TypeError(f"data.custom_cls.name={name!r} in {path!r} is not a class or function")
    kwargs: dict[str, Any] = dict(
        data_files=file_list(data_files, config_key),
        tokenizer=tokenizer,
        config=getattr(custom, "config", config),  # a UserDataset's section, verl's convention
        max_samples=max_samples,
    )
    if accepts_keyword(cls, "config_key"):
        kwargs["config_key"] = config_key
    dataset = cls(**kwargs)
    check_sized(dataset, name, path)
    return dataset


def _subsample(total: int, max_samples: int, shuffle: bool, seed: int | None) -> list[int]:
    """Row indices kept by `max_samples`: a seeded random subset if shuffling, else the first."""
    if max_samples <= 0 or max_samples >= total:
        return list(range(total))
    if not shuffle:
        return list(range(max_samples))
    return np.random.default_rng(seed).choice(total, size=max_samples, replace=False).tolist()
