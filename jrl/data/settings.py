"""The typed settings `jrl.data` takes (the resolver, `jrl.runspec`, reads them from verl's keys
once): the tokenizer to load, how `RLDataset` turns parquet rows into prompts and `SFTDataset`
into trained sequences, and a user's own dataset class. Plain values only: importing this module
loads no tokenizer and no jax."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer of the folder (or .gguf file) `path`, with repository code when
    `trust_remote_code`, its chat template replaced by `chat_template` when set; `key` names the
    path's config key in errors."""

    path: str
    trust_remote_code: bool
    chat_template: str | None
    key: str


@dataclasses.dataclass(frozen=True)
class UserDataset:
    """A user's dataset class (``data.custom_cls``): `name` in the file or module `path`,
    called with verl's arguments, its ``config`` the ``data`` section as verl hands it over
    (`config`, read-only)."""

    path: str
    name: str
    config: Any


@dataclasses.dataclass(frozen=True)
class RLDataSettings:
    """What `RLDataset` reads, under the names of verl's ``data`` keys (so a user's subclass
    that gets verl's section reads it alike): the prompt column, the prompt length and how a
    longer prompt is cut or dropped, which raw
    forms of the prompt a row also keeps, the subset drawn by ``max_samples`` (seeded by `seed`
    when `shuffle`), the image column refused in text-only runs, the cache of remote files, the
    chat template's extra arguments and a user's own class (`custom_cls`, None: `RLDataset`)."""

    prompt_key: str
    max_prompt_length: int
    truncation: str
    filter_overlong_prompts: bool
    return_raw_input_ids: bool
    return_raw_chat: bool
    return_full_prompt: bool
    shuffle: bool
    seed: int | None
    image_key: str | None
    cache_dir: str | None
    apply_chat_template_kwargs: Mapping[str, Any]
    custom_cls: UserDataset | None


@dataclasses.dataclass(frozen=True)
class MultiTurn:
    """verl's ``data.multiturn``: with `enable`, rows are conversations in the column
    `messages_key`, with tools in `tools_key` and the thinking switch in `enable_thinking_key`."""

    enable: bool
    messages_key: str
    tools_key: str
    enable_thinking_key: str


@dataclasses.dataclass(frozen=True)
class SFTDataSettings:
    """What `SFTDataset` reads, under the names of verl's SFT ``data`` keys: where a row's
    prompt and response are (a column, then keys into it) or its conversation (`multiturn`),
    the sequence length and how a longer one is cut, the chat template's extra arguments, the
    cache of remote files and a user's own class (`custom_cls`, None: `SFTDataset`)."""

    prompt_key: str
    prompt_dict_keys: tuple[str, ...] | None
    response_key: str
    response_dict_keys: tuple[str, ...] | None
    multiturn: MultiTurn
    max_length: int
    truncation: str
    apply_chat_template_kwargs: Mapping[str, Any]
    cache_dir: str | None
    custom_cls: UserDataset | None
