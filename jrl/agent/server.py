"""`TurnServer`: the ``server_manager`` agent loops call. Every trajectory runs as a task. The
first turns of all rows share one engine call (round 0). Later turns go into the engine's slots
as soon as they are asked (`serve_in_slots`), or, in rounds, once each unfinished task (of a
group of rows, or of all) waits for a turn, all their turns in one engine call."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jrl.agent.loop import TokenOutput
from jrl.agent.trace import NO_TRACES, RolloutTracer
from jrl.batch import Batch
from jrl.data.prompts import left_pad, position_ids_from_mask
from jrl.parallel import allgather_objects
from jrl.rollout.limits import ceil_pow2
from jrl.rollout.protocol import Rollout, SessionEngine, TurnEngine
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.session_programs import turn_key

# How long a slot's step waits for the loops it answered to ask their next turn (their tool
# calls run in threads: even an instant tool takes a few event-loop rounds).
FAST_TOOL_SECONDS = 0.05

# The row whose trajectory the current task runs (set by the driver per task).
ROW: contextvars.ContextVar[int] = contextvars.ContextVar("jrl_agent_row")


@dataclasses.dataclass
class PendingTurn:
    """A turn a loop asked for: its row, context and token budget, and the future it awaits."""

    row: int
    prompt_ids: list[int]
    max_tokens: int
    answer: asyncio.Future


class _Call(NamedTuple):
    """One engine call of a round: its prompts, sampling and key; per row, the row of the
    kept call in stream `source` it continues (None: round 0); the stream it is kept in;
    whether it is the last to read `source`; the prompt tokens it was given; per row, its
    trajectory (None: round 0's rows, in order)."""

    prompts: Batch
    sampling: SamplingParams
    key: jax.Array
    previous: list[int] | None
    stream: int
    source: int
    drop_source: bool
    given: int
    row_ids: list[int] | None


def left_padded(prompts: Sequence[Sequence[int]], width: int, pad_token_id: int) -> Batch:
    """Prompt tensors (`input_ids`, `attention_mask`, `position_ids` [rows, width]) of token
    lists, padded on the left."""
    ids, mask = map(
        np.asarray, zip(*(left_pad(p, width, pad_token_id) for p in prompts), strict=True)
    )
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": position_ids_from_mask(mask),
    }
    return Batch(tensors)


class TurnAsker:
    """The ``server_manager`` agent loops call: `generate` asks a turn of the current task's row
    (`ROW`) and waits for its answer; a subclass `queue`s the turn where its engine samples it,
    and answers its future. Subclasses hold the `engine` (its response length), the `tracer`
    and the `arrived` event, set whenever a turn is asked."""

    engine: Rollout
    tracer: RolloutTracer
    arrived: asyncio.Event

    def queue(self, turn: PendingTurn) -> None:
        raise NotImplementedError

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: Sequence[int],
        sampling_params: dict[str, Any] | None = None,
        image_data: Any = None,
        max_tokens: int | None = None,
    ) -> TokenOutput:
        """One turn after `prompt_ids`: at most `max_tokens` (else the response length) tokens,
        ending with EOS or at the limit."""
        if image_data is not None:
            raise ValueError("jrl's models are text-only: a turn cannot carry images")
        limit = self.engine.response_length if max_tokens is None else max_tokens
        inputs = {"prompt_ids": prompt_ids, "sampling_params": sampling_params, "max_tokens": limit}
        with self.tracer.span("generate", inputs) as finish:
            answer = asyncio.get_running_loop().create_future()
            self.queue(PendingTurn(ROW.get(), list(prompt_ids), max(1, int(limit)), answer))
            self.arrived.set()
            out = await answer
            texts = self.tracer.texts(prompt_ids=prompt_ids, response_ids=out.token_ids)
            finish({**dataclasses.asdict(out), **texts})
        return out


