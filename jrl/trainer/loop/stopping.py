"""Stopping a run cleanly: SIGINT/SIGTERM end it after the current step, a non-finite loss
ends it before anything of that step is saved, and a step that runs out of data ends it after
the step before (`DataExhausted`)."""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class NonFiniteLossError(RuntimeError):
    """A loss metric became NaN or infinite."""


class DataExhausted(Exception):
    """The data ran out before a step had its batch (DAPO's dynamic sampling draws a variable
    number of loader batches a step): the run ends after the last complete step, as verl's."""


class StopRequest:
    """Context manager that turns SIGINT/SIGTERM into a flag the loop checks between steps.

    The step in progress finishes; a second signal aborts at once (KeyboardInterrupt). Outside
    the main thread (where Python cannot install handlers) it never fires.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived."""
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborting")
        self.signal_name = signal.Signals(signum).name
        print(
            f"jrl: {self.signal_name} received: finishing this step, saving a checkpoint, then "
            "stopping (send it again to abort at once)",
            flush=True,
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def check_losses_finite(
    metrics: dict[str, float], step: int, last_checkpoint: Callable[[], str]
) -> None:
    """Raises NonFiniteLossError naming the step, the metric and ``last_checkpoint()`` (called
    only then) when a loss is NaN or infinite."""
    bad = [k for k, v in metrics.items() if "loss" in k and not math.isfinite(float(v))]
    if bad:
        raise NonFiniteLossError(
            f"step {step}: {', '.join(f'{k}={metrics[k]}' for k in bad)} is not finite; "
            f"training stopped before saving this step. Last good checkpoint: "
            f"{last_checkpoint()}. "
            "Lower the learning rate or check the data, then resume"
        )
