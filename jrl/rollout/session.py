"""`TurnSession`: the host side of a multi-turn rollout's slots (`jrl.rollout.session_programs`).

A row keeps its slot from its first turn in the session to the end of its trajectory
(`release`), waiting tools included. Each `step` admits the turns asked since the last one, a
row into its own slot (only the tokens it appended since the slot's context) or, for a row
without one, into a free slot (its whole prompt), then runs up to K decode steps of every slot
and returns the turns that ended. So rows come and go between any K decode steps: a row back
from its tool joins the others' decoding at once, and a row that waits for a slot takes the
first one a finished trajectory frees. Every process of a multi-process run must make the same
calls (`jrl.agent.server.TurnServer.serve_in_slots` agrees on them): a step reads the slots'
state from every process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from jrl.parallel import host_array, put_global
from jrl.rollout.kept_turns import common_prefix
from jrl.rollout.limits import ceil_bucket, ceil_pow2
from jrl.rollout.session_programs import Admission, SessionState


class EndedTurn(NamedTuple):
    """A turn a `step` finished: its row's sampled tokens and their log-probs."""

    row: int
    token_ids: list[int]
    log_probs: list[float]


@dataclasses.dataclass
class _Asked:
    row: int
    prompt_ids: np.ndarray
    max_tokens: int


