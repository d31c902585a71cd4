"""The lookup task: a toy that a tiny random model can only solve by calling a tool.

Each row has a secret digit that its prompt does not show (the prompt is ``"?"`` for every row);
the ``lookup`` tool (`jrl.agent.tools.lookup.LookupTool`) answers it. So without the tool the
model can only guess (one time in ten at best); with it, it has to learn two things: to call the
tool first, then to repeat the digit that the tool answered.

The vocabulary has one token per character (`VOCABULARY`) plus one token for the whole tool call
(`CALL`, Hermes format), so a call is one choice for the model. The chat template writes a user
turn as its text, an assistant turn as its text and EOS, a tool turn as ``@`` and its text, and
nothing for system turns (so the tools' listing adds no tokens). A rollout that uses the tool
reads ``[CALL, EOS, @, 7, 7, EOS]``: the model's tokens, the tool's turn (masked), the model's
answer. `jrl.reward.lookup` scores it.

Each row: data_source "jrl/lookup", agent_name "tool_agent", prompt [{"role": "user",
"content": "?"}], reward_model {"style": "rule", "ground_truth": "7"}, extra_info {"split",
"index", "tools_kwargs": {"lookup": {"create_kwargs": {"secret": "7"}}}}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from transformers import PreTrainedTokenizerFast

from jrl.data.lookup_tokens import CALL, DATA_SOURCE, TOOL_MARK
from jrl.data.tokenizer import character_tokenizer

EOS_TOKEN = "<|endoftext|>"
VOCABULARY = (EOS_TOKEN, *"0123456789", "?", TOOL_MARK)
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}" + TOOL_MARK + "{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}{{ m['content'] }}" + EOS_TOKEN + ""
    "{%- elif m['role'] == 'user' -%}{{ m['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
TOOL_CONFIG = {
    "tools": [
        {
            "class_name": "jrl.agent.tools.lookup.LookupTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "The secret digit of this question.",
                    "parameters": {"type": "object", "properties": {}, "required": []},
                },
            },
        }
    ]
}


def build_tokenizer(out_dir: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The task's tokenizer (`VOCABULARY` and the `CALL` token; eos = pad), saved as an HF
    folder at `out_dir`."""
    return character_tokenizer(out_dir, VOCABULARY, EOS_TOKEN, CHAT_TEMPLATE, added_tokens=[CALL])


def make_rows(train_size: int, test_size: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}`` with uniformly drawn secrets; the same arguments give
    the same rows."""
    secrets = np.random.default_rng(seed).integers(0, 10, size=train_size + test_size)
    sizes = {"train": train_size, "test": test_size}
    rows, start = {}, 0
    for split, size in sizes.items():
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "agent_name": "tool_agent",
                "prompt": [{"role": "user", "content": "?"}],
                "ability": "tool use",
                "reward_model": {"style": "rule", "ground_truth": str(secret)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "tools_kwargs": {"lookup": {"create_kwargs": {"secret": str(secret)}}},
                },
            }
            for index, secret in enumerate(secrets[start : start + size])
        ]
        start += size
    return rows


def write_tool_config(path: str | os.PathLike) -> Path:
    """The task's tool config (verl's YAML format: the lookup tool) at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(yaml.safe_dump(TOOL_CONFIG, sort_keys=False))
    os.replace(partial, path)
    return path
