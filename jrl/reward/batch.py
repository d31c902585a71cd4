"""`batch` reward manager: the whole batch scored by one call of the reward function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jrl.reward.base import RewardManager, Scored, ScoreFn
from jrl.reward.default import default_compute_score
from jrl.reward.guard import ContainedFunction, RewardFault, checked_score
from jrl.reward.rows import ScoringRows
from jrl.reward.settings import BatchOptions


def score_each(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any]],
    **kwargs: Any,
) -> list[Any]:
    """`default_compute_score` row by row, with the batch signature (the batch default)."""
    return [
        default_compute_score(source, solution, truth, info, **kwargs)
        for source, solution, truth, info in zip(
            data_sources, solution_strs, ground_truths, extra_infos, strict=True
        )
    ]


class BatchRewardManager(RewardManager):
    """Calls ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=,
    **reward_kwargs)`` once; it returns one float or dict (with "score") per row.

    Its options (`BatchOptions`): reward_model.reward_kwargs, passed to every call.
    """

    Options = BatchOptions
    options: BatchOptions

    @staticmethod
    def default_compute_score() -> ScoreFn:
        """`score_each`: the built-in scorers applied row by row."""
        return score_each

    def score(self, rows: ScoringRows) -> list[Scored]:
        """One call for all rows."""
        kwargs = {
            "data_sources": rows.data_sources,
            "solution_strs": rows.responses,
            "ground_truths": rows.ground_truths,
            "extra_infos": rows.extra_infos,
            **self.options.scorer_kwargs,
        }
        if isinstance(self.compute_score, ContainedFunction):
            return self.compute_score.score_batch(kwargs, rows.data_sources)
        try:
            results = list(self.compute_score(**kwargs))
        except Exception as err:
            raise RuntimeError(
                f"the batch reward function {getattr(self.compute_score, '__name__', '')!r} "
                f"failed on a batch of {len(rows)} rows: {type(err).__name__}: {err}"
            ) from err
        if len(results) != len(rows):
            raise ValueError(
                f"the batch reward function returned {len(results)} scores for {len(rows)} rows; "
                "it must return one score (a float or a dict with 'score') per row"
            )
        scores = []
        for row, result in enumerate(results):
            try:
                scores.append(checked_score(result))
            except RewardFault as fault:
                raise RuntimeError(
                    f"the batch reward function's result for row {row} (data_source "
                    f"{rows.data_sources[row]!r}): {fault}"
                ) from fault
        return scores