class TurnSession:
    """`replicas` x `slots` slots of `width` columns each; `admit` (state, admission, key,
    columns=) and `decode` (state, key, columns=) run the session's programs on its state
    (bound to the engine's model and sampling; `decode` runs `steps` steps), `lanes` lays
    out an admission's [replicas * A, ...] arrays. `held` maps rows whose context is already
    in a slot (from the round before the session) to (global slot, that context); `turns` gives
    each row's next turn index (its keys, `session_programs.turn_keys`)."""

    def __init__(
        self,
        *,
        admit: Callable[..., SessionState],
        decode: Callable[..., SessionState],
        steps: int,
        state: SessionState,
        replicas: int,
        slots: int,
        width: int,
        response_length: int,
        lanes: NamedSharding,
        key: jax.Array,
        held: dict[int, tuple[int, np.ndarray]],
        turns: dict[int, int],
    ):
        self._admit_program, self._decode_program, self.steps = admit, decode, steps
        self.state = state
        self._length = host_array(state.length).copy()  # as of the last step
        self.replicas, self.slots, self.width = replicas, slots, width
        self.response_length = response_length
        self._lanes, self._key = lanes, key
        self._slot_of = {row: slot for row, (slot, _) in held.items()}
        self._context = {slot: context for slot, context in held.values()}
        taken = set(self._slot_of.values())
        self._free = [
            [s for s in range(r * slots, (r + 1) * slots) if s not in taken]
            for r in range(replicas)
        ]
        self._turns = dict(turns)
        self._asked: list[_Asked] = []
        self._running: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (row, prompt)
        self.prefilled_tokens = 0
        self.admissions = 0
        self.decode_calls = 0

    @property
    def ready(self) -> bool:
        """Whether a `step` has work: a turn being sampled, or one asked that has a slot."""
        free = any(self._free)
        return bool(self._running) or any(free or a.row in self._slot_of for a in self._asked)

    def ask(self, row: int, prompt_ids: Sequence[int], max_tokens: int) -> None:
        """Sample a turn of `row` after `prompt_ids` (its whole context), at most `max_tokens`
        tokens; a later `step` returns it."""
        prompt = np.asarray(prompt_ids, np.int32)
        if len(prompt) > self.width:
            raise ValueError(
                f"row {row}'s context has {len(prompt)} tokens, more than the {self.width} a "
                "slot holds (its first prompt's width + the response length): an agent loop's "
                "response must stay within actor_rollout_ref.rollout.response_length"
            )
        self._asked.append(_Asked(row, prompt, max(1, int(max_tokens))))

    def release(self, row: int) -> None:
        """`row`'s trajectory ended: its slot takes the next row that needs one."""
        slot = self._slot_of.pop(row, None)
        if slot is not None:
            self._context.pop(slot, None)
            self._free[slot // self.slots].append(slot)

    def step(self) -> list[EndedTurn]:
        """Admit what was asked (where slots allow), decode up to K steps, and return the turns
        that ended, by row."""
        self._admit()
        if self._running:
            reach = max(int(self._length[slot]) for slot in self._running) + self.steps
            self.state = self._decode_program(self.state, self._key, columns=self._columns(reach))
            self.decode_calls += 1
        return self._ended()

    def sampled(self) -> dict[int, int]:
        """Tokens each running turn has sampled so far, by row (read from the devices)."""
        steps = host_array(self.state.step)
        return {row: int(steps[slot]) for slot, (row, _) in self._running.items()}

    @property
    def running(self) -> int:
        """Turns being sampled."""
        return len(self._running)

    def _columns(self, reach: int) -> int:
        """The columns a program reads to reach `reach` columns of a slot: a power of two, or
        the slot's width (a few program shapes)."""
        return min(self.width, ceil_pow2(reach))

    def _place(self, asked: _Asked) -> int | None:
        """The global slot `asked` runs in: its row's, else a free one of the replica with the
        most free slots (None: none is free)."""
        slot = self._slot_of.get(asked.row)
        if slot is None:
            replica = max(range(self.replicas), key=lambda r: len(self._free[r]))
            if not self._free[replica]:
                return None
            slot = min(self._free[replica])
            self._free[replica].remove(slot)
            self._slot_of[asked.row] = slot
        return slot

    def _admit(self) -> None:
        """One admission program over every asked turn that has a slot, each prefilling what
        its slot's context lacks."""
        lanes: list[list[tuple[int, np.ndarray, int, _Asked]]] = [[] for _ in range(self.replicas)]
        waiting = []
        for asked in sorted(self._asked, key=lambda a: a.row):
            slot = self._place(asked)
            if slot is None:
                waiting.append(asked)
                continue
            prompt = asked.prompt_ids
            kept = self._context.get(slot, prompt[:0])
            start = min(common_prefix(prompt, kept), len(prompt) - 1)
            lanes[slot // self.slots].append((slot % self.slots, prompt[start:], start, asked))
            self._running[slot] = (asked.row, prompt)
            self._length[slot] = len(prompt)
        self._asked = waiting
        if not any(lanes):
            return
        # Prefill is compute-bound: lanes and chunk columns pad by at most a third.
        per_replica = ceil_bucket(max(map(len, lanes)))
        chunk = ceil_bucket(max(len(tokens) for lane in lanes for _, tokens, _, _ in lane))
        fields = {
            name: np.zeros((self.replicas, per_replica), np.int32)
            for name in ("count", "start", "row", "turn", "limit")
        }
        slot = np.full((self.replicas, per_replica), self.slots, np.int32)
        ids = np.zeros((self.replicas, per_replica, chunk), np.int32)
        for r, lane in enumerate(lanes):
            for i, (local, tokens, start, asked) in enumerate(lane):
                room = self.width - len(asked.prompt_ids) + 1
                turn = self._turns.get(asked.row, 0)
                self._turns[asked.row] = turn + 1
                slot[r, i], ids[r, i, : len(tokens)] = local, tokens
                values = (len(tokens), start, asked.row, turn)
                limit = min(asked.max_tokens, room, self.response_length)
                for name, value in zip(fields, (*values, limit), strict=True):
                    fields[name][r, i] = value
                self.prefilled_tokens += len(tokens)
        host = Admission(slot=slot, ids=ids, **fields)
        admission = Admission(*(put_global(x.reshape(-1, *x.shape[2:]), self._lanes) for x in host))
        columns = self._columns(int((host.start + host.count).max()))
        self.state = self._admit_program(self.state, admission, self._key, columns=columns)
        self.admissions += 1

    def _ended(self) -> list[EndedTurn]:
        """The running turns that ended: their tokens; their slots' contexts now hold the
        prompt and every token but the last."""
        active = host_array(self.state.active)
        self._length = host_array(self.state.length).copy()
        ended = sorted(slot for slot in self._running if not active[slot])
        if not ended:
            return []
        steps = host_array(self.state.step)
        tokens, log_probs = host_array(self.state.tokens), host_array(self.state.log_probs)
        out = []
        for slot in ended:
            row, prompt = self._running.pop(slot)
            n = int(steps[slot])
            sampled = tokens[slot, :n]
            self._context[slot] = np.concatenate([prompt, sampled[:-1]])
            out.append(EndedTurn(row, sampled.tolist(), log_probs[slot, :n].tolist()))
        return sorted(out, key=lambda e: e.row)