class TurnServer(TurnAsker):
    """Samples turns with `engine` and the call's `sampling`: rows are the `prompts`' answers
    (``sampling.n`` consecutive rows share a prompt). Round 0, when every row asks with its
    prompt and the whole response budget, is the very call a single-turn rollout makes
    (`prompts` as given, `key`, n answers per prompt); round k > 0 samples each waiting row once,
    for as many tokens as its turn asks (the longest, rounded up to a power of two). A row's
    k-th turn draws its tokens as row r (its trajectory) of a call with ``turn_key(key, k)``
    whatever else the call holds, so rounds, groups and slots sample the same tokens. With
    `groups` > 1 the driver samples the rows group by group after round 0 (`flush_group`),
    each group's call in a thread while the other groups' tools run; with slots
    (`serve_in_slots`) each turn as soon as it is asked."""

    def __init__(
        self,
        engine: Rollout,
        prompts: Batch,
        sampling: SamplingParams,
        key: jax.Array,
        *,
        keep_kv: bool = True,
        scheduling: str = "rounds",
        groups: int = 1,
        tracer: RolloutTracer = NO_TRACES,
    ):
        self.engine, self.prompts, self.sampling, self.key = engine, prompts, sampling, key
        self.rows = len(prompts) * sampling.n
        self.tracer = tracer
        self.groups = max(1, min(groups, self.rows))
        # Later turns in the engine's slots, unless `rounds_because` says why not.
        self.rounds_because = None
        if not keep_kv:
            self.rounds_because = "every turn prefills its whole history (keep_kv=False)"
        elif not isinstance(engine, SessionEngine):
            self.rounds_because = f"the {type(engine).__name__} engine keeps no slots across turns"
        self.in_slots = scheduling == "slots" and self.groups == 1 and not self.rounds_because
        self._group_rounds = [0] * self.groups
        # A `TurnEngine` continues each row from the keys and values of its last turn.
        self.keep_kv = keep_kv and isinstance(engine, TurnEngine)
        self._call_rows: dict[int, tuple[int, int]] = {}  # row -> (stream, row) of its last call
        self.waiting: list[PendingTurn] = []
        self.arrived = asyncio.Event()
        self.rounds = 0
        self.slot_steps = 0  # decode calls of the later turns in slots
        self.tokens_prefilled = 0
        # What a cache kept between turns would prefill instead: each row's new tokens only
        # (its previous turn's last token, whose keys were never written, and the appended turn).
        self.tokens_new = 0
        self._contexts: dict[int, list[int]] = {}
        self._first_width = 0  # the longest context a turn was answered after

    def queue(self, turn: PendingTurn) -> None:
        self.waiting.append(turn)

    def group(self, row: int) -> int:
        """The group of `row` (consecutive rows, `groups` about equal parts)."""
        return row * self.groups // self.rows

    def flush(self) -> None:
        """Sample every waiting turn (one engine call) and answer each."""
        turns, call = self._take(None)
        self._answer(turns, self._sample(call))

    async def flush_group(self, group: int) -> None:
        """Sample the waiting turns of `group` (one engine call, in a thread, so that the other
        groups' tools and interactions run meanwhile) and answer each."""
        if any(self.group(t.row) == group for t in self.waiting):
            turns, call = self._take(group)
            self._answer(turns, await asyncio.to_thread(self._sample, call))

    def _take(self, group: int | None) -> tuple[list[PendingTurn], _Call]:
        """The waiting turns of `group` (all: None), by row, and their engine call. Every row
        of a round is at the same turn: the k-th round of all rows, or of a group (round 0 is
        every row's), holds their k-th turns."""
        turns = sorted(
            (t for t in self.waiting if group is None or self.group(t.row) == group),
            key=lambda t: t.row,
        )
        taken = {id(t) for t in turns}
        self.waiting = [t for t in self.waiting if id(t) not in taken]
        shared = self._shared_round(turns)
        if shared is not None:
            prompts, sampling, key = shared
        else:
            prompt_ids = [t.prompt_ids for t in turns]
            # Histories padded to a power of two: a few program shapes over all rounds and steps
            # (the widest is the one `jrl.compile` plans).
            longest = max(np.asarray(self.prompts["input_ids"]).shape[1], *map(len, prompt_ids))
            prompts = left_padded(prompt_ids, ceil_pow2(longest), self.engine.pad_token_id)
            longest = max(t.max_tokens for t in turns)
            tokens = min(self.engine.response_length, ceil_pow2(longest))
            sampling = dataclasses.replace(self.sampling, n=1, max_new_tokens=tokens)
            if group is not None:
                self._group_rounds[group] += 1
            turn = self.rounds if group is None else self._group_rounds[group]
            key = turn_key(self.key, turn)
        given = int(np.asarray(prompts["attention_mask"]).sum())
        self.tokens_new += given if shared else sum(map(self._new_tokens, turns))
        # Each group keeps its keys and values in a stream of its own (round 0's in stream 0).
        stream = 0 if group is None or self.groups == 1 else group + 1
        sources = {self._call_rows.get(t.row, (-1, -1))[0] for t in turns}
        source = max(sources) if not shared else stream
        # Round 0's stream is read by each group's first round (the groups take turns in
        # order): the last group's drops it.
        last = group == self.groups - 1 and self._group_rounds[group] == 1
        drop = source == 0 and stream != 0 and last
        previous = None
        if shared is None:
            previous = [
                row if kept == source else -1
                for kept, row in (self._call_rows.get(t.row, (-1, -1)) for t in turns)
            ]
        if self.keep_kv:
            self._call_rows.update({t.row: (stream, i) for i, t in enumerate(turns)})
        row_ids = None if shared else [t.row for t in turns]
        call = _Call(prompts, sampling, key, previous, stream, max(source, 0), drop, given, row_ids)
        return turns, call

    def _sample(self, call: _Call) -> tuple[Batch, int]:
        """The engine's answer to `call`, and the prompt tokens it prefilled."""
        if isinstance(self.engine, TurnEngine):
            out = self.engine.generate_turn(
                call.prompts,
                call.sampling,
                call.key,
                call.previous,
                stream=call.stream,
                source=call.source,
                drop_source=call.drop_source,
                row_ids=call.row_ids,
            )
        else:
            out = self.engine.generate(call.prompts, call.sampling, call.key)
        return out, int(self.engine.stats.get("rollout/prefill_tokens", call.given))

    def _answer(self, turns: list[PendingTurn], sampled: tuple[Batch, int]) -> None:
        """Each turn's tokens (cut to what it asked for) and log-probs."""
        out, prefilled = sampled
        self.tokens_prefilled += prefilled
        self.rounds += 1
        responses = np.asarray(out["responses"])
        lengths = np.asarray(out["response_mask"]).sum(-1)
        log_probs = out.tensors.get("rollout_log_probs")
        log_probs = None if log_probs is None else np.asarray(log_probs)
        for i, turn in enumerate(turns):
            keep = min(int(lengths[i]), turn.max_tokens)
            ids = responses[i, :keep].tolist()
            self._reply(turn, ids, None if log_probs is None else log_probs[i, :keep].tolist())

    def _reply(self, turn: PendingTurn, ids: list[int], log_probs: list[float] | None) -> None:
        """Answer `turn` with its sampled `ids` and their `log_probs`."""
        turn.answer.set_result(TokenOutput(ids, log_probs))
        self._contexts[turn.row] = turn.prompt_ids + ids
        self._first_width = max(self._first_width, len(turn.prompt_ids))

    async def serve_in_slots(self, tasks: Sequence[asyncio.Task]) -> None:
        """Sample every later turn in the engine's `TurnSession` (`SessionEngine`), round 0's
        keys and values taken over: each session step (admissions, then a few decode steps of
        every slot) runs in a thread while the loops run their tools, and a turn is answered as
        soon as it ends. The rows of finished loops give their slots to rows still waiting for
        one; a loop's own bug stops the rollout, naming it.

        Every process of a multi-process run runs every row's loop, but their tools finish at
        different times: before each step the processes agree on what they have all seen
        (`agreed`), so that they admit the same turns and free the same slots, and their
        steps are the same programs on the same arrays."""
        width = self._first_width
        session = self.engine.open_session(self.rows, width, self.sampling, self.key, first_turn=1)
        asked: dict[int, PendingTurn] = {}
        while True:
            local_done = [row for row, task in enumerate(tasks) if task.done()]
            for row in local_done:
                tasks[row].result()
            waiting = {t.row: t for t in self.waiting}
            new, done = agreed(sorted(waiting), local_done)
            if len(done) == self.rows:
                break
            for row in new:
                turn = waiting.pop(row)
                self.tokens_new += self._new_tokens(turn)
                session.ask(turn.row, turn.prompt_ids, turn.max_tokens)
                asked[turn.row] = turn
            self.waiting = list(waiting.values())
            for row in done:
                session.release(row)
            if session.ready:
                answered = []
                for ended in await asyncio.to_thread(session.step):
                    log_probs = ended.log_probs if self.sampling.calculate_log_probs else None
                    self._reply(asked.pop(ended.row), ended.token_ids, log_probs)
                    answered.append(ended.row)
                await self._next_turns(tasks, answered)
            elif all(row in asked for row in set(range(self.rows)) - done):
                raise RuntimeError(
                    f"rows {sorted(asked)[:8]} wait for a turn and no slot frees: every "
                    "unfinished trajectory waits for a slot"
                )
            elif any(
                not t.done() and r not in asked and r not in waiting for r, t in enumerate(tasks)
            ):
                await self.next_event(tasks)  # a loop of this process is still in a tool
            # else another process has yet to see a turn this one has: agree again
        self.rounds += session.admissions
        self.slot_steps = session.decode_calls
        self.tokens_prefilled += session.prefilled_tokens

    async def _next_turns(self, tasks: Sequence[asyncio.Task], answered: list[int]) -> None:
        """Give the loops of the rows just `answered` up to `FAST_TOOL_SECONDS` to ask their
        next turn or end (a quick tool), so that the next step admits them with the others."""
        clock = asyncio.get_running_loop()
        deadline = clock.time() + FAST_TOOL_SECONDS
        while True:
            asking = {t.row for t in self.waiting}
            pending = [tasks[r] for r in answered if r not in asking]
            if all(task.done() for task in pending) or clock.time() >= deadline:
                return
            await self.next_event(pending, timeout=deadline - clock.time())

    async def next_event(
        self, tasks: Sequence[asyncio.Task], timeout: float | None = None
    ) -> set[asyncio.Task]:
        """Wait until a turn is asked or one of `tasks` ends (at most `timeout` seconds); the
        tasks that ended."""
        self.arrived.clear()
        arrival = asyncio.create_task(self.arrived.wait())
        pending = {task for task in tasks if not task.done()}
        done, _ = await asyncio.wait(
            pending | {arrival}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        arrival.cancel()
        return done - {arrival}

    def _new_tokens(self, turn: PendingTurn) -> int:
        """Tokens of `turn`'s context that its row's previous turn left without keys: that
        turn's last token and what was appended since (all of them for a first turn)."""
        before = self._contexts.get(turn.row)
        if before is None or turn.prompt_ids[: len(before)] != before:
            return len(turn.prompt_ids)
        return len(turn.prompt_ids) - len(before) + 1

    def _shared_round(
        self, turns: list[PendingTurn]
    ) -> tuple[Batch, SamplingParams, jax.Array] | None:
        """Round 0's call with n answers per prompt, when every row waits, asking for the whole
        budget, with the same context as the other rows of its group: the single-turn call
        itself when those contexts are the batch's prompts, else the same call over them (a
        loop that adds a system message, such as the tools' listing, still prefills each prompt
        once for its n answers)."""
        if self.rounds or len(turns) != self.rows:
            return None
        n, full = self.sampling.n, self.engine.response_length
        groups = [turns[i : i + n] for i in range(0, len(turns), n)]
        if any(t.max_tokens < full or t.prompt_ids != g[0].prompt_ids for g in groups for t in g):
            return None
        ids = np.asarray(self.prompts["input_ids"])
        mask = np.asarray(self.prompts["attention_mask"]).astype(bool)
        contexts = [g[0].prompt_ids for g in groups]
        if all(c == row[m].tolist() for c, row, m in zip(contexts, ids, mask, strict=True)):
            return self.prompts, self.sampling, self.key
        width = ceil_pow2(max(ids.shape[1], *map(len, contexts)))
        return left_padded(contexts, width, self.engine.pad_token_id), self.sampling, self.key


def agreed(asked: list[int], done: list[int]) -> tuple[list[int], set[int]]:
    """The rows whose turn every process has asked (in order) and whose loop every process
    has ended: what each process saw, intersected (itself in a single process)."""
    seen = allgather_objects((asked, done))
    return (
        sorted(set.intersection(*(set(a) for a, _ in seen))),
        set.intersection(*(set(d) for _, d in seen)),
    )
