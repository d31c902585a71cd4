"""`ScoringPool`: one function run over many items in spawned worker processes, each item under
a time limit.

A worker whose item runs past the limit is killed (and replaced when items are still waiting);
an item that raises, or whose worker dies, fails alone. So no item can hold up the caller for
longer than the limit. The workers start with the pool and serve every later `map` call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import pickle
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection, util
from typing import Any

_START_LIMIT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One item's result: status "ok" (with its value), "error", "timeout" or "crashed"."""

    status: str
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _serve(conn: connection.Connection, fn: Callable[..., Any]) -> None:
    """Worker loop: answer each argument tuple with ("ok", fn(*args)) or ("error", message)."""
    conn.send(("ready", None))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        if args is None:
            return
        try:
            reply = ("ok", fn(*args))
        except Exception as err:
            reply = ("error", f"{type(err).__name__}: {err}")
        try:
            conn.send(reply)
        except Exception as err:
            conn.send(("error", f"the result cannot be sent back: {err}"))


@contextlib.contextmanager
def _main_module_hidden(fn: Callable[..., Any]) -> Iterator[None]:
    """While a worker starts: a bare ``__main__``, unless `fn` pickles by reference into it.

    A spawned process otherwise imports the parent's main module first (``python -m jrl.train``
    is JAX, Flax and the whole trainer: seconds per worker, paid again for every worker that a
    timeout replaces); the scoring function does not need it.
    """
    main = sys.modules["__main__"]
    try:
        needed = b"__main__" in pickle.dumps(fn)
    except Exception:
        needed = True  # the start itself reports the pickling error
    if needed:
        yield
        return
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _Worker:
    """A worker process, its pipe, and the item it is running (with that item's deadline)."""

    def __init__(self, context: Any, fn: Callable[..., Any]):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, fn), name="jrl-reward-worker")
        try:
            with _main_module_hidden(fn):
                self.process.start()
        except Exception as err:
            raise TypeError(
                f"the reward function {fn!r} cannot be sent to a worker process ({err}); it must "
                "be a module-level function (or a custom_reward_function file)"
            ) from err
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.item: int | None = None
        self.deadline = 0.0

    def stop(self, kill: bool = False) -> None:
        """Ends the process: asks an idle worker to exit, kills it if `kill` or if it stays."""
        if not kill and self.ready and self.item is None and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()
    workers.clear()


class ScoringPool:
    """`num_workers` spawned processes calling `fn(*item)`, at most `timeout` seconds per item
    (positive: `PrimeOptions` checks it)."""

    def __init__(self, fn: Callable[..., Any], num_workers: int, timeout: float):
        if num_workers < 1:
            raise ValueError(f"a scoring pool needs at least one worker, got {num_workers}")
        self.fn = fn
        self.num_workers = num_workers
        self.timeout = float(timeout)
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._finalizer = util.Finalize(self, _stop_all, args=(self._workers,), exitpriority=10)
        self._closed = False
        self._spawn(num_workers)

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            self._workers.append(_Worker(self._context, self.fn))

    def map(self, items: Sequence[tuple[Any, ...]]) -> list[Outcome]:
        """`fn(*item)` for every item, in order; a failed item's outcome says why."""
        if self._closed:
            raise RuntimeError("this scoring pool is closed")
        outcomes: list[Outcome | None] = [None] * len(items)
        waiting = deque(range(len(items)))
        while waiting or any(w.item is not None for w in self._workers):
            free = [w for w in self._workers if w.item is None]
            self._spawn(min(len(waiting) - len(free), self.num_workers - len(self._workers)))
            for worker in [w for w in self._workers if w.ready and w.item is None]:
                if waiting:
                    self._dispatch(worker, waiting, items)
            self._wait()
            self._collect(outcomes)
        return outcomes

    def _dispatch(self, worker: _Worker, waiting: deque[int], items: Sequence[tuple]) -> None:
        """Sends the next waiting item to an idle worker (one found dead leaves the pool)."""
        index = waiting.popleft()
        try:
            worker.conn.send(items[index])
        except OSError:
            waiting.appendleft(index)
            worker.stop(kill=True)
            self._workers.remove(worker)
            return
        worker.item = index
        worker.deadline = time.monotonic() + self.timeout

    def _wait(self) -> None:
        """Blocks until a worker answers or dies, or the nearest deadline passes."""
        active = [w for w in self._workers if not w.ready or w.item is not None]
        if not active:
            return
        deadlines = [w.deadline if w.ready else w.started + _START_LIMIT_S for w in active]
        limit = max(0.0, min(deadlines) - time.monotonic())
        handles = [w.conn for w in active] + [w.process.sentinel for w in active]
        connection.wait(handles, timeout=limit)

    def _collect(self, outcomes: list[Outcome | None]) -> None:
        """Records answers, deaths and timeouts; dead and killed workers leave the pool."""
        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.ready:
                self._check_start(worker, now)
                continue
            if worker.item is None:
                continue
            outcome = None
            if worker.conn.poll():
                try:
                    status, value = worker.conn.recv()
                    outcome = (
                        Outcome("ok", value) if status == "ok" else Outcome(status, None, value)
                    )
                except (EOFError, OSError):
                    outcome = self._crashed(worker)
            elif not worker.process.is_alive():
                outcome = self._crashed(worker)
            elif now >= worker.deadline:
                outcome = Outcome("timeout", message=f"no result within {self.timeout:g} s")
            if outcome is None:
                continue
            outcomes[worker.item] = outcome
            worker.item = None
            if outcome.status in ("timeout", "crashed"):
                worker.stop(kill=True)
                self._workers.remove(worker)

    def _check_start(self, worker: _Worker, now: float) -> None:
        if worker.conn.poll():
            try:
                worker.ready = worker.conn.recv()[0] == "ready"
            except (EOFError, OSError):
                pass
            if worker.ready:
                return
        if not worker.process.is_alive() or now - worker.started > _START_LIMIT_S:
            exit_code = worker.process.exitcode
            worker.stop(kill=True)
            self._workers.remove(worker)
            raise RuntimeError(
                f"a reward worker process failed to start (exit code {exit_code}; its error is "
                f"printed above). The reward function {self.fn!r} must load in a fresh Python "
                "process: define it at module level in an importable module or file"
            )

    @staticmethod
    def _crashed(worker: _Worker) -> Outcome:
        worker.process.join(1.0)
        return Outcome("crashed", message=f"the worker died (exit code {worker.process.exitcode})")

    def close(self) -> None:
        """Stops every worker; the pool cannot be used afterwards."""
        self._closed = True
        self._finalizer()
