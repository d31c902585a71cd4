"""When the rollout generated, to measure how much of the trainer's work it overlapped."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class Activity:
    """Wall-clock spans (`time.perf_counter`) of the rollout's generation, recorded by the thread
    that generates (`generating`) and read by the trainer's (`during`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[float, float]] = []
        self._since: float | None = None  # a span still running

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        start = time.perf_counter()
        with self._lock:
            self._since = start
        try:
            yield
        finally:
            with self._lock:
                self._spans.append((start, time.perf_counter()))
                self._since = None

    def during(self, start: float, end: float) -> float:
        """Seconds of generation within [`start`, `end`]; spans that ended before `start` are
        forgotten (the trainer asks about ever later windows)."""
        with self._lock:
            spans = list(self._spans)
            if self._since is not None:
                spans.append((self._since, end))
            self._spans = [s for s in self._spans if s[1] > start]
        return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


def overlap_metrics(activity: Activity, busy_from: float) -> dict[str, float]:
    """The trainer's work since `busy_from` (after it waited for rows) and the rollout's
    generation during it: ``overlap/fraction`` of the trainer's time the rollout generated."""
    end = time.perf_counter()
    busy = end - busy_from
    generating = activity.during(busy_from, end)
    return {
        "overlap/trainer_busy_s": busy,
        "overlap/rollout_generating_s": generating,
        "overlap/fraction": generating / busy if busy > 0 else 0.0,
    }
