"""`StreamedLoops`: agent loops whose rows come and go, for the fully-async rollouter
(`jrl.trainer.overlap.fully_async`). Each row's loop runs as a task on this driver's own event
loop (in the rollouter's thread); the turns the loops ask go into the rollouter's `TurnSession`
between its steps, and a row is finished when its loop returns. Between two session steps the
loops get up to `FAST_TOOL_SECONDS` to call their tools and ask their next turns; a slower tool
goes on in its thread while the session steps the other rows.

Every process of a multi-process run runs every row's loop; before each session step the
processes agree on the turns they all asked and the loops they all saw end (`agreed`), so that
their sessions make the same calls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from jrl.agent.loop import AgentLoopOutput, TokenOutput, agent_loop_class
from jrl.agent.rollout import AgentRollout, row_fields, sampling_dict
from jrl.agent.server import FAST_TOOL_SECONDS, ROW, PendingTurn, TurnAsker, agreed
from jrl.batch import Batch
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.session import EndedTurn, TurnSession

# The meta key of each streamed row's loop output (`StreamedLoops.batch`): its metrics are the
# step's agent metrics, taken off before the batch trains (`take_outputs`).
AGENT_OUTPUTS = "agent_loop_output"


def take_outputs(batch: Batch) -> tuple[Batch, list[AgentLoopOutput]]:
    """`batch` without its rows' loop outputs, and those outputs (none: not streamed rows)."""
    if AGENT_OUTPUTS not in batch.meta:
        return batch, []
    meta = {key: values for key, values in batch.meta.items() if key != AGENT_OUTPUTS}
    return Batch(batch.tensors, meta), list(batch.meta[AGENT_OUTPUTS])


class StreamedLoops(TurnAsker):
    """The rows of `agent`'s loops (the run's default loop, or a row's ``agent_name``), sampled
    with `sampling`, on prompts of at most `prompt_width` tokens; also the loops'
    ``server_manager``."""

    def __init__(self, agent: AgentRollout, sampling: SamplingParams, prompt_width: int):
        self.agent, self.sampling = agent, sampling
        self.width = agent.first_prompt_width(prompt_width)  # of every group's prompts
        self.engine = agent.engine  # what the loops read: response_length, eos_token_ids
        self.tracer = agent.context.tracer
        self._loop = asyncio.new_event_loop()
        self.arrived = asyncio.Event()
        self._tasks: dict[int, asyncio.Task] = {}
        self._waiting: dict[int, PendingTurn] = {}  # asked by a loop, not yet in the session
        self._asked: dict[int, PendingTurn] = {}  # in the session
        self._outputs: dict[int, AgentLoopOutput] = {}

    def queue(self, turn: PendingTurn) -> None:
        """A loop's turn, to be asked in the rollouter's session before its next step."""
        self._waiting[turn.row] = turn

    # -- the rollouter's side -----------------------------------------------------------------
    def start(self, row: int, prompt: Batch) -> None:
        """Starts `row`'s loop on `prompt` (one row, meta included)."""
        fields = row_fields(prompt, 0)
        loop = agent_loop_class(str(fields.get("agent_name") or self.agent.context.default_loop))
        token = ROW.set(row)  # the task runs in a copy of this context
        run = self.agent.run_row(loop, sampling_dict(self.sampling), fields, self, None)
        self._tasks[row] = self._loop.create_task(run)
        ROW.reset(token)

    @property
    def pending(self) -> bool:
        """Whether a loop runs outside the session (a tool, or a turn not asked yet)."""
        return bool(self._tasks) and len(self._asked) < len(self._tasks)

    def prepare(self, session: TurnSession) -> list[int]:
        """Before a session step: the loops run until each waits for a turn or ended (at most
        `FAST_TOOL_SECONDS` for those in a tool); their turns go into `session`; the rows whose
        loops ended free their slots. The rows that ended (a loop's own error is raised)."""
        self._loop.run_until_complete(self._settle())
        local_done = [row for row, task in self._tasks.items() if task.done()]
        for row in local_done:
            self._tasks[row].result()
        new, done = agreed(sorted(self._waiting), local_done)
        for row in new:
            turn = self._waiting.pop(row)
            session.ask(row, turn.prompt_ids, turn.max_tokens)
            self._asked[row] = turn
        for row in sorted(done):
            session.release(row)
            self._outputs[row] = self._tasks.pop(row).result()
        return sorted(done)

    def ended(self, turn: EndedTurn) -> bool:
        """A turn the session finished goes to its loop; the row goes on (False)."""
        log_probs = turn.log_probs if self.sampling.calculate_log_probs else None
        self._asked.pop(turn.row).answer.set_result(TokenOutput(turn.token_ids, log_probs))
        return False

    def batch(self, prompt: Batch, rows: Sequence[int]) -> Batch:
        """The finished `rows` of `prompt` in verl's rollout layout, with ``num_turns`` and each
        row's loop output (`AGENT_OUTPUTS`); prompts padded to `width`, the same for every
        group."""
        outputs = [self._outputs.pop(row) for row in rows]
        widest = max(len(out.prompt_ids) for out in outputs)
        if widest > self.width:
            raise ValueError(
                f"an agent loop's first prompt has {widest} tokens, more than the {self.width} "
                "of data.max_prompt_length and the tools' listing: raise data.max_prompt_length"
            )
        batch = self.agent.trajectory_batch(prompt.repeat(len(rows)), outputs, self.width)
        kept = np.empty(len(outputs), dtype=object)
        kept[:] = outputs
        return batch.union(Batch(meta={AGENT_OUTPUTS: kept}))

    def close(self) -> None:
        """Cancels the loops still running and closes the event loop."""
        for task in self._tasks.values():
            task.cancel()
        if self._tasks:
            stopped = asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._loop.run_until_complete(stopped)
        self._loop.close()

    async def _settle(self) -> None:
        clock = asyncio.get_running_loop()
        deadline = clock.time() + FAST_TOOL_SECONDS
        while True:
            running = [
                task
                for row, task in self._tasks.items()
                if not task.done() and row not in self._waiting and row not in self._asked
            ]
            left = deadline - clock.time()
            if not running or left <= 0:
                return
            self.arrived.clear()
            arrival = asyncio.create_task(self.arrived.wait())
            first = asyncio.FIRST_COMPLETED
            await asyncio.wait({*running, arrival}, timeout=left, return_when=first)
            arrival.cancel()
