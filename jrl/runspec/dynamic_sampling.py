"""DAPO's dynamic sampling, resolved once: ``data.gen_batch_size`` and
``algorithm.filter_groups.{enable, metric, max_num_gen_batches}`` (verl's DAPO recipe, v0.6.0
``recipe/dapo/dapo_ray_trainer.py``; in current verl's core since v0.9, which adds
``max_inflight_gen_batches``, the generation batches pending at once: jrl's step draws them one
at a time, current verl's default 1).

With filtering on, a step generates batches of ``gen_batch_size`` prompts x n, keeps the prompts
whose n values of `metric` have a standard deviation above 0 (and groups of one row), and draws
further batches until ``train_batch_size`` prompts are kept (`jrl.trainer.ppo.dynamic_sampling`).
The data loader hands out ``gen_batch_size`` prompts per batch, so verl's step count
``len(loader) * total_epochs`` counts generation batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ml_collections import ConfigDict

from jrl.runspec.reads import KeyReads

SEQ_REWARD = "seq_reward"  # the sum of a row's token_level_scores
SEQ_FINAL_REWARD = "seq_final_reward"  # the sum of its token_level_rewards
SEQUENCE_METRICS = (SEQ_REWARD, SEQ_FINAL_REWARD)
_GEN = "data.gen_batch_size"
_FILTER = "algorithm.filter_groups"


@dataclasses.dataclass(frozen=True)
class FilterGroups:
    """``algorithm.filter_groups`` when enabled: the per-row `metric` whose spread within a
    prompt's group keeps it (`SEQUENCE_METRICS`, else a column of the reward's extra info, such
    as "acc" or "score"), the prompts a step trains on (`train_batch_size`) and the most
    generation batches a step may draw (`max_num_gen_batches`; <= 0: no limit)."""

    metric: str
    train_batch_size: int
    max_num_gen_batches: int

    @property
    def limited(self) -> bool:
        """Whether `max_num_gen_batches` bounds a step."""
        return self.max_num_gen_batches > 0


def gen_batch_size(data: KeyReads) -> int:
    """Prompts per batch of the data loader: ``data.gen_batch_size``, else (null)
    ``data.train_batch_size``, as verl's loader."""
    return int(data.gen_batch_size if data.gen_batch_size is not None else data.train_batch_size)


def filter_groups(config: KeyReads) -> FilterGroups | None:
    """The enabled ``algorithm.filter_groups`` (None when off: its other keys stay unread)."""
    section = config.algorithm.filter_groups
    if not section.enable:
        keys = ("metric", "max_num_gen_batches", "max_inflight_gen_batches")
        section.skip(keys, f"{_FILTER}.enable is False")
        return None
    section.skip("max_inflight_gen_batches", "1, its default (checked): one batch at a time")
    return FilterGroups(
        metric=str(section.metric),
        train_batch_size=int(config.data.train_batch_size),
        max_num_gen_batches=int(section.max_num_gen_batches),
    )


def dynamic_sampling_problems(config: ConfigDict) -> Iterator[str]:
    """The rules of ``data.gen_batch_size`` and ``algorithm.filter_groups``, each naming its
    key and fix."""
    data, section = config.data, config.algorithm.filter_groups
    gen, train = data.gen_batch_size, data.train_batch_size
    if gen is not None and gen <= 0:
        yield f"{_GEN}={gen} must be positive, or null for data.train_batch_size ({train})"
    elif not section.enable and gen is not None and gen != train:
        yield (
            f"{_GEN}={gen} differs from data.train_batch_size={train} without "
            f"{_FILTER}.enable: verl then trains each step on all {gen} generated prompts and "
            f"data.train_batch_size sizes nothing. Set data.train_batch_size={gen} (and "
            f"{_GEN}=null), or {_FILTER}.enable=True with {_FILTER}.metric to keep "
            f"{train} prompts a step"
        )
    if not section.enable:
        return
    if not section.metric:
        yield (
            f"{_FILTER}.enable=True needs {_FILTER}.metric: seq_reward, seq_final_reward, or a "
            "column of the reward manager's extra info such as acc or score"
        )
    elif section.metric == SEQ_FINAL_REWARD and config.algorithm.use_kl_in_reward:
        yield (
            f"{_FILTER}.metric={SEQ_FINAL_REWARD} with algorithm.use_kl_in_reward=True: the "
            "final rewards need the reference's log-probs, which are computed after filtering "
            f"(verl's DAPO recipe fails here too); use {_FILTER}.metric={SEQ_REWARD} or set "
            "algorithm.use_kl_in_reward=False"
        )
