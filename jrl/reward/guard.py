"""Containment of user reward functions: each call in a worker process under a time limit, and
every result checked before it can become a reward.

A call that raises, runs past the limit, kills its worker, or returns NaN, inf or something that
is not a number is a *fault*. Under ``on_error="zero"`` (the default) the row scores 0.0, its
``reward_fault`` column names the fault, the first fault of each kind is printed with the
function, the row and the error, and the run goes on; ``on_error="raise"`` stops the run at the
first fault instead (verl's strictness).

Why 0 and not dropping the row: a fault says nothing about the response, but dropping would
change GRPO's group sizes and the batch's shape from step to step; 0 is what verl's prime manager
gives a timed-out row, and the fault count makes every such row visible.
"""

from __future__ import annotations

import math
import numbers
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jrl.reward.pool import Outcome, ScoringPool
from jrl.reward.settings import CustomRewardFunction

# Each fault kind and its step metric (counts of rows); one home for both.
FAULT_METRICS: Mapping[str, str] = {
    "error": "reward/errors",
    "timeout": "reward/timeouts",
    "crashed": "reward/crashes",
    "non_finite": "reward/non_finite",
    "non_number": "reward/non_numbers",
}
FAULT_COLUMN = "reward_fault"
# One call of a scoring function: its positional and its keyword arguments.
Call = tuple[tuple[Any, ...], Mapping[str, Any]]
# Workers of a contained function when custom_reward_function.num_workers is not set.
DEFAULT_WORKERS = 4
_SHOWN = 120


class RewardFault(ValueError):
    """A result that cannot be a reward: `kind` is a key of `FAULT_METRICS`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Scored(NamedTuple):
    """One row's reward and the extra values reported for it (reward_extra_info)."""

    value: float
    info: Mapping[str, Any]


def _number(value: Any, what: str) -> float:
    """`value` as a finite float; RewardFault otherwise (strings are not numbers here)."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if not isinstance(value, numbers.Real):
        shown = repr(value)
        shown = shown if len(shown) <= _SHOWN else f"{shown[:_SHOWN]}... ({len(shown)} chars)"
        kind = type(value).__name__
        raise RewardFault("non_number", f"{what} is a {kind}, not a number: {shown}")
    number = float(value)
    if not math.isfinite(number):
        raise RewardFault("non_finite", f"{what} is {number}")
    return number


def checked_score(result: Any) -> Scored:
    """A scorer's result as `Scored`: a finite number, or a dict whose "score" is one (all its
    keys are reported). Anything else raises RewardFault."""
    if isinstance(result, Mapping):
        if "score" not in result:
            keys = sorted(map(str, result))[:10]
            raise RewardFault("non_number", f"the result is a dict without 'score' (keys {keys})")
        return Scored(_number(result["score"], "its 'score'"), dict(result))
    return Scored(_number(result, "the result"), {})


class _Invoke:
    """``fn(*args, **kwargs)`` for one ``(args, kwargs)`` item (what a pool worker runs)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self.fn)


