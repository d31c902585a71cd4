"""What verl's ``data`` keys (and the tokenizer's) become: the RunSpec's `DataSpec`.

- The tokenizer: ``actor_rollout_ref.model.tokenizer_path`` when set, else the model's
  ``path``, with ``data.trust_remote_code`` (as verl) and ``model.custom_chat_template``.
- The rows: `RLDataSettings` (`jrl.data.settings`) of the ``data`` keys `RLDataset` reads; with
  ``data.custom_cls`` set, the user's class, which gets the whole ``data`` section (verl's
  calling convention; only then is the section read whole).
- The batches: files, ``train_batch_size``, ``shuffle``, ``validation_shuffle`` and the row caps.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from ml_collections import FrozenConfigDict

from jrl.data.settings import RLDataSettings, TokenizerSettings, UserDataset
from jrl.runspec.reads import KeyReads

MODEL = "actor_rollout_ref.model"


@dataclasses.dataclass(frozen=True)
class DataFiles:
    """The train and validation files (one path or several), each capped at `*_max_samples`
    rows (-1: all), and the rows of one training step (`train_batch_size`): verl's ``data``
    keys of the same names, in RL and SFT alike."""

    train_files: str | tuple[str, ...]
    val_files: str | tuple[str, ...]
    train_max_samples: int
    val_max_samples: int
    train_batch_size: int


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """A PPO-family run's data: its files and batch size, the prompts shuffled each epoch when
    `shuffle` (the validation set when `validation_shuffle`), the tokenizer and how rows become
    prompts (`rows`)."""

    files: DataFiles
    shuffle: bool
    validation_shuffle: bool
    tokenizer: TokenizerSettings
    rows: RLDataSettings


def _files(value: str | list[str]) -> str | tuple[str, ...]:
    """One file as given, several as a tuple."""
    return value if isinstance(value, str) else tuple(value)


def data_files(data: KeyReads) -> DataFiles:
    """The files and batch size of a ``data`` section (RL or SFT)."""
    return DataFiles(
        train_files=_files(data.train_files),
        val_files=_files(data.val_files),
        train_max_samples=int(data.train_max_samples),
        val_max_samples=int(data.val_max_samples),
        train_batch_size=int(data.train_batch_size),
    )


def user_dataset(data: KeyReads) -> UserDataset | None:
    """The user's class that ``data.custom_cls`` names, with the whole ``data`` section (read-
    only) to hand it; None when unset."""
    custom = data.custom_cls
    if not (custom.path or custom.name):
        return None
    return UserDataset(custom.path, custom.name, FrozenConfigDict(data.whole()))


def rl_data_settings(data: KeyReads) -> RLDataSettings:
    """The ``data`` keys that `RLDataset` reads."""
    return RLDataSettings(
        prompt_key=data.prompt_key,
        max_prompt_length=int(data.max_prompt_length),
        truncation=data.truncation,
        filter_overlong_prompts=bool(data.filter_overlong_prompts),
        filter_overlong_prompts_workers=int(data.filter_overlong_prompts_workers or 1),
        return_raw_input_ids=bool(data.return_raw_input_ids),
        return_raw_chat=bool(data.return_raw_chat),
        return_full_prompt=bool(data.return_full_prompt),
        shuffle=bool(data.shuffle),
        seed=data.seed,
        image_key=data.image_key,
        cache_dir=data.cache_dir,
        apply_chat_template_kwargs=MappingProxyType(data.apply_chat_template_kwargs.whole()),
        custom_cls=user_dataset(data),
    )


def tokenizer_settings(config: KeyReads) -> TokenizerSettings:
    """The policy's tokenizer (``model.tokenizer_path``, else ``model.path``)."""
    model = config[MODEL]
    key = "tokenizer_path" if model.get("tokenizer_path") else "path"
    return TokenizerSettings(
        path=model[key],
        trust_remote_code=bool(config.data.get("trust_remote_code", False)),
        chat_template=model.get("custom_chat_template"),
        key=f"{MODEL}.{key}",
    )


def data_spec(config: KeyReads) -> DataSpec:
    """The DataSpec of a PPO-family config."""
    data = config.data
    return DataSpec(
        files=data_files(data),
        shuffle=bool(data.shuffle),
        validation_shuffle=bool(data.validation_shuffle),
        tokenizer=tokenizer_settings(config),
        rows=rl_data_settings(data),
    )
