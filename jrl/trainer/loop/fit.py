"""The one fit loop of every trainer (PPO and SFT): resume, validate, train, save, stop.

An algorithm supplies its step and the loop runs it (`Algorithm`). Steps are 1-based; validation
before training (``trainer.val_before_train``) is logged at the resumed step (0 from scratch).
Each step: the algorithm's `train_step` (timed as ``timing_s/step``), the non-finite-loss check,
validation (``testing``) and the checkpoint (``save_checkpoint``) when the `Cadence` says. SIGINT
or SIGTERM on any process ends the run after the current step on every process, with a complete
checkpoint of that step; so does data that runs out within a step (`DataExhausted`), after the
last complete step.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from tqdm.auto import tqdm

from jrl.batch import Batch
from jrl.data.loader import DataLoader
from jrl.parallel import any_process
from jrl.runspec.run import CadenceSpec, LoggingSpec
from jrl.trainer.io.checkpoint import CheckpointManager
from jrl.trainer.io.metrics import timer
from jrl.trainer.io.tracking import Tracking
from jrl.trainer.loop.sanity import warn_on_garbage
from jrl.trainer.loop.stopping import DataExhausted, StopRequest, check_losses_finite


@dataclasses.dataclass(frozen=True)
class Cadence:
    """When a run validates and saves (verl's rules): every ``test_freq`` versions of
    `version_steps` steps / every ``save_freq`` steps when > 0 and at the last step
    (`total_steps`) — PPO's trainer only when the frequency is > 0, SFT's always
    (`after_last`). A version is a step, except in the fully-async trainer, whose weights sync
    every ``trigger_parameter_sync_step`` steps: validation falls right after a sync, as in
    verl. Checkpoints keep counting steps (a checkpoint drains the rollouter and resumes
    exactly at any step, and its folder is named by step)."""

    total_steps: int
    test_freq: int
    save_freq: int
    after_last: bool = False
    val_before_train: bool = False
    val_only: bool = False
    version_steps: int = 1

    @classmethod
    def of(cls, spec: CadenceSpec, batches_per_epoch: int, *, after_last: bool = False) -> Cadence:
        """The cadence of `spec` over a loader of `batches_per_epoch` batches."""
        return cls(
            total_steps=spec.total_steps(batches_per_epoch),
            test_freq=spec.test_freq,
            save_freq=spec.save_freq,
            after_last=after_last,
            val_before_train=spec.val_before_train,
            val_only=spec.val_only,
            version_steps=spec.version_steps,
        )

    def validates_at(self, step: int) -> bool:
        """Whether validation runs after `step`."""
        return self._due(step, self.test_freq * self.version_steps)

    def saves_at(self, step: int) -> bool:
        """Whether a checkpoint is written after `step`."""
        return self._due(step, self.save_freq)

    def _due(self, step: int, freq: int) -> bool:
        last = step >= self.total_steps
        if self.after_last:
            return last or (freq > 0 and step % freq == 0)
        return freq > 0 and (last or step % freq == 0)


class StepOutput(NamedTuple):
    """What an algorithm's `train_step` gives the loop: its metrics and the batch it trained on
    (for the metrics computed after the step's timer)."""

    metrics: dict[str, float]
    batch: Batch | None = None


class Algorithm(Protocol):
    """What the loop needs from a trainer (`PPOTrainer`, `SFTTrainer`)."""

    name: str  # the progress bar's label
    cadence: Cadence
    checkpoints: CheckpointManager
    val_generations: list[dict[str, Any]]  # validation samples to log, emptied by the loop
    vocab_size: int  # the policy's vocabulary (`warn_on_garbage`)

    def resume(self) -> int:
        """Restores the checkpoint that ``trainer.resume_mode`` selects; its step (0: none)."""
        ...

    def batches(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, batch) for the rest of training, from the data loader's position."""
        ...

    def train_step(
        self, batch: Batch, step: int, epoch: int, timing: dict[str, float]
    ) -> StepOutput:
        """One optimizer step (or PPO step) on `batch`; may time its phases into `timing`."""
        ...

    def validate(self, step: int) -> dict[str, float]:
        """The validation metrics after `step`."""
        ...

    def save_checkpoint(self, step: int) -> None:
        """Starts writing the checkpoint of `step` (in the background)."""
        ...

    def step_metrics(
        self, output: StepOutput, step: int, epoch: int, timing: dict[str, float]
    ) -> dict[str, float]:
        """Metrics of the finished step that need its timing (throughput, MFU, ...)."""
        ...


def epochs_of(loader: DataLoader, epochs: int | None) -> Iterator[tuple[int, Batch]]:
    """(epoch, batch) from `loader`'s position to the end of epoch `epochs` - 1 (None: without
    end; the loop stops at the last step)."""
    first = loader.get_state()["epoch"]
    numbers = itertools.count(first) if epochs is None else range(first, epochs)
    for epoch in numbers:
        for batch in loader.epoch(epoch):
            yield epoch, batch


def run_step(algorithm: Algorithm, batch: Batch, step: int, epoch: int) -> dict[str, float]:
    """One step of the loop: the algorithm's step under ``timing_s/step``, then validation
    (``timing_s/testing``) and the checkpoint (``timing_s/save_checkpoint``) when due, outside
    it as in verl, so that ``perf/throughput`` counts the step alone; a non-finite loss stops
    the run before anything is saved, and metrics of a model that is not training are warned
    about."""
    cadence = algorithm.cadence
    timing: dict[str, float] = {}
    with timer("step", timing):
        output = algorithm.train_step(batch, step, epoch, timing)
    metrics = output.metrics
    check_losses_finite(metrics, step, algorithm.checkpoints.latest)
    warn_on_garbage(metrics, step, algorithm.vocab_size)
    if cadence.validates_at(step):
        with timer("testing", timing):
            metrics.update(algorithm.validate(step))
    if cadence.saves_at(step):
        with timer("save_checkpoint", timing):
            algorithm.save_checkpoint(step)
    metrics.update(algorithm.step_metrics(output, step, epoch, timing))
    return metrics


def validation_part(metrics: dict[str, float]) -> dict[str, float]:
    """The validation metrics among a step's (``val-core/``, ``val-aux/``; SFT's ``val/``)."""
    return {k: v for k, v in metrics.items() if k.startswith(("val-", "val/"))}


def stop_after(algorithm: Algorithm, step: int, reason: str) -> None:
    """Ends a run early: makes sure `step` is checkpointed and the save is complete."""
    if not algorithm.cadence.saves_at(step):
        algorithm.save_checkpoint(step)
    algorithm.checkpoints.wait()
    print(
        f"jrl: stopped after step {step} on {reason}; checkpoint: {algorithm.checkpoints.latest()}",
        flush=True,
    )


def log(algorithm: Algorithm, tracking: Tracking, metrics: dict[str, float], step: int) -> None:
    """One step's metrics, and the validation samples kept since the last call."""
    tracking.log(metrics, step=step)
    tracking.log_generations(algorithm.val_generations, step)
    algorithm.val_generations = []


def fit(algorithm: Algorithm, logging: LoggingSpec, created_at: float) -> dict[str, float]:
    """Train `algorithm` to its last step; returns the last step's metrics. `logging` gives the
    loggers, project, experiment and run folder; `created_at` (`time.perf_counter`) starts the
    time to the first step. As verl's trainer, it prints the validation before training
    ("Initial validation metrics") and that of the last step ("Final validation metrics", None
    when the last step does not validate)."""
    cadence = algorithm.cadence
    tracking = Tracking(
        list(logging.loggers),
        project=logging.project,
        experiment=logging.experiment,
        run_dir=Path(logging.run_dir),
        config=dict(logging.tree),
    )
    last: dict[str, float] = {}
    try:
        start = algorithm.resume()
        if cadence.val_before_train:
            last = algorithm.validate(start)
            print(f"Initial validation metrics: {last}", flush=True)
            log(algorithm, tracking, last, start)
            if cadence.val_only:
                return last
        if start >= cadence.total_steps:
            return last
        progress = tqdm(total=cadence.total_steps, initial=start, desc=algorithm.name, unit="step")
        done = start
        with StopRequest() as stop:
            try:
                for step, (epoch, batch) in enumerate(algorithm.batches(), start=start + 1):
                    last = run_step(algorithm, batch, step, epoch)
                    log(algorithm, tracking, last, step)
                    progress.update(1)
                    done = step
                    if step == start + 1:
                        elapsed = time.perf_counter() - created_at
                        print(f"jrl: time to first step: {elapsed:.1f}s", flush=True)
                    if step >= cadence.total_steps:
                        final = validation_part(last) if cadence.validates_at(step) else None
                        print(f"Final validation metrics: {final}", flush=True)
                        break
                    if any_process(stop.requested):
                        stop_after(
                            algorithm, step, stop.signal_name or "a signal to another process"
                        )
                        break
            except DataExhausted as end:
                if done > start:
                    stop_after(algorithm, done, f"the end of the data ({end})")
                else:
                    print(f"jrl: {end}; no step left to train after step {start}", flush=True)
        progress.close()
        return last
    finally:
        tracking.close()
        algorithm.checkpoints.close()
