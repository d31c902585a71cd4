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

from jrl.reward.base import RewardManager, Scored
from jrl.reward.pool import Outcome, ScoringPool
from jrl.reward.rows import ScoringRows
from jrl.reward.settings import PrimeOptions

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

    Its options (`PrimeOptions`, from reward_model.reward_kwargs): `timeout` seconds per row and
    `num_processes` (None or 0: the CPU count, at most 64). The function must be importable in a
    fresh process: a module-level function, or a custom_reward_function file.
    """

    Options = PrimeOptions
    options: PrimeOptions

    def __init__(self, *args: Any, **kwargs: Any):
        """`RewardManager`'s arguments; starts the pool (which checks that the function can be
        sent to a worker process)."""
        super().__init__(*args, **kwargs)
        workers = self.options.num_processes or min(MAX_PROCESSES, os.cpu_count() or 1)
        self.pool = ScoringPool(self.compute_score, int(workers), float(self.options.timeout))

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
