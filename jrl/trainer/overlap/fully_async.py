"""Fully-async training (verl's ``async_training.*``): a rollouter streams finished prompt groups
into a bounded queue while the trainer takes them.

The rollouter is a host thread that owns a turn session of the JAX sampler
(`jrl.rollout.session.TurnSession`): every response row gets a slot as slots free, decodes 16
tokens per session step, and leaves as soon as it ends, so a group (a prompt's n rows) is queued
the moment its last row ends, while the other rows go on. A row is one turn (`SingleTurns`), or,
with agent loops, a trajectory whose loop asks its turns and runs its tools between session steps
(`jrl.agent.streamed.StreamedLoops`), and ends when its loop returns. Freshness is bounded in
groups per weight version: between two syncs the rollouter starts at most

    cap = floor((1 + staleness_threshold) * trigger_parameter_sync_step * require_batches
                * ppo_mini_batch_size)

groups, the groups still queued or running at a sync counting against the next version's cap
(verl's ``num_staleness_sample``), and the groups DAPO's filter dropped giving their place back
(`refund`). ``staleness_threshold=0`` makes it produce exactly what the
trainer takes before its next sync, so the run does not depend on timing.

At a sync the trainer asks the rollouter to pause between two session steps: with
``partial_rollout`` at once, its running rows keeping their tokens and keys and values and going
on with the new weights (each token records the version that sampled it,
``rollout_token_versions``); without, after its running rows end (no new row starts meanwhile;
an agent row's tools go on in their threads while paused).
A checkpoint drains the rollouter the same way (no running rows) and holds the queue, the next
group's number, the prompts the rollouter took but did not start and its counters, so that a
resumed run goes on from the same state.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from jrl.batch import Batch
from jrl.parallel.distributed import exchange_on, gather_batch, threads_overlap
from jrl.rollout.layout import rollout_batch
from jrl.rollout.session import EndedTurn, TurnSession
from jrl.trainer.loop.stopping import DataExhausted
from jrl.trainer.overlap.activity import Activity
from jrl.trainer.overlap.versions import VERSIONS, token_versions


class _Row(NamedTuple):
    group: int
    prompt: Batch  # the prompt's row (one row, meta included)


class Rows(Protocol):
    """How the rollouter's rows run in its session: `start` a row on its prompt; `prepare` the
    session's next step (ask the rows' turns; the rows that ended outside a step, their slots
    freed); a turn `ended` (True: its row is finished, the rollouter frees its slot);
    `pending` work outside the session; a group's finished rows as a `batch` (verl's layout)."""

    def start(self, row: int, prompt: Batch) -> None: ...

    @property
    def pending(self) -> bool: ...

    def prepare(self, session: TurnSession) -> list[int]: ...

    def ended(self, turn: EndedTurn) -> bool: ...

    def batch(self, prompt: Batch, rows: Sequence[int]) -> Batch: ...

    def close(self) -> None: ...


class SingleTurns:
    """Rows of one turn each: the prompt's tokens, then up to `response_length` tokens (padded
    with `pad_token_id` in the batch)."""

    def __init__(self, response_length: int, pad_token_id: int):
        self.response_length, self.pad_token_id = response_length, pad_token_id
        self._asks: list[tuple[int, np.ndarray]] = []
        self._ended: dict[int, EndedTurn] = {}

    def start(self, row: int, prompt: Batch) -> None:
        mask = np.asarray(prompt.tensors["attention_mask"][0]).astype(bool)
        self._asks.append((row, np.asarray(prompt.tensors["input_ids"][0])[mask]))

    @property
    def pending(self) -> bool:
        return bool(self._asks)

    def prepare(self, session: TurnSession) -> list[int]:
        for row, ids in self._asks:
            session.ask(row, ids, self.response_length)
        self._asks.clear()
        return []

    def ended(self, turn: EndedTurn) -> bool:
        self._ended[turn.row] = turn
        return True

    def batch(self, prompt: Batch, rows: Sequence[int]) -> Batch:
        width = self.response_length
        responses = np.full((len(rows), width), self.pad_token_id, np.int32)
        mask = np.zeros((len(rows), width), np.int32)
        log_probs = np.zeros((len(rows), width), np.float32)
        for i, row in enumerate(rows):
            turn = self._ended.pop(row)
            count = len(turn.token_ids)
            responses[i, :count], mask[i, :count] = turn.token_ids, 1
            log_probs[i, :count] = turn.log_probs
        return rollout_batch(prompt.repeat(len(rows)), responses, mask, log_probs).to_numpy()

    def close(self) -> None:
        pass


def group_cap(staleness: float, trigger: int, step_prompts: int) -> int:
    """Groups the rollouter may start per weight version (module docstring; `step_prompts`:
    ``require_batches * ppo_mini_batch_size``), multiplied in verl's order, so that the float
    product rounds down to verl's count."""
    return math.floor(step_prompts * (staleness + 1) * trigger)


