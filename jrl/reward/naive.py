"""`naive` reward manager: rows scored one by one (a user's function in worker processes)."""

from __future__ import annotations

from jrl.reward.base import RewardManager, Scored, score_calls
from jrl.reward.rows import ScoringRows


class NaiveRewardManager(RewardManager):
    """Calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` per row;
    the result is a float, or a dict with "score" whose keys are all reported per row."""

    def score(self, rows: ScoringRows) -> list[Scored]:
        """One call of compute_score per row, in order."""
        return score_calls(self.compute_score, rows.keyword_calls(), rows.data_sources)
