"""`naive` reward manager: rows scored one by one in this process."""

from __future__ import annotations

from jrl.reward.base import RewardManager, Scored, call_scorer, scored
from jrl.reward.rows import ScoringRows


class NaiveRewardManager(RewardManager):
    """Calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` per row;
    the result is a float, or a dict with "score" whose keys are all reported per row."""

    def score(self, rows: ScoringRows) -> list[Scored]:
        """One call of compute_score per row, in order."""
        results = []
        for i, source in enumerate(rows.data_sources):
            result = call_scorer(
                self.compute_score,
                i,
                data_source=source,
                solution_str=rows.responses[i],
                ground_truth=rows.ground_truths[i],
                extra_info=rows.extra_infos[i],
            )
            results.append(scored(result, i, source))
        return results
