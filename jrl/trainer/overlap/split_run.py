"""A split run's rollout side as the trainer drives it: the engine on its own devices, the weight
sync, and one-step-off generation or the fully-async rollouter (docs/architecture.md).

The trainer asks for each step's rows (`rows`), reports each finished step (`updated`: the
fully-async sync every ``trigger_parameter_sync_step`` steps), frees the engine for validation
with the actor's weights (`idle`), and saves and restores what the rollout side holds
(`checkpoint` / `restore`). `version` counts the trainer's steps, a critic's warm-up steps
(no actor update) included, as verl's split trainers count them: the policy's version, against
which each row's staleness is measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jrl.agent import AgentRollout
from jrl.agent.metrics import agent_metrics
from jrl.agent.streamed import StreamedLoops, take_outputs
from jrl.batch import Batch
from jrl.rollout.sampling import SamplingParams
from jrl.runspec.placement import AsyncSpec
from jrl.trainer.io.metrics import timer
from jrl.trainer.overlap.activity import overlap_metrics
from jrl.trainer.overlap.fully_async import Rollouter, Rows, SingleTurns, group_cap
from jrl.trainer.overlap.one_step_off import Generate, Lookahead, OneStepOff
from jrl.trainer.overlap.snapshots import packed, unpacked
from jrl.trainer.overlap.versions import VERSIONS, version_metrics
from jrl.trainer.overlap.weight_sync import WeightSync

Stream = Iterator[tuple[int, Batch]]  # (epoch, prompts) from the data loader


class SplitRun:
    """The rollout side of a run with `placement` (``hybrid_engine=False``): `engine` on
    `devices`, kept current by `weight_sync` from `params()` (the actor's); `generate` (prompts,
    step) makes a one-step-off batch; a fully-async rollouter samples with `sampling` and `key`
    from slots of `prompt_width` + `response_length` columns (prompts and the tools' listing,
    where `agent` runs each row's loop), `mini_prompts` prompts per mini-batch."""

    def __init__(
        self,
        placement: AsyncSpec,
        engine: Any,
        weight_sync: WeightSync,
        devices: Sequence[jax.Device],
        params: Callable[[], Any],
        *,
        generate: Generate,
        sampling: SamplingParams,
        key: jax.Array,
        prompt_width: int,
        response_length: int,
        mini_prompts: int,
        agent: AgentRollout | None = None,
    ):
        self.placement, self.engine, self.weight_sync = placement, engine, weight_sync
        self.devices, self._params = devices, params
        self.sampling, self._key = sampling, key
        self.prompt_width, self.response_length = prompt_width, response_length
        self.agent = agent
        self.step_prompts = placement.require_batches * mini_prompts
        self.version = 0
        self.one_step_off = None if placement.fully_async else OneStepOff(generate, devices)
        self.rollouter: Rollouter | None = None
        self._restored: dict[str, Any] | None = None  # a checkpoint's rollouter, until `batches`
        self._lookahead: Lookahead | None = None
        self._busy_from = 0.0

    # -- the steps ------------------------------------------------------------------------------
    def batches(self, stream: Stream, position: Callable[[], Any]) -> Stream:
        """The fit loop's (epoch, prompts): `stream` seen one step ahead (one-step-off, the
        loader's `position` kept as of the step's own batch), or, fully async, one empty item
        per step while the rollouter takes the prompts."""
        if self.one_step_off is not None:
            self._lookahead = Lookahead(stream, position)
            return self._lookahead
        self.rollouter = self._start_rollouter(stream)
        return self._streamed_steps()

    def rows(
        self,
        prompts: Batch,
        step: int,
        last_step: int,
        timing: dict[str, float],
        groups: int | None = None,
    ) -> tuple[Batch, dict[str, float]]:
        """`step`'s rows with their tokens' versions (``rollout_token_versions``) and metrics;
        fully async, `groups` finished groups (None: a step's)."""
        if self.rollouter is not None:
            return self._streamed(timing, groups or self.step_prompts)
        return self._one_step_off(prompts, step, last_step, timing)

    def refund(self, groups: int) -> None:
        """The trainer dropped `groups` of the rollouter's (DAPO's filter): as many may start
        in their place (`Rollouter.refund`)."""
        if self.rollouter is not None and groups:
            self.rollouter.refund(groups)

    def version_metrics(self, batch: Batch) -> dict[str, float]:
        """The staleness of the rows a step trains on (`versions.version_metrics`)."""
        return version_metrics(batch.tensors[VERSIONS], self.version)

    def updated(self, timing: dict[str, float]) -> dict[str, float]:
        """The trainer finished a step (the actor updated, or the critic warmed up); fully
        async, every ``trigger_parameter_sync_step``-th one pauses the rollouter between two
        session steps, syncs and resumes it under a new version's cap (its running rows go on
        with the new weights, with ``partial_rollout``; else they end first)."""
        self.version += 1
        trigger = self.placement.trigger_parameter_sync_step
        if self.rollouter is None or self.version % trigger:
            return {}
        with timer("update_weights", timing):
            self.rollouter.pause(drain=False)
            sync = self.sync()
            self.rollouter.resume(self.weight_sync.version)
        return sync

    def step_metrics(self) -> dict[str, float]:
        """How much of the trainer's work since its rows arrived the rollout overlapped."""
        overlap = self.rollouter or self.one_step_off
        return overlap_metrics(overlap.activity, self._busy_from)

    def sync(self) -> dict[str, float]:
        """The engine's weights made the actor's (`version`); none when they are."""
        if self.weight_sync.version == self.version:
            return {}
        return self.weight_sync(self._params(), self.version)

    @contextlib.contextmanager
    def idle(self, synced: bool = True) -> Iterator[None]:
        """The engine free for another call (validation, a greedy baseline), with the actor's
        weights where `synced`: the pending generation waited for, or the rollouter paused."""
        if self.rollouter is None:  # one-step-off, or a rollouter not started yet
            if self.one_step_off is not None:
                self.one_step_off.wait()
            if synced:
                self.sync()
            yield
            return
        self.rollouter.pause(drain=False)
        try:
            if synced:
                self.sync()
            yield
        finally:  # rows started from here are the synced version's, under the same cap
            self.rollouter.resume(self.weight_sync.version, new_cap=False)

    def close(self) -> None:
        """Stops the rollout side's thread (the rollouter's, or one-step-off's pool)."""
        if self.rollouter is not None:
            self.rollouter.close()
        if self.one_step_off is not None:
            self.one_step_off.close()

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, loader_state: Any) -> dict[str, Any]:
        """What a checkpoint's ``extra`` holds of the rollout side, drained first: the policy's
        version, the loader's position and the generated but untrained rows (one-step-off: the
        next step's; fully async: the rollouter's queue, prompts and counters)."""
        extra: dict[str, Any] = {"policy_version": self.version}
        if self.one_step_off is not None:
            extra["data_loader"] = self._lookahead.position
            extra["pending_rollout"] = self.one_step_off.snapshot()
            return extra
        self.rollouter.pause(drain=True)
        extra["data_loader"] = loader_state
        extra["rollouter"] = packed(self.rollouter.snapshot())
        self.rollouter.resume()
        return extra

    def restore(self, extra: dict[str, Any], step: int) -> None:
        """The state `checkpoint` wrote (a checkpoint of `step`), then the actor's weights."""
        self.version = int(extra.get("policy_version", step))
        pending = extra.get("pending_rollout")
        if pending is not None and self.one_step_off is not None:
            self.one_step_off.restore(*OneStepOff.unpack(pending))
        if extra.get("rollouter") is not None:
            self._restored = unpacked(extra["rollouter"])

    # -- one-step-off and fully async -----------------------------------------------------------
    def _one_step_off(
        self, prompts: Batch, step: int, last_step: int, timing: dict[str, float]
    ) -> tuple[Batch, dict[str, float]]:
        """`step`'s batch, generated while the step before trained (now, for a run's first
        step); then the weights sync and the next step's generation starts."""
        pipeline = self.one_step_off
        if pipeline.pending_step != step:
            pipeline.start(prompts, step, self.weight_sync.version)
        with timer("wait_prev_gen", timing):
            generated = pipeline.take(step)
        self._busy_from = time.perf_counter()
        upcoming = self._lookahead.peek()
        sync: dict[str, float] = {}
        if upcoming is not None and step < last_step:
            with timer("update_weights", timing):
                sync = self.sync()
            pipeline.start(upcoming[1], step + 1, self.weight_sync.version)
        mask = np.asarray(generated.batch.tensors["response_mask"]) > 0
        versions = np.where(mask, generated.version, -1).astype(np.int32)
        batch = generated.batch.union(Batch({VERSIONS: versions}))
        return batch, {**generated.metrics, **sync}

    def _streamed(self, timing: dict[str, float], groups: int) -> tuple[Batch, dict[str, float]]:
        """The next `groups` finished groups, in the order they finished (agent loops' metrics
        too)."""
        with timer("wait_rollout", timing):
            taken = self.rollouter.take(groups)
        self._busy_from = time.perf_counter()
        batch, outputs = take_outputs(Batch.concat(taken))
        metrics = {"rollouter/queued_groups": float(self.rollouter.queued)}
        if outputs:
            metrics.update(agent_metrics(outputs, self.response_length))
        return batch, metrics

    def _start_rollouter(self, stream: Stream) -> Rollouter:
        """The rollouter over `stream`'s prompts (from a restored state), started."""
        placement = self.placement
        cap = group_cap(
            placement.staleness_threshold,
            placement.trigger_parameter_sync_step,
            self.step_prompts,
        )

        rows: Rows
        if self.agent is None:
            rows = SingleTurns(self.response_length, self.sampling.pad_token_id)
            width = self.prompt_width
        else:
            rows = StreamedLoops(self.agent, self.sampling, self.prompt_width)
            width = rows.width

        def open_session(slots: int) -> Any:
            return self.engine.open_session(slots, width, self.sampling, self._key)

        rollouter = Rollouter(
            open_session,
            stream,
            rows,
            n=self.sampling.n,
            cap=cap,
            partial=placement.partial_rollout,
            devices=self.devices,
        )
        if self._restored is not None:
            rollouter.restore(self._restored)
        rollouter.version = self.weight_sync.version
        rollouter.start()
        return rollouter

    def _streamed_steps(self) -> Stream:
        while True:
            yield self.rollouter.epoch, Batch({})
