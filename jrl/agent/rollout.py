"""`AgentRollout`: the `Rollout` of a multi-turn run. It wraps an engine (the JAX sampler or
vLLM), runs one agent loop per response row (the row's ``agent_name``, else the default), and
returns verl's rollout batch with the loops' response masks: 1 on the model's tokens, 0 on the
tool and user turns between them."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from jrl.agent.context import AgentContext
from jrl.agent.loop import AgentLoopOutput, TrainerConfig, agent_loop_class
from jrl.agent.metrics import agent_metrics
from jrl.agent.server import ROW, TurnServer, left_padded
from jrl.batch import Batch
from jrl.data.rl_dataset import verl_row_fields
from jrl.rollout.layout import rollout_batch
from jrl.rollout.protocol import Rollout
from jrl.rollout.sampling import SamplingParams


def sampling_dict(sampling: SamplingParams) -> dict[str, Any]:
    """verl's ``sampling_params`` argument of ``AgentLoopBase.run``."""
    return {
        "temperature": sampling.temperature if sampling.do_sample else 0.0,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "logprobs": sampling.calculate_log_probs,
    }


def row_fields(prompts: Batch, row: int) -> dict[str, Any]:
    """The dataset fields of prompt `row` as verl hands them to ``run``: its meta, with
    ``tools_kwargs`` and ``interaction_kwargs`` lifted from ``extra_info``."""
    fields = {key: values[row] for key, values in prompts.meta.items()}
    lifted = verl_row_fields(fields.get("extra_info"))  # the dataset's rule, for other batches
    for key in ("tools_kwargs", "interaction_kwargs"):
        fields.setdefault(key, lifted[key] or {})
    return fields


def sample_index(fields: Mapping[str, Any], prompt: int) -> Any:
    """verl's ``sample_index`` of a row: its ``extra_info.index``, else its prompt's place."""
    extra = fields.get("extra_info")
    index = extra.get("index") if isinstance(extra, Mapping) else None
    return prompt if index is None else index


