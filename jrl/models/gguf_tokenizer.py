"""A Hugging Face fast tokenizer rebuilt from a GGUF's byte-level BPE metadata (no torch needed)."""

from __future__ import annotations

import os

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from jrl.models.gguf_io import array_field, metadata

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4


def _pre_tokenizer(pre: str, path: str | os.PathLike) -> pre_tokenizers.PreTokenizer:
    """The split rules llama.cpp names by `tokenizer.ggml.pre`."""
    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise NotImplementedError(
        f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
        "(supported: default, gpt2, smollm, llama-bpe)"
    )


def tokenizer_from_gguf(
    reader: gguf.GGUFReader, path: str | os.PathLike
) -> PreTrainedTokenizerFast:
    """The GGUF's tokenizer (vocab, merges, special tokens, chat template) as a fast tokenizer."""
    meta = metadata(reader)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise NotImplementedError(
            f"{path}: tokenizer.ggml.model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
        )
    tokens = array_field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in array_field(reader, "tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"), path)
    tok.decoder = decoders.ByteLevel()

    token_types = array_field(reader, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    typed = list(zip(tokens, token_types, strict=True))
    control = [AddedToken(t, normalized=False, special=True) for t, k in typed if k == _CONTROL]
    tok.add_special_tokens(control)
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in typed if k == _USER_DEFINED])

    def special(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None else None

    bos = special("bos")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=special("eos"),
        pad_token=special("padding"),
        unk_token=special("unknown"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=meta.get(f"{meta['general.architecture']}.context_length"),
        clean_up_tokenization_spaces=False,
    )
