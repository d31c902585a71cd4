"""One-step-off-policy generation: batch t + 1 is generated while batch t trains.

A host thread runs the rollout (the engine's programs go to the rollout's devices only), and the
trainer's programs go to its own devices meanwhile; JAX dispatches both without waiting for the
other. The order per step (verl's one-step-off recipe): take batch t's generation (started the
step before, or now for the first), sync the actor's weights (version t - 1) into the rollout,
start batch t + 1's generation, then train on batch t. So every batch but the first trains on
rows sampled by weights one version old (``training/staleness``: the trainer's version minus
the sampler's).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax

from jrl.batch import Batch
from jrl.parallel.distributed import exchange_on, threads_overlap
from jrl.trainer.overlap.activity import Activity
from jrl.trainer.overlap.snapshots import packed, unpacked


class Generated(NamedTuple):
    """A generated batch and the weights' version that sampled it."""

    batch: Batch
    metrics: dict[str, float]
    version: int


Generate = Callable[[Batch, int], tuple[Batch, dict[str, float]]]  # (prompts, step) -> batch


class OneStepOff:
    """Runs `generate` (prompts, step) -> (batch, metrics) in a thread, one batch ahead, whose
    host exchanges between processes run on the rollout's `devices` (`exchange_on`)."""

    def __init__(self, generate: Generate, devices: Sequence[jax.Device]):
        self._generate = generate
        self.activity = Activity()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="jrl-rollout", initializer=exchange_on, initargs=(devices,)
        )
        self.overlaps = threads_overlap(devices)  # else each generation runs in turn
        if not self.overlaps:
            print(
                "jrl: one-step-off on several CPU processes: the next batch is generated before "
                "the step trains, not during it (the same rows; XLA:CPU's collectives between "
                "processes cannot run from two threads at once)",
                flush=True,
            )
        self._pending: concurrent.futures.Future[Generated] | None = None
        self._pending_step = 0

    def start(self, prompts: Batch, step: int, version: int) -> None:
        """Starts generating `step`'s batch from `prompts` on the rollout's weights (`version`)."""
        if self._pending is not None:
            raise RuntimeError("one-step-off: a generation is already running")

        def run() -> Generated:
            with self.activity.generating():
                batch, metrics = self._generate(prompts, step)
            return Generated(batch, metrics, version)

        if self.overlaps:
            self._pending = self._pool.submit(run)
        else:
            self._pending = concurrent.futures.Future()
            self._pending.set_result(run())
        self._pending_step = step

    @property
    def pending_step(self) -> int:
        """The step whose batch is being generated (0: none)."""
        return self._pending_step if self._pending is not None else 0

    def take(self, step: int) -> Generated:
        """`step`'s generated batch (waits for it)."""
        if self._pending is None or self._pending_step != step:
            raise RuntimeError(f"one-step-off: no generation of step {step} was started")
        done, self._pending = self._pending.result(), None
        return done

    def restore(self, step: int, generated: Generated) -> None:
        """Holds `generated` (from a checkpoint) as `step`'s batch."""
        future: concurrent.futures.Future[Generated] = concurrent.futures.Future()
        future.set_result(generated)
        self._pending, self._pending_step = future, step

    def snapshot(self) -> dict[str, Any] | None:
        """The pending generation, waited for, as JSON-ready data (None: none pending)."""
        if self._pending is None:
            return None
        return {"step": self._pending_step, "generated": packed(tuple(self._pending.result()))}

    @staticmethod
    def unpack(snapshot: dict[str, Any]) -> tuple[int, Generated]:
        """(step, generated) of a `snapshot`."""
        batch, metrics, version = unpacked(snapshot["generated"])
        return int(snapshot["step"]), Generated(batch, metrics, version)

    def wait(self) -> None:
        """Waits for the pending generation (kept for `take`)."""
        if self._pending is not None:
            self._pending.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class Lookahead:
    """An iterator whose next item can be seen before it is taken (`peek`); `position` is
    `where()` (the source's position) as of the last item taken, whatever was peeked since."""

    _END = object()

    def __init__(self, items: Iterator[Any], where: Callable[[], Any]):
        self._items, self._where = items, where
        self._next: Any = self._END
        self._fetched = False
        self.position = where()

    def __iter__(self) -> Lookahead:
        return self

    def __next__(self) -> Any:
        self.peek()
        self._fetched = False
        self.position = self._where()
        if self._next is self._END:
            raise StopIteration
        return self._next

    def peek(self) -> Any | None:
        """The next item without taking it; None at the end."""
        if not self._fetched:
            self._next = next(self._items, self._END)
            self._fetched = True
        return None if self._next is self._END else self._next