class ContainedFunction:
    """A user's reward function run in `num_workers` spawned processes, `timeout` seconds per
    call, with `on_error` ("zero" or "raise") deciding what a fault does.

    The workers start at the first call. Called directly (as a user's reward manager or
    ``jrl.evaluate`` calls it), it returns the function's result, or 0.0 for a fault.
    """

    def __init__(
        self, fn: Callable[..., Any], timeout: float, num_workers: int, on_error: str = "zero"
    ):
        self.fn = fn
        self.timeout = timeout
        self.num_workers = num_workers
        self.on_error = on_error
        self.faults: Counter[str] = Counter()
        self._pool: ScoringPool | None = None

    @classmethod
    def of(cls, fn: Callable[..., Any], settings: CustomRewardFunction) -> ContainedFunction:
        """`fn` under the limits of custom_reward_function `settings`."""
        workers = settings.num_workers or min(DEFAULT_WORKERS, os.cpu_count() or 1)
        return cls(fn, settings.timeout, workers, settings.on_error)

    @property
    def name(self) -> str:
        """The function's name and where it comes from, for messages."""
        where = getattr(self.fn, "location", None)
        name = getattr(self.fn, "name", None) or getattr(self.fn, "__name__", repr(self.fn))
        return f"{name!r}" + (f" ({where})" if where else "")

    def outcomes(self, calls: Sequence[Call]) -> list[Outcome]:
        """The raw outcome of ``fn(*args, **kwargs)`` for every call, in order."""
        return self.start().map(list(calls))

    def start(self) -> ScoringPool:
        """The worker pool, started on the first call (a function that cannot be sent to a
        worker process raises TypeError here)."""
        if self._pool is None:
            self._pool = ScoringPool(_Invoke(self.fn), self.num_workers, self.timeout)
        return self._pool

    def score_rows(self, calls: Sequence[Call], sources: Sequence[Any]) -> list[Scored]:
        """One `Scored` per call (row); a fault scores 0.0 (or raises, under "raise")."""
        return [
            self.checked(outcome, row, sources[row])
            for row, outcome in enumerate(self.outcomes(calls))
        ]

    def score_batch(self, kwargs: Mapping[str, Any], sources: Sequence[Any]) -> list[Scored]:
        """One call scoring all rows (the `batch` manager's contract: one result per row); a
        fault of the call is a fault of every row."""
        (outcome,) = self.outcomes([((), kwargs)])
        results = outcome.value
        if outcome.ok and not (isinstance(results, Sequence) and len(results) == len(sources)):
            count = len(results) if isinstance(results, Sequence) else type(results).__name__
            message = f"returned {count} for {len(sources)} rows; it must return one per row"
            outcome = Outcome("error", message=message)
        if not outcome.ok:
            return [self.checked(outcome, row, source) for row, source in enumerate(sources)]
        return [
            self.checked(Outcome("ok", result), row, source)
            for row, (result, source) in enumerate(zip(results, sources, strict=True))
        ]

    def checked(self, outcome: Outcome, row: int, source: Any) -> Scored:
        """Row `row`'s `Scored` from its outcome, with its ``reward_fault`` column ("" when
        none)."""
        try:
            if not outcome.ok:
                raise RewardFault(outcome.status, outcome.message)
            value, info = checked_score(outcome.value)
        except RewardFault as fault:
            return self.fault(fault, row, source)
        return Scored(value, {**info, FAULT_COLUMN: ""})

    def fault(self, fault: RewardFault, row: int, source: Any) -> Scored:
        """Counts `fault`, prints the first of its kind; row `row` scores 0.0 (or raises)."""
        where = f"row {row} (data_source {source!r})"
        if self.on_error == "raise":
            raise RuntimeError(
                f"the reward function {self.name} failed on {where}: {fault.kind}: {fault} "
                "(custom_reward_function.on_error=raise; 'zero' scores such rows 0 and goes on)"
            )
        if not self.faults[fault.kind]:
            print(
                f"jrl: reward function {self.name}: {fault.kind} on {where}: {fault}; the row "
                f"scores 0 and is counted in {FAULT_METRICS[fault.kind]} (first {fault.kind}; "
                "custom_reward_function.on_error=raise stops the run instead)",
                flush=True,
            )
        self.faults[fault.kind] += 1
        return Scored(0.0, {FAULT_COLUMN: fault.kind})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (outcome,) = self.outcomes([(args, kwargs)])
        scored = self.checked(outcome, 0, kwargs.get("data_source"))
        return outcome.value if not scored.info[FAULT_COLUMN] else 0.0

    def close(self) -> None:
        """Stops the worker processes, if they were started; a later call raises."""
        if self._pool is not None:
            self._pool.close()


def finite_rewards(reward: dict[str, Any], manager: Any) -> dict[str, Any]:
    """`reward` (a manager's ``{"reward_tensor", "reward_extra_info"}``) with every row whose
    token scores are not all finite scored 0 and marked "non_finite" in its ``reward_fault``
    column; printed once per call, naming the `manager` and the first such row. (A user's
    manager class returns its tensor whole, so it is checked here, before any loss sees it.)"""
    tensor = np.asarray(reward["reward_tensor"], np.float32)
    bad = ~np.isfinite(tensor).all(axis=-1)
    if not bad.any():
        return reward
    rows = np.flatnonzero(bad)
    print(
        f"jrl: the reward manager {type(manager).__name__} gave {len(rows)} rows non-finite "
        f"scores (first: row {rows[0]}); they score 0 and are counted in reward/non_finite",
        flush=True,
    )
    info = dict(reward["reward_extra_info"])
    column = list(info.get(FAULT_COLUMN) or [""] * len(tensor))
    for row in rows:
        column[row] = "non_finite"
    info[FAULT_COLUMN] = column
    return {"reward_tensor": np.where(bad[:, None], 0.0, tensor), "reward_extra_info": info}


def fault_metrics(extra_info: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Counts of faulted rows per kind (`FAULT_METRICS`) from a reward's ``reward_fault``
    column; empty when the reward was not contained."""
    column = extra_info.get(FAULT_COLUMN)
    if column is None:
        return {}
    counts = Counter(kind for kind in column if kind)
    return {metric: float(counts[kind]) for kind, metric in FAULT_METRICS.items()}
