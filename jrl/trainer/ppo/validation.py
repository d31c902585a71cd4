"""Validation metrics under verl's names, and the validation samples shown to loggers.

Samples are grouped by data source and prompt (``uid``). For every numeric per-sample variable
(``reward``, ``acc``, extra reward fields) each prompt's n values give ``mean@n`` and, for n > 1,
``std@n`` and, for k in 2, 4, 8, .. (< n) and n, bootstrap estimates (1000 draws of k samples
with replacement, seed 42) of the best, worst and (when a ``pred`` field exists) majority-vote
value: ``best@k/mean``, ``best@k/std``, ``worst@k/..``, ``maj@k/..``. Prompts are then averaged.
The core variable (``acc`` if reported, else ``reward``) at the largest n is logged under
``val-core/<data_source>/<var>/<metric>`` for mean, maj and best; the rest under ``val-aux/``.
"""

from __future__ import annotations

import functools
import numbers
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 42
GENERATIONS_SEED = 42
ELEMENT_BUDGET = 1 << 22  # bootstrap entries held at once (draws x n per prompt)
CORE_METRICS = ("mean", "maj", "best")


def subset_sizes(n: int) -> list[int]:
    """Bootstrap subset sizes for n samples per prompt: 2, 4, 8, .. below n, then n."""
    if n <= 1:
        return []
    sizes = [2**p for p in range(1, n.bit_length()) if 2**p < n]
    return [*sizes, n]


@functools.cache
def bootstrap_indices(n: int, size: int) -> np.ndarray:
    """[N_BOOTSTRAP, size] sample indices drawn with replacement from a stream seeded with 42
    (the same draws for every prompt with n samples, as verl reseeds before each bootstrap)."""
    draws = np.random.RandomState(BOOTSTRAP_SEED).choice(n, size=(N_BOOTSTRAP, size))
    draws.setflags(write=False)
    return draws


def answer_codes(votes: Sequence[Any]) -> list[int]:
    """Each vote as a small integer: equal votes share a code, codes are below len(votes)."""
    seen: dict[Any, int] = {}
    return [seen.setdefault(vote, len(seen)) for vote in votes]