class AgentRollout:
    """`Rollout` over `engine`, the trajectories' shapes bounded by the engine's response
    length (the whole multi-turn response) and `context` (settings, tools, interactions).
    `keep_kv=False` makes every round prefill its histories whole (for comparison)."""

    def __init__(
        self,
        engine: Rollout,
        context: AgentContext,
        trainer_config: Mapping[str, Any],
        *,
        keep_kv: bool = True,
    ):
        self.engine, self.context, self.keep_kv = engine, context, keep_kv
        self.step, self.validate = -1, False  # what the traces are tagged with (`at_step`)
        self.trainer_config = TrainerConfig(trainer_config)
        self._stats: dict[str, float] = {}
        self._told_rounds = False  # why later turns run in rounds, said once

    @property
    def response_length(self) -> int:
        return self.engine.response_length

    @property
    def pad_token_id(self) -> int:
        return self.engine.pad_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.engine.eos_token_ids

    @property
    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def first_prompt_width(self, prompt_width: int) -> int:
        """The widest first context of a row whose prompt has at most `prompt_width` tokens:
        the prompt with the tools' listing (`ChatTemplate.tools_tokens`)."""
        return prompt_width + self.context.chat.tools_tokens

    def update_weights(self, params: nnx.State) -> None:
        self.engine.update_weights(params)

    def release(self) -> None:
        self.engine.release()

    def resume(self) -> None:
        self.engine.resume()

    def at_step(self, step: int, validate: bool = False) -> None:
        """Tag the next calls' traces with the trainer's `step` and whether they validate."""
        self.step, self.validate = step, validate

    def generate(self, prompts: Batch, sampling: SamplingParams, key: jax.Array) -> Batch:
        """`sampling.n` trajectories per prompt (rows interleaved), each by its row's loop."""
        server = TurnServer(
            self.engine,
            prompts,
            sampling,
            key,
            keep_kv=self.keep_kv,
            scheduling=self.context.settings.scheduling,
            groups=self.context.settings.row_groups,
            tracer=self.context.tracer,
        )
        if self.context.settings.scheduling == "slots" and server.rounds_because:
            if not self._told_rounds:
                print(f"jrl: agent: later turns run in rounds: {server.rounds_because}", flush=True)
            self._told_rounds = True
        outputs = asyncio.run(self._run_all(prompts, sampling, server))
        self.context.tracer.flush()
        batch = self.trajectory_batch(prompts.repeat(sampling.n, interleave=True), outputs)
        self._stats = {
            **self.engine.stats,
            **agent_metrics(outputs, self.response_length),
            "agent/rounds": float(server.rounds),
            "agent/slot_steps": float(server.slot_steps),
            "agent/prefill_tokens": float(server.tokens_prefilled),
            "agent/prefill_tokens_if_kv_kept": float(server.tokens_new),
        }
        return batch

    async def _run_all(
        self, prompts: Batch, sampling: SamplingParams, server: TurnServer
    ) -> list[AgentLoopOutput]:
        """Every row's loop as a task. Round 0 waits for every row; later turns go into the
        engine's slots as they are asked (`TurnServer.serve_in_slots`), or in rounds that take
        the groups in turn (one group: every row), each once all its unfinished tasks wait."""
        params = sampling_dict(sampling)
        fields = [row_fields(prompts, row // sampling.n) for row in range(server.rows)]
        samples = [sample_index(f, row // sampling.n) for row, f in enumerate(fields)]
        traced = self.context.tracer.chosen(samples, seed=self.step)
        tasks = []
        for row in range(server.rows):
            loop = agent_loop_class(str(fields[row].get("agent_name") or self.context.default_loop))
            ROW.set(row)
            tags = {"step": self.step, "sample_index": samples[row], "rollout_n": row % sampling.n}
            tags = {**tags, "validate": self.validate} if row in traced else None
            run = self.run_row(loop, params, fields[row], server, tags)
            tasks.append(asyncio.create_task(run))
        everyone = range(server.rows)
        await _settled(tasks, server, everyone)
        if server.waiting:
            server.flush()
        if server.in_slots and not all(task.done() for task in tasks):
            await server.serve_in_slots(tasks)
        members = [[r for r in everyone if server.group(r) == g] for g in range(server.groups)]
        group = 0
        while not all(task.done() for task in tasks):
            await _settled(tasks, server, members[group])
            if server.groups == 1:
                if server.waiting:
                    server.flush()
            else:
                await server.flush_group(group)
            group = (group + 1) % server.groups
        return [task.result() for task in tasks]

    async def run_row(
        self,
        loop: type,
        params: dict[str, Any],
        fields: dict[str, Any],
        server: TurnServer,
        trace_tags: dict[str, Any] | None,
    ) -> AgentLoopOutput:
        """One trajectory of `loop` asking its turns of `server` (the loops' ``server_manager``),
        traced (tagged with `trace_tags`) unless they are None."""
        agent = loop(self.trainer_config, server, self.context.tokenizer, context=self.context)
        tracer = self.context.tracer
        inputs = {"sampling_params": params, **fields}
        with (
            tracer.trajectory(trace_tags is not None, **(trace_tags or {})),
            tracer.span(f"{loop.__name__}.run", inputs) as finish,
        ):
            out = await agent.run(dict(params), request_id=uuid.uuid4().hex, **fields)
            texts = tracer.texts(prompt_ids=out.prompt_ids, response_ids=out.response_ids)
            finish({**dataclasses.asdict(out), **texts})
        return out

    def trajectory_batch(
        self, prompts: Batch, outputs: Sequence[AgentLoopOutput], width: int = 0
    ) -> Batch:
        """verl's rollout batch of the trajectories (`rollout_batch`): prompts left-padded to the
        batch's width, or `width` (wider when a loop's prompt is longer), responses right-padded
        to the response length, attention on every real response token; meta of `prompts` (one
        row per trajectory) and each row's ``num_turns``."""
        widest = max(len(o.prompt_ids) for o in outputs)
        width = max(np.asarray(prompts["input_ids"]).shape[1], widest, width)
        length, pad = self.response_length, self.pad_token_id
        responses = np.full((len(outputs), length), pad, np.int32)
        response_mask = np.zeros((len(outputs), length), np.int32)
        present = np.zeros((len(outputs), length), np.int32)
        log_probs = np.zeros((len(outputs), length), np.float32)
        for i, out in enumerate(outputs):
            n = min(len(out.response_ids), length)
            responses[i, :n] = out.response_ids[:n]
            response_mask[i, :n] = out.response_mask[:n]
            present[i, :n] = 1
            if out.response_logprobs is not None:
                log_probs[i, :n] = out.response_logprobs[:n]
        sampled = any(o.response_logprobs is not None for o in outputs)
        batch = rollout_batch(
            left_padded([o.prompt_ids for o in outputs], width, pad).union(
                Batch(meta=prompts.meta)
            ),
            responses,
            response_mask,
            log_probs * response_mask if sampled else None,
            present=present,
        )
        turns = np.asarray([o.num_turns for o in outputs], np.int32)
        return batch.union(Batch(meta={"num_turns": turns}))


async def _settled(tasks: list[asyncio.Task], server: TurnServer, rows: Sequence[int]) -> None:
    """Until every unfinished task of `rows` waits for a turn; a loop's own bug stops the
    rollout, naming it."""
    members = set(rows)
    while True:
        pending = [tasks[r] for r in rows if not tasks[r].done()]
        if len(pending) <= sum(t.row in members for t in server.waiting):
            return
        for task in await server.next_event(pending):
            task.result()
