"""Templated prompt lengths, computed in one process or spread over a pool of processes.

`data.filter_overlong_prompts_workers` > 1 splits the prompts into contiguous chunks scored by
spawned worker processes (the tokenizer is sent once per worker); the result is the same list as
with one worker.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from jrl.data.prompts import Messages, render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_worker_state: dict[str, Any] = {}


def _lengths(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Messages],
    template_kwargs: Mapping[str, Any],
) -> list[int]:
    return [len(render_prompt(tokenizer, m, template_kwargs)[1]) for m in prompts]


def _init_worker(tokenizer: PreTrainedTokenizerBase, template_kwargs: Mapping[str, Any]) -> None:
    _worker_state.update(tokenizer=tokenizer, template_kwargs=template_kwargs)


def _worker_lengths(prompts: Sequence[Messages]) -> list[int]:
    return _lengths(_worker_state["tokenizer"], prompts, _worker_state["template_kwargs"])


def prompt_lengths(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Messages],
    template_kwargs: Mapping[str, Any],
    workers: int = 1,
) -> list[int]:
    """The token count of each templated prompt (generation prompt included), in order."""
    workers = min(int(workers), len(prompts))
    if workers <= 1:
        return _lengths(tokenizer, prompts, template_kwargs)
    chunk = -(-len(prompts) // (4 * workers))
    chunks = [prompts[i : i + chunk] for i in range(0, len(prompts), chunk)]
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(tokenizer, dict(template_kwargs)),
    ) as pool:
        return [n for part in pool.map(_worker_lengths, chunks) for n in part]