class Rollouter:
    """Streams groups of `n` `rows` for the prompts of `prompts` ((epoch, batch) items) from
    `open_session(rows)`'s session, at most `cap` groups per weight version; host exchanges run
    on `devices`."""

    def __init__(
        self,
        open_session: Callable[[int], TurnSession],
        prompts: Iterator[tuple[int, Batch]],
        rows: Rows,
        *,
        n: int,
        cap: int,
        partial: bool,
        devices: Sequence[jax.Device],
    ):
        self._open_session, self._prompts, self.rows = open_session, prompts, rows
        self.n, self.cap, self.partial = n, cap, partial
        self._devices = devices
        self._cond = threading.Condition()
        self._queue: collections.deque[Batch] = collections.deque()  # finished groups
        # prompts taken from the stream and not started yet, with their epochs
        self._waiting: collections.deque[tuple[int, Batch]] = collections.deque()
        self._rows: dict[int, _Row] = {}
        # each started row's token versions: its ended turns', then its running turn's
        self._versions: dict[int, tuple[list[int], list[int]]] = {}
        self._done: dict[int, list[int]] = collections.defaultdict(list)  # group -> ended rows
        self.version = 0
        self.started = 0  # groups started in this version (stale ones carried over included)
        self.next_group = 0
        self.epoch = 0
        self._exhausted = False
        self._pause_wanted = False
        self._drain = False
        self._paused = False
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.activity = Activity()
        self._session: TurnSession | None = None
        # where threads cannot overlap, the trainer's thread drives the rollouter between steps
        self.overlaps = threads_overlap(devices)

    # -- the trainer's side ---------------------------------------------------------------------
    def start(self) -> None:
        """Starts the rollouter's thread (where it `overlaps`)."""
        if self.overlaps:
            self._thread = threading.Thread(target=self._run, name="jrl-rollouter", daemon=True)
            self._thread.start()

    def take(self, groups: int) -> list[Batch]:
        """The next `groups` finished groups, each a prompt's n rows in verl's rollout layout
        with ``uid`` and per-token versions (waits for them); DataExhausted when the data ends
        first."""
        with self._cond:
            while len(self._queue) < groups:
                self._raise_error()
                if self._exhausted and not self._rows and not self._waiting:
                    raise DataExhausted(
                        f"the rollouter has {len(self._queue)} finished groups left, fewer "
                        f"than the {groups} of a step"
                    )
                starved = self.started >= self.cap and not self._rows
                if (starved and self.overlaps) or (not self.overlaps and not self._turn()):
                    raise RuntimeError(
                        f"the rollouter may start no group before the next sync (its "
                        f"{self.cap} of this version have started), and the step needs "
                        f"{groups - len(self._queue)} more"
                    )
                if self.overlaps:
                    self._cond.wait(0.05)
            taken = [self._queue.popleft() for _ in range(groups)]
            self._cond.notify_all()
            return taken

    def pause(self, drain: bool) -> None:
        """Waits until the rollouter stops between two session steps: at once (`drain` False
        and partial rollouts), else once every row it started has ended."""
        with self._cond:
            self._pause_wanted, self._drain = True, drain or not self.partial
            self._cond.notify_all()
            while not self.overlaps and self._drain and self._rows:
                self._step(self.session)  # (an agent row's tools waited for, at most briefly)
            self._paused = self._paused or not self.overlaps
            while not self._paused:
                self._raise_error()
                self._cond.wait(0.05)

    def resume(self, version: int | None = None, *, new_cap: bool = True) -> None:
        """Goes on after `pause`; with `version`, the weights were synced to it, and where
        `new_cap` a new version's cap starts, the groups still queued or running counting
        against it (else the groups started since the trainer's last sync still count: a sync
        for validation between two of the trainer's lets no more groups start)."""
        with self._cond:
            if version is not None:
                self.version = version
                if new_cap:
                    self.started = len(self._queue) + len({r.group for r in self._rows.values()})
            self._pause_wanted = self._paused = False
            self._cond.notify_all()

    def refund(self, groups: int) -> None:
        """`groups` the trainer took and dropped (DAPO's filter) give their place under this
        version's cap back: as many fresh prompts may start (current verl's refill)."""
        with self._cond:
            self.started -= groups
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self.rows.close()

    def snapshot(self) -> dict[str, Any]:
        """The paused, drained rollouter's state: the queue, the prompts taken but not started,
        its counters."""
        if self._rows:
            raise RuntimeError("the rollouter must be drained before a snapshot")
        return {
            "queue": list(self._queue),
            "waiting": list(self._waiting),
            "version": self.version,
            "started": self.started,
            "next_group": self.next_group,
            "epoch": self.epoch,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """The state of a `snapshot` (before `start`)."""
        self._queue.extend(state["queue"])
        self._waiting.extend(state["waiting"])
        self.version, self.started = state["version"], state["started"]
        self.next_group, self.epoch = state["next_group"], state["epoch"]

    @property
    def queued(self) -> int:
        """Finished groups waiting for the trainer."""
        return len(self._queue)

    def advance(self) -> bool:
        """One round of the rollouter's loop in the caller's thread (one that does not
        `overlaps`): start groups the cap allows, then one session step; False: nothing to do."""
        with self._cond:
            return self._turn()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("the rollouter failed") from self._error

    # -- the rollouter's thread -----------------------------------------------------------------
    @property
    def session(self) -> TurnSession:
        """The sampler's session, opened on first use (by the thread that steps it)."""
        if self._session is None:
            self._session = self._open_session(self.cap * self.n)
        return self._session

    def _run(self) -> None:
        exchange_on(self._devices)
        try:
            while self._turn():
                pass
        except BaseException as error:  # noqa: BLE001 - handed to the trainer's thread
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _turn(self) -> bool:
        """One round of the loop: pause, start groups, or run a session step. False: the thread
        ends (stopped), or, driven by the trainer, nothing was left to do."""
        session = self.session
        with self._cond:
            if self._stop:
                return False
            if self.overlaps and self._pause_wanted and not (self._drain and self._rows):
                self._paused = True
                self._cond.notify_all()
                while self._paused and not self._stop:
                    self._cond.wait()
                return not self._stop
            if not self._pause_wanted:
                self._start_groups()
            if not session.ready and not self.rows.pending:
                if self.overlaps:
                    self._cond.wait(0.05)
                return self.overlaps
        self._step(session)
        return True

    def _start_groups(self) -> None:
        """Starts groups while the version's cap allows (called holding the lock)."""
        while self.started < self.cap:
            prompt = self._next_prompt()
            if prompt is None:
                return
            epoch, row = prompt
            self.epoch = epoch
            group = self.next_group
            self.next_group += 1
            self.started += 1
            for j in range(self.n):
                row_id = group * self.n + j
                self._rows[row_id] = _Row(group, row)
                self._versions[row_id] = ([], [])
                self.rows.start(row_id, row)

    def _next_prompt(self) -> tuple[int, Batch] | None:
        if not self._waiting and not self._exhausted:
            item = next(self._prompts, None)
            if item is None:
                self._exhausted = True
            else:
                epoch, local = item
                batch = gather_batch(local)  # every process's rows
                self._waiting.extend((epoch, batch.take([i])) for i in range(len(batch)))
        return self._waiting.popleft() if self._waiting else None

    def _step(self, session: TurnSession) -> None:
        """The rows' turns asked, then a session step where it has work; groups whose rows all
        finished go to the queue."""
        version = self.version  # fixed while the thread steps: a sync pauses it first
        finished = self.rows.prepare(session)
        if session.ready:
            with self.activity.generating():
                ended = session.step()
            counts = session.sampled()
            counts.update({turn.row: len(turn.token_ids) for turn in ended})
            for row, count in counts.items():
                running = self._versions[row][1]
                running.extend([version] * (count - len(running)))
            for turn in ended:
                done, running = self._versions[turn.row]
                done.extend(running[: len(turn.token_ids)])
                running.clear()
                if self.rows.ended(turn):
                    session.release(turn.row)
                    finished.append(turn.row)
        groups = []
        for row in finished:
            group = self._rows[row].group
            self._done[group].append(row)
            if len(self._done[group]) == self.n:
                groups.append(group)
        if groups:
            batches = [self._group(g) for g in sorted(groups)]
            with self._cond:  # a group's rows leave as it joins the queue (`take` reads both)
                for group in groups:
                    for row in range(group * self.n, (group + 1) * self.n):
                        del self._rows[row]
                self._queue.extend(batches)
                self._cond.notify_all()

    def _group(self, group: int) -> Batch:
        rows = sorted(self._done.pop(group))
        batch = self.rows.batch(self._rows[rows[0]].prompt, rows)
        versions = token_versions(
            np.asarray(batch.tensors["response_mask"]),
            [self._versions.pop(row)[0] for row in rows],
        )
        uids = np.full(len(rows), f"g{group}", dtype=object)
        return batch.union(Batch({VERSIONS: versions}, {"uid": uids}))
