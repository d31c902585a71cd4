"""verl's rollout traces (``rollout.trace.*``): every traced trajectory is one mlflow trace.

Its root span ``agent_loop`` carries verl's tags (``step``, ``sample_index``, ``rollout_n``,
``validate``, ``experiment_name``); under it, the loop's ``run`` (the row's fields in, the
trajectory out), each model turn (``generate``: prompt ids and sampling in, token ids out) and
each tool or interaction call (its arguments in, its answer out). With ``token2text`` the
token ids' decoded text goes next to them (``prompt_text``, ``response_text``).

Traces go to ``$MLFLOW_TRACKING_URI`` when it is set, else to the run's own mlflow file store
``<run_dir>/mlruns`` (where the mlflow logger writes), in the experiment named after
``trainer.project_name``; only process 0 writes them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jrl.agent.settings import TraceSettings

# Whether the running task's trajectory is traced (spans open only inside one).
_TRACED: contextvars.ContextVar[bool] = contextvars.ContextVar("jrl_traced", default=False)


def _ignore(outputs: Any) -> None:
    """What an untraced span does with its outputs."""


def jsonable(value: Any) -> Any:
    """`value` as JSON data: arrays as lists, mappings and sequences item by item, anything
    else that is not a plain value as its text."""
    if isinstance(value, np.ndarray | np.generic):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class RolloutTracer:
    """Writes the traced trajectories of a run (`settings`) with `tokenizer` for their text,
    `project` and `experiment` naming them, to the mlflow store at `tracking_uri` (the run's,
    `jrl.trainer.io.tracking.mlflow_store_uri`); writes nothing without a backend or off
    process 0 (not `writer`)."""

    def __init__(
        self,
        settings: TraceSettings,
        tokenizer: Any = None,
        *,
        project: str = "jrl",
        experiment: str = "",
        tracking_uri: str = "",
        writer: bool = True,
    ):
        self.settings, self.tokenizer, self.experiment = settings, tokenizer, experiment
        self._mlflow: Any = None
        if settings.backend == "mlflow" and writer:
            import mlflow  # an optional dependency, needed only by a run that traces

            chosen = "MLFLOW_TRACKING_URI" in os.environ
            mlflow.set_tracking_uri(tracking_uri)
            if not chosen:  # mlflow exports it; the next run's own store is not this one
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            mlflow.tracing.reset()  # its exporter took the URI when first used
            mlflow.set_experiment(project)
            self._mlflow = mlflow

    @property
    def on(self) -> bool:
        return self._mlflow is not None

    def chosen(self, sample_ids: Sequence[Any], seed: int) -> set[int]:
        """The rows to trace: all, or every row of `max_samples_per_step_per_worker` sample
        ids drawn at random (with `seed`) from the distinct `sample_ids`."""
        if not self.on:
            return set()
        limit = self.settings.max_samples_per_step_per_worker
        distinct = sorted(set(map(str, sample_ids)))
        if limit is None or limit >= len(distinct):
            return set(range(len(sample_ids)))
        rng = np.random.default_rng(seed % 2**32)
        picked = set(rng.choice(distinct, limit, replace=False).tolist())
        return {i for i, sample in enumerate(sample_ids) if str(sample) in picked}

    @contextlib.contextmanager
    def trajectory(self, traced: bool, **tags: Any) -> Iterator[None]:
        """The root span of one trajectory (when `traced`), tagged with `tags`."""
        if not (self.on and traced):
            yield
            return
        with self._mlflow.start_span(name="agent_loop") as span:
            for name, value in {**tags, "experiment_name": self.experiment}.items():
                self._mlflow.set_trace_tag(span.trace_id, name, str(value))
            token = _TRACED.set(True)
            try:
                yield
            finally:
                _TRACED.reset(token)

    @contextlib.contextmanager
    def span(self, name: str, inputs: Mapping[str, Any]) -> Iterator[Callable[[Any], None]]:
        """A span of the current trajectory (none outside a traced one); yields the function
        that records its outputs."""
        if not (self.on and _TRACED.get()):
            yield _ignore
            return
        with self._mlflow.start_span(name=name) as span:
            span.set_inputs(jsonable(inputs))
            yield lambda outputs: span.set_outputs(jsonable(outputs))

    def texts(self, **token_ids: Sequence[int]) -> dict[str, str]:
        """With ``token2text``, ``<name>_text`` for each ``<name>_ids`` given (else nothing)."""
        if not (self.settings.token2text and self.tokenizer is not None):
            return {}
        return {
            name.removesuffix("_ids") + "_text": self.tokenizer.decode(list(ids))
            for name, ids in token_ids.items()
        }

    def flush(self) -> None:
        """Write out the traces still queued."""
        if self.on and hasattr(self._mlflow, "flush_trace_async_logging"):
            self._mlflow.flush_trace_async_logging()


NO_TRACES = RolloutTracer(TraceSettings())
