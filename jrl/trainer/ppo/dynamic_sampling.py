"""DAPO's dynamic sampling (``algorithm.filter_groups``): a step keeps only the prompts whose
answers disagree, and draws generation batches until it has ``train_batch_size`` of them.

A prompt's group is its rows of one ``uid``, with metric values m_1..m_k (`row_metric`). It is
kept when

    std(m_1..m_k) > 0   or   k = 1          (std: the population standard deviation, numpy's)

as in verl's DAPO recipe (``recipe/dapo/dapo_ray_trainer.py``, v0.6.0). `GroupCollector` gathers
the kept groups of successive generation batches in generation order and, once at least
``train_batch_size`` prompts are kept, gives the rows of the first ``train_batch_size`` of them
(verl's ``batch[:train_batch_size * n]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jrl.batch import Batch
from jrl.runspec.dynamic_sampling import SEQ_FINAL_REWARD, SEQ_REWARD, FilterGroups

ExtraInfo = Mapping[str, Sequence[Any]]
_LIMIT = "algorithm.filter_groups.max_num_gen_batches"


def take_rows(extra_info: ExtraInfo, rows: Sequence[int]) -> dict[str, list[Any]]:
    """The reward's extra-info columns at `rows` (in that order), as `Batch.take` takes rows."""
    return {key: [values[i] for i in rows] for key, values in extra_info.items()}


def row_metric(batch: Batch, extra_info: ExtraInfo, metric: str) -> np.ndarray:
    """Each row's value of `metric`: ``seq_reward`` = sum of its ``token_level_scores``,
    ``seq_final_reward`` = sum of its ``token_level_rewards`` (the scores where the batch has no
    final rewards yet), else the reward manager's extra-info column of that name."""
    if metric in (SEQ_REWARD, SEQ_FINAL_REWARD):
        final = metric == SEQ_FINAL_REWARD and "token_level_rewards" in batch.tensors
        tensor = batch.tensors["token_level_rewards" if final else "token_level_scores"]
        return np.asarray(tensor, np.float64).sum(-1)
    if metric not in extra_info:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a column of the reward's extra "
            f"info (it has: {', '.join(sorted(extra_info)) or 'none'}); use one of those, "
            f"{SEQ_REWARD} or {SEQ_FINAL_REWARD}"
        )
    return np.asarray([float(value) for value in extra_info[metric]], np.float64)


def kept_rows(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each row's group is kept: the std of its group's `values` > 0, or one row."""
    groups, index = np.unique(np.asarray(uids), return_inverse=True)
    keep = np.zeros(len(groups), bool)
    for group in range(len(groups)):
        members = values[index == group]
        keep[group] = len(members) == 1 or np.std(members) > 0
    return keep[index]


def _first_groups(uids: np.ndarray, count: int) -> np.ndarray:
    """Row indices of the first `count` groups of `uids`, in order of first appearance."""
    _, first = np.unique(uids, return_index=True)
    chosen = set(uids[np.sort(first)[:count]])
    return np.flatnonzero([uid in chosen for uid in uids])


class GroupCollector:
    """The kept groups of one step's generation batches (`add`), until `full`; `batch` gives
    the rows the step trains on and `metrics` what the filter did."""

    def __init__(self, settings: FilterGroups):
        self.settings = settings
        self.gen_batches = 0
        self.kept = 0  # prompts kept so far
        self.filtered = 0  # prompts dropped for a metric that does not vary
        self._parts: list[tuple[Batch, dict[str, list[Any]]]] = []

    @property
    def full(self) -> bool:
        """Whether at least ``train_batch_size`` prompts are kept."""
        return self.kept >= self.settings.train_batch_size

    def add(self, batch: Batch, extra_info: ExtraInfo) -> None:
        """Filters one scored generation batch (rows with ``uid`` meta and
        ``token_level_scores``; `extra_info`: the reward's columns, one value per row)."""
        self.gen_batches += 1
        uids = np.asarray(batch.meta["uid"])
        keep = kept_rows(uids, row_metric(batch, extra_info, self.settings.metric))
        groups = len(np.unique(uids))
        kept = len(np.unique(uids[keep]))
        self.kept += kept
        self.filtered += groups - kept
        rows = np.flatnonzero(keep)
        self._parts.append((batch.take(rows), take_rows(extra_info, rows)))

    def check_limit(self, step: int, gen_batch_size: int) -> None:
        """ValueError when the step is not `full` after ``max_num_gen_batches`` batches."""
        settings = self.settings
        if self.full or not settings.limited or self.gen_batches < settings.max_num_gen_batches:
            return
        raise ValueError(
            f"step {step}: {self.gen_batches} generation batches of {gen_batch_size} prompts "
            f"(data.gen_batch_size) kept only {self.kept} of the {settings.train_batch_size} "
            f"prompts a step trains on (data.train_batch_size): the other groups' "
            f"{settings.metric} did not vary ({_LIMIT}={settings.max_num_gen_batches}). Check "
            f"that the data is not too hard or too easy for the model, or raise {_LIMIT} "
            "(0: no limit)"
        )

    def batch(self) -> tuple[Batch, dict[str, list[Any]]]:
        """The rows of the first ``train_batch_size`` kept prompts and their extra-info
        columns (None where a batch lacked a column)."""
        batch = Batch.concat([part for part, _ in self._parts])
        keys = dict.fromkeys(key for _, columns in self._parts for key in columns)
        columns = {
            key: [
                value
                for part, part_columns in self._parts
                for value in part_columns.get(key, [None] * len(part))
            ]
            for key in keys
        }
        rows = _first_groups(np.asarray(batch.meta["uid"]), self.settings.train_batch_size)
        return batch.take(rows), take_rows(columns, rows)

    def metrics(self) -> dict[str, float]:
        """verl's ``train/num_gen_batches`` (the DAPO recipe's) and current verl's
        ``training/filter_groups/*``: prompts filtered out, and kept prompts beyond
        ``train_batch_size`` that the step discards."""
        return {
            "train/num_gen_batches": float(self.gen_batches),
            "training/filter_groups/evicted_samples": float(self.filtered),
            "training/filter_groups/discarded_surplus_samples": float(
                max(self.kept - self.settings.train_batch_size, 0)
            ),
        }
