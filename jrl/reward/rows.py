"""The rows a reward manager scores: a batch's prompts and responses decoded, with their meta."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from jrl.batch import Batch


@dataclasses.dataclass
class ScoringRows:
    """Per row: decoded prompt and response (special tokens skipped), the response's valid token
    count, reward_model.ground_truth (None when absent), the data source and extra_info, with
    what verl's managers add to it: ``num_turns`` (the row's turns from an agent loop, None
    without one) and ``rollout_reward_scores`` (the rollout's own scores: none in jrl, {})."""

    prompts: list[str]
    responses: list[str]
    response_lengths: np.ndarray
    ground_truths: list[Any]
    data_sources: list[Any]
    extra_infos: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.responses)

    def keyword_calls(
        self, responses: list[str] | None = None
    ) -> list[tuple[tuple[()], dict[str, Any]]]:
        """Each row's call of a scoring function: verl's keywords data_source, solution_str
        (`responses` when given, else the decoded response), ground_truth and extra_info."""
        responses = self.responses if responses is None else responses
        return [
            (
                (),
                {
                    "data_source": source,
                    "solution_str": response,
                    "ground_truth": truth,
                    "extra_info": info,
                },
            )
            for source, response, truth, info in zip(
                self.data_sources, responses, self.ground_truths, self.extra_infos, strict=True
            )
        ]


def decode_rows(
    batch: Batch, tokenizer: PreTrainedTokenizerBase, reward_fn_key: str
) -> ScoringRows:
    """The rows of `batch`: tensors ``prompts`` [B, P] (left-padded), ``responses`` [B, R] and
    ``attention_mask`` [B, P + R]; meta ``reward_model``, `reward_fn_key`, ``extra_info``."""
    needed = ("prompts", "responses", "attention_mask", "reward_model", reward_fn_key)
    missing = [k for k in needed if k not in batch]
    if missing:
        raise KeyError(
            f"the batch to score lacks {missing} (the data source is read from "
            f"{reward_fn_key!r}, data.reward_fn_key); it has {sorted(batch.tensors)} "
            f"and {sorted(batch.meta)}"
        )
    prompts = np.asarray(batch["prompts"])
    responses = np.asarray(batch["responses"])
    mask = np.asarray(batch["attention_mask"])
    width = prompts.shape[1]
    prompt_lengths = mask[:, :width].sum(-1)
    response_lengths = mask[:, width:].sum(-1)
    ground_truths = []
    for i, spec in enumerate(batch["reward_model"]):
        if not isinstance(spec, Mapping):
            raise TypeError(
                f"row {i}: reward_model must be a dict with 'ground_truth', got "
                f"{type(spec).__name__}: {str(spec)[:200]}"
            )
        ground_truths.append(spec.get("ground_truth"))
    extra_infos = batch.meta.get("extra_info", [None] * len(batch))
    turns = batch.meta.get("num_turns", [None] * len(batch))
    return ScoringRows(
        prompts=tokenizer.batch_decode(
            [row[width - n :].tolist() for row, n in zip(prompts, prompt_lengths, strict=True)],
            skip_special_tokens=True,
        ),
        responses=tokenizer.batch_decode(
            [row[:n].tolist() for row, n in zip(responses, response_lengths, strict=True)],
            skip_special_tokens=True,
        ),
        response_lengths=response_lengths,
        ground_truths=ground_truths,
        data_sources=list(batch[reward_fn_key]),
        extra_infos=[
            {
                **(info or {}),
                "num_turns": None if n is None else int(n),
                "rollout_reward_scores": {},
            }
            for info, n in zip(extra_infos, turns, strict=True)
        ],
    )