def majority_values(values: np.ndarray, codes: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """[P, D]: per prompt and draw, the value of the first drawn sample voting for the most common
    answer; count ties go to the answer drawn first. `values`, `codes` are [P, n], `draws` [D, k].
    """
    n = values.shape[1]
    drawn = codes[:, draws].reshape(-1, draws.shape[1])
    offsets = n * np.arange(drawn.shape[0])[:, None]
    counts = np.bincount((drawn + offsets).ravel(), minlength=drawn.shape[0] * n)
    per_sample = np.take_along_axis(counts.reshape(-1, n), drawn, axis=1)
    first = np.argmax(per_sample == per_sample.max(axis=1, keepdims=True), axis=1)
    sample = draws[np.tile(np.arange(draws.shape[0]), values.shape[0]), first]
    return np.take_along_axis(values, sample.reshape(values.shape[0], -1), axis=1)


def prompt_metrics(values: np.ndarray, codes: np.ndarray | None) -> dict[str, np.ndarray]:
    """Per prompt ([P] arrays): mean@n, std@n and the best/worst/maj bootstrap statistics of
    `values` [P, n]; maj only with answer `codes` [P, n]."""
    n = values.shape[1]
    metrics = {f"mean@{n}": values.mean(axis=1)}
    if n == 1:
        return metrics
    metrics[f"std@{n}"] = values.std(axis=1)
    for k in subset_sizes(n):
        draws = bootstrap_indices(n, k)
        picked = values[:, draws]
        stats = {"best": picked.max(axis=2), "worst": picked.min(axis=2)}
        if codes is not None:
            stats["maj"] = majority_values(values, codes, draws)
        for name, per_draw in stats.items():
            metrics[f"{name}@{k}/mean"] = per_draw.mean(axis=1)
            metrics[f"{name}@{k}/std"] = per_draw.std(axis=1)
    return metrics


def process_validation_metrics(
    data_sources: Sequence[Any], uids: Sequence[Any], infos: Mapping[str, Sequence[Any]]
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {variable: {metric: value averaged over prompts}}}``.

    `infos` maps variable names to one value per sample; string-valued variables (such as
    ``pred``) get no metrics of their own, and ``pred`` supplies the majority votes.
    """
    prompts: dict[tuple[str, str, int], list[tuple[np.ndarray, list[int] | None]]]
    prompts = defaultdict(list)
    for (source, _), rows in _group_rows(data_sources, uids, infos).items():
        codes = answer_codes([infos["pred"][i] for i in rows]) if "pred" in infos else None
        for name, column in infos.items():
            raw = [column[i] for i in rows]
            if not isinstance(raw[0], str):
                prompts[source, name, len(rows)].append((_numeric(name, raw), codes))
    collected: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for (source, name, n), group in prompts.items():
        step = max(1, ELEMENT_BUDGET // (N_BOOTSTRAP * n))
        for start in range(0, len(group), step):
            chunk = group[start : start + step]
            values = np.stack([v for v, _ in chunk])
            codes = None if chunk[0][1] is None else np.array([c for _, c in chunk])
            for metric, per_prompt in prompt_metrics(values, codes).items():
                collected[source][name][metric].extend(per_prompt.tolist())
    return {
        source: {
            name: {metric: float(np.mean(vals)) for metric, vals in metrics.items()}
            for name, metrics in variables.items()
        }
        for source, variables in collected.items()
    }


def _group_rows(
    data_sources: Sequence[Any], uids: Sequence[Any], infos: Mapping[str, Sequence[Any]]
) -> dict[tuple[str, Any], list[int]]:
    rows = len(data_sources)
    if len(uids) != rows:
        raise ValueError(f"validation: {len(uids)} uids for {rows} samples (data_source)")
    for name, column in infos.items():
        if len(column) != rows:
            raise ValueError(
                f"validation: variable {name!r} has {len(column)} values for {rows} samples; "
                "each reward field needs one value per sample"
            )
    groups: dict[tuple[str, Any], list[int]] = defaultdict(list)
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        groups[str(source), uid].append(i)
    return groups


def _numeric(name: str, raw: list[Any]) -> np.ndarray:
    bad = [v for v in raw if not isinstance(v, (numbers.Number, np.bool_))]
    if bad:
        raise ValueError(
            f"validation: variable {name!r} mixes numbers with {bad[0]!r}; a reward function "
            "must report a number (or a string) for every sample"
        )
    return np.asarray(raw, dtype=np.float64)


def _subset_size(metric: str) -> int:
    return int(metric.split("@")[-1].split("/")[0])


def validation_metrics(
    data_sources: Sequence[Any], uids: Sequence[Any], infos: Mapping[str, Sequence[Any]]
) -> dict[str, float]:
    """Flat ``val-core/..`` and ``val-aux/<data_source>/<var>/<metric>`` validation metrics."""
    flat: dict[str, float] = {}
    for source, variables in process_validation_metrics(data_sources, uids, infos).items():
        core_var = "acc" if "acc" in variables else "reward"
        for name, metrics in variables.items():
            n_max = max(_subset_size(metric) for metric in metrics)
            for metric, value in metrics.items():
                core = (
                    name == core_var
                    and metric.startswith(CORE_METRICS)
                    and _subset_size(metric) == n_max
                )
                flat[f"{'val-core' if core else 'val-aux'}/{source}/{name}/{metric}"] = value
    return flat


def select_val_generations(
    inputs: Sequence[str],
    outputs: Sequence[str],
    scores: Sequence[float],
    step: int,
    count: int,
) -> list[dict[str, Any]]:
    """The `count` (``trainer.log_val_generations``) validation samples shown to loggers.

    Samples are sorted by input text (stably), shuffled with a fixed seed (42) and cut to the
    first `count`, so the same prompts are shown at every step. Rows are
    ``{"input", "output", "score", "step"}``.
    """
    if count < 0:
        raise ValueError(f"trainer.log_val_generations must be >= 0, got {count}")
    if not len(inputs) == len(outputs) == len(scores):
        raise ValueError(
            f"validation samples disagree: {len(inputs)} inputs, {len(outputs)} outputs, "
            f"{len(scores)} scores"
        )
    by_input = sorted(range(len(inputs)), key=lambda i: inputs[i])
    shuffled = np.random.RandomState(GENERATIONS_SEED).permutation(len(by_input))
    return [
        {"input": inputs[i], "output": outputs[i], "score": float(scores[i]), "step": step}
        for i in (by_input[j] for j in shuffled[:count])
    ]
