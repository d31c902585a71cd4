"""`prime` reward manager: rows scored in parallel worker processes, each under a time limit.

A row whose scorer raises, hangs past the timeout or kills its worker scores 0.0; it is counted
in reward_extra_info ("reward_error", "reward_timeout") and reported, and never stalls the call
for longer than the timeout.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

from jrl.reward.base import RewardManager, Scored, ScoreFn
from jrl.reward.pool import Outcome, ScoringPool
from jrl.reward.rows import ScoringRows

DEFAULT_TIMEOUT_S = 300.0
MAX_PROCESSES = 64


def _as_float(value: Any) -> float:
    """A worker's result as a number: a number, a dict's "score", or a sequence's first item."""
    if isinstance(value, Mapping):
        return float(value["score"])
    if isinstance(value, list | tuple):
        return float(value[0])
    return float(value)


class PrimeRewardManager(RewardManager):
    """Calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` (positional)
    for every row in a pool of spawned processes; each row's score is also reported as "acc".

    Options (reward_model.reward_kwargs): `timeout` seconds per row (default 300) and
    `num_processes` (default: the CPU count, at most 64). The function must be importable in a
    fresh process: a module-level function, or a custom_reward_function file.
    """

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: ScoreFn | None = None,
        reward_fn_key: str = "data_source",
        timeout: float = DEFAULT_TIMEOUT_S,
        num_processes: int | None = None,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        workers = num_processes or min(MAX_PROCESSES, os.cpu_count() or 1)
        self.pool = ScoringPool(self.compute_score, int(workers), float(timeout))

    def score(self, rows: ScoringRows) -> list[Scored]:
        """All rows through the pool; failures score 0.0."""
        items = [
            (rows.data_sources[i], rows.responses[i], rows.ground_truths[i], rows.extra_infos[i])
            for i in range(len(rows))
        ]
        outcomes = self.pool.map(items)
        results = [self._scored(outcome) for outcome in outcomes]
        failed = Counter(o.status for o in outcomes if not o.ok)
        if failed:
            first = next(o for o in outcomes if not o.ok)
            print(
                f"jrl: prime reward manager: {sum(failed.values())} of {len(rows)} rows scored "
                f"0.0 ({dict(failed)}); first: {first.message}",
                flush=True,
            )
        return results

    @staticmethod
    def _scored(outcome: Outcome) -> Scored:
        value = 0.0
        status = outcome.status
        if outcome.ok:
            try:
                value = _as_float(outcome.value)
            except (KeyError, IndexError, TypeError, ValueError):
                status = "error"
        info = {
            "acc": value,
            "reward_error": status in ("error", "crashed"),
            "reward_timeout": status == "timeout",
        }
        return Scored(value, info)

    def close(self) -> None:
        """Stops the worker processes."""
        self.pool.close()
