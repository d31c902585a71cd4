"""`prime` reward manager: rows scored in parallel worker processes, each under a time limit.

A row whose scorer raises, hangs past the timeout, kills its worker or returns something that is
not a finite number scores 0.0 (`jrl.reward.guard`): its ``reward_fault`` column names the fault,
and it never stalls the call for longer than the timeout.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jrl.reward.base import RewardManager, Scored
from jrl.reward.guard import FAULT_COLUMN, ContainedFunction
from jrl.reward.rows import ScoringRows
from jrl.reward.settings import PrimeOptions

MAX_PROCESSES = 64


def _first_item(value: Any) -> Any:
    """A result as prime reads it: a sequence's first item, anything else as it is."""
    if isinstance(value, Sequence) and not isinstance(value, str | Mapping) and value:
        return value[0]
    return value


class PrimeRewardManager(RewardManager):
    """Calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` (positional)
    for every row in a pool of spawned processes. As verl's, it reports no "acc" beside the
    score, so validation's core metric is ``reward``.

    Its options (`PrimeOptions`, from reward_model.reward_kwargs): `timeout` seconds per row and
    `num_processes` (None or 0: the CPU count, at most 64). The function must be importable in a
    fresh process: a module-level function, or a custom_reward_function file. A custom function's
    on_error applies ("raise" stops at the first fault).
    """

    Options = PrimeOptions
    options: PrimeOptions

    def __init__(self, *args: Any, **kwargs: Any):
        """`RewardManager`'s arguments; starts the pool (which checks that the function can be
        sent to a worker process)."""
        super().__init__(*args, **kwargs)
        fn, on_error = self.compute_score, "zero"
        if isinstance(fn, ContainedFunction):
            fn, on_error = fn.fn, fn.on_error
        workers = self.options.num_processes or min(MAX_PROCESSES, os.cpu_count() or 1)
        self.scorer = ContainedFunction(fn, float(self.options.timeout), int(workers), on_error)
        self.scorer.start()

    def score(self, rows: ScoringRows) -> list[Scored]:
        """All rows through the pool; failures score 0.0."""
        calls = [
            ((source, response, truth, info), {})
            for source, response, truth, info in zip(
                rows.data_sources, rows.responses, rows.ground_truths, rows.extra_infos, strict=True
            )
        ]
        outcomes = self.scorer.outcomes(calls)
        results = []
        for row, outcome in enumerate(outcomes):
            if outcome.ok:
                outcome = dataclasses.replace(outcome, value=_first_item(outcome.value))
            value, info = self.scorer.checked(outcome, row, rows.data_sources[row])
            results.append(Scored(value, {FAULT_COLUMN: info[FAULT_COLUMN]}))
        return results

    def close(self) -> None:
        """Stops the worker processes."""
        self.scorer.close()
