"""Tokenizers: load a Hugging Face tokenizer from a local folder, or train a tiny one for tests."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from jrl.data.atomic import atomic_dir
from jrl.data.settings import TokenizerSettings

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.txt",
)


def load_tokenizer(
    path: str | os.PathLike,
    *,
    trust_remote_code: bool = False,
    custom_chat_template: str | None = None,
) -> PreTrainedTokenizerBase:
    """Loads the tokenizer of a local Hugging Face folder (or of a ``.gguf`` file's metadata).

    Nothing is fetched from the hub. A tokenizer without a pad token gets its eos token as pad
    (with a warning); `custom_chat_template` replaces the folder's chat template.
    """
    location = Path(path).expanduser()
    if location.is_file() and location.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(
            location.parent,
            gguf_file=location.name,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
        )
    else:
        if not location.is_dir():
            raise FileNotFoundError(
                f"tokenizer path {str(location)!r} does not exist; give a local Hugging Face model "
                "folder (with tokenizer.json / tokenizer_config.json) or a .gguf file"
            )
        if not any((location / name).exists() for name in _TOKENIZER_FILES):
            raise FileNotFoundError(
                f"no tokenizer files in {str(location)!r} (looked for "
                f"{', '.join(_TOKENIZER_FILES)}); point the tokenizer path at a Hugging Face "
                "model folder"
            )
        tokenizer = AutoTokenizer.from_pretrained(
            location, local_files_only=True, trust_remote_code=trust_remote_code
        )
    if tokenizer.pad_token_id is None:
        warnings.warn(
            f"tokenizer at {str(location)!r} has no pad token; using its eos token "
            f"{tokenizer.eos_token!r} as pad",
            stacklevel=2,
        )
        tokenizer.pad_token = tokenizer.eos_token
    if custom_chat_template is not None:
        tokenizer.chat_template = custom_chat_template
    return tokenizer


def train_tiny_tokenizer(
    texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE on `texts` and saves it with a ChatML template as an HF folder.

    Special tokens: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos). The folder is
    written beside `out_dir` and moved into place once complete.
    """
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
    )
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
    return tokenizer


def tokenizer_of(settings: TokenizerSettings) -> PreTrainedTokenizerBase:
    """The tokenizer `settings` name (`load_tokenizer`); a missing or unreadable folder is an
    error naming its config key."""
    try:
        return load_tokenizer(
            settings.path,
            trust_remote_code=settings.trust_remote_code,
            custom_chat_template=settings.chat_template,
        )
    except (FileNotFoundError, OSError) as err:
        raise FileNotFoundError(f"{settings.key}: {err}") from err


def character_tokenizer(
    out_dir: str | os.PathLike,
    vocabulary: Iterable[str],
    eos_token: str,
    chat_template: str,
    added_tokens: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """A toy task's tokenizer: one token per character of `vocabulary` (byte-level, no merges;
    other characters, spaces too, are dropped), then each of `added_tokens` whole; eos = pad =
    `eos_token`. Saved as an HF folder at `out_dir`."""
    chars = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(vocabulary)}, merges=[]))
    chars.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    chars.decoder = decoders.ByteLevel()
    chars.add_tokens([AddedToken(token, normalized=False) for token in added_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=chars,
        eos_token=eos_token,
        pad_token=eos_token,
        chat_template=chat_template,
    )
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
    return tokenizer
