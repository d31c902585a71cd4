"""The digits task: a toy prompt set on which RL visibly teaches a tiny random model.

    python -m jrl.data.digits --local_dir ~/data/digits
    python -m jrl.data.digits --local_dir ~/data/digits --train_size 4096 --test_size 256

A prompt is a few digits and ``=``, e.g. ``"3718="``; the answer is the first digit (``"3"``).
A random-init model already names it now and then (about one token in twelve), so sampled groups
carry reward signal from the first step, and RL lifts the greedy accuracy from chance to near 1.

The vocabulary has one character per token: the ten digits, ``=`` and ``<|endoftext|>`` (end of
text and padding). `build_tokenizer` writes it as a Hugging Face folder, byte-level like Qwen2's
tokenizer (which transformers substitutes when it loads the folder of a qwen2 model) and with a
chat template that writes the message contents and nothing else, so the prompt's tokens are
exactly its characters.

Train and test prompts are disjoint: both are drawn without replacement from all digit strings.
Each row: data_source "jrl/digits", prompt [{"role": "user", "content": "3718="}], ability
"copy", reward_model {"style": "rule", "ground_truth": "3"}, extra_info {"split", "index"}.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerFast

from jrl.data.splits import add_save_dir, save_dir, write_splits
from jrl.data.tokenizer import character_tokenizer

DATA_SOURCE = "jrl/digits"
EOS_TOKEN = "<|endoftext|>"
VOCABULARY = (EOS_TOKEN, *"0123456789", "=")
CHAT_TEMPLATE = "{{- messages | map(attribute='content') | join('') }}"
NUM_DIGITS = 4


def build_tokenizer(out_dir: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The task's tokenizer (`VOCABULARY`, one token per character, eos = pad), saved as an HF
    folder at `out_dir`. Characters outside the vocabulary (spaces too) are dropped."""
    return character_tokenizer(out_dir, VOCABULARY, EOS_TOKEN, CHAT_TEMPLATE)


def _row(digits: str, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{digits}="}],
        "ability": "copy",
        "reward_model": {"style": "rule", "ground_truth": digits[0]},
        "extra_info": {"split": split, "index": index},
    }


def make_rows(
    train_size: int, test_size: int, seed: int = 0, num_digits: int = NUM_DIGITS
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``: distinct prompts of `num_digits` digits, no prompt in
    both splits; the same arguments give the same rows."""
    if num_digits < 1:
        raise ValueError(f"num_digits must be at least 1, got {num_digits}")
    total = 10**num_digits
    if min(train_size, test_size) < 1 or train_size + test_size > total:
        raise ValueError(
            f"train_size={train_size} and test_size={test_size} must be positive and sum to at "
            f"most {total}, the number of distinct {num_digits}-digit prompts; lower the sizes "
            "or raise num_digits"
        )
    picks = np.random.default_rng(seed).choice(total, size=train_size + test_size, replace=False)
    strings = [f"{int(p):0{num_digits}d}" for p in picks]
    return {
        "train": [_row(s, "train", i) for i, s in enumerate(strings[test_size:])],
        "test": [_row(s, "test", i) for i, s in enumerate(strings[:test_size])],
    }


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Command line: write train.parquet and test.parquet under --local_save_dir (or
    --local_dir)."""
    parser = argparse.ArgumentParser(
        prog="python -m jrl.data.digits", description=__doc__.split("\n")[0]
    )
    add_save_dir(parser, "~/data/digits")
    parser.add_argument("--train_size", type=int, default=4096, help="rows in train.parquet")
    parser.add_argument("--test_size", type=int, default=256, help="rows in test.parquet")
    parser.add_argument("--num_digits", type=int, default=NUM_DIGITS, help="digits per prompt")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator")
    args = parser.parse_args(argv)
    try:
        rows = make_rows(args.train_size, args.test_size, args.seed, args.num_digits)
    except ValueError as err:
        parser.error(str(err))
    return write_splits(save_dir(args), rows)


if __name__ == "__main__":
    main()
