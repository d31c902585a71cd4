"""What verl's ``data`` keys (and the tokenizer's) become: the RunSpec's `DataSpec`.

- The tokenizer: ``actor_rollout_ref.model.tokenizer_path`` when set, else the model's
  ``path``, with ``data.trust_remote_code`` (as verl) and ``model.custom_chat_template``.
- The rows: `RLDataSettings` (`jrl.data.settings`) of the ``data`` keys `RLDataset` reads; with
  ``data.custom_cls`` set, the user's class, which gets the whole ``data`` section (verl's
  calling convention; only then is the section read whole).
- The batches: files, ``train_batch_size``, ``gen_batch_size`` (the loader's batch: DAPO's
  generation batch, `jrl.runspec.dynamic_sampling`), ``shuffle``, ``validation_shuffle`` and the
  row caps.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from ml_collections import FrozenConfigDict

from jrl.data.settings import RLDataSettings, TokenizerSettings, UserDataset
from jrl.runspec.agent import uses_agent_loops
from jrl.runspec.dynamic_sampling import gen_batch_size
from jrl.runspec.reads import KeyReads

MODEL = "actor_rollout_ref.model"
ROLLOUT = "actor_rollout_ref.rollout"
TEXT_ONLY = "multi-modal inputs: jrl's model families are text-only (rows with images are refused)"
UNREAD_FIELD = "the batch would carry it, but only a custom reward manager (importlib) reads it"
UNREAD_MESSAGES = (
    "only a reward model with input_tokenizer, or a custom reward manager, reads the messages"
)


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
    """A PPO-family run's data: its files and batch size, the prompts of one batch of the data
    loader (`gen_batch_size`: ``data.gen_batch_size``, else ``train_batch_size``), the prompts
    shuffled each epoch when `shuffle` (the validation set when `validation_shuffle`), the
    tokenizer and how rows become prompts (`rows`)."""

    files: DataFiles
    gen_batch_size: int
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


def _remote(files: DataFiles) -> bool:
    """Whether a data file is remote (a URL other than ``file://``)."""
    groups = (files.train_files, files.val_files)
    paths = [p for group in groups for p in ([group] if isinstance(group, str) else group)]
    return any("://" in path and not path.startswith("file://") for path in paths)


def _prompt_forms(config: KeyReads) -> dict[str, bool]:
    """The raw forms of the prompt a row keeps (``return_raw_*``, ``return_full_prompt``), read
    only where a reader of them exists: a reward manager of the user's (handed the batch), and
    for the messages a reward model that re-templates them (``input_tokenizer``). Agent loops
    always get the messages (``raw_prompt``), as verl's read them."""
    data, rm = config.data, config.reward_model
    custom_manager = config.reward_manager.source == "importlib"
    retemplates = rm.peek("enable") and rm.model.peek("input_tokenizer") is not None
    agent_loops = uses_agent_loops(config.actor_rollout_ref.rollout, read=False)
    forms = {}
    for key in ("return_raw_input_ids", "return_full_prompt", "return_raw_chat"):
        if key == "return_raw_chat" and agent_loops:
            data.skip(key, "agent loops read every row's messages (raw_prompt)")
            forms[key] = True
        elif custom_manager or (key == "return_raw_chat" and retemplates):
            forms[key] = bool(data[key])
        else:
            data.skip(key, UNREAD_MESSAGES if key == "return_raw_chat" else UNREAD_FIELD)
            forms[key] = False
    return forms


def rl_data_settings(config: KeyReads) -> RLDataSettings:
    """The ``data`` keys that `RLDataset` reads. ``image_key`` is only checked (rows with
    images are refused: the model families are text-only); ``cache_dir`` is read for remote
    files only."""
    data = config.data
    data.skip("image_key", TEXT_ONLY)
    remote = _remote(data_files(data))
    if not remote:
        data.skip("cache_dir", "where remote data files are copied: every data file is local")
    return RLDataSettings(
        prompt_key=data.prompt_key,
        max_prompt_length=int(data.max_prompt_length),
        truncation=data.truncation,
        filter_overlong_prompts=bool(data.filter_overlong_prompts),
        **_prompt_forms(config),
        shuffle=bool(data.shuffle),
        seed=data.seed,
        image_key=data.peek("image_key"),
        cache_dir=data.cache_dir if remote else None,
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
    data, val = config.data, config[ROLLOUT].val_kwargs
    greedy = not val.peek("do_sample") or val.peek("temperature") == 0
    if greedy:
        data.skip("validation_shuffle", "greedy validation: the order of its rows changes nothing")
    return DataSpec(
        files=data_files(data),
        gen_batch_size=gen_batch_size(data),
        shuffle=bool(data.shuffle),
        validation_shuffle=False if greedy else bool(data.validation_shuffle),
        tokenizer=tokenizer_settings(config),
        rows=rl_data_settings(config),
    )
