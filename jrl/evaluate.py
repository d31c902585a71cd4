"""``python -m jrl.evaluate``: score generated responses offline (verl's evaluation script).

Usage::

    python -m jrl.evaluate --config=configs/eval.py data.path=gen.parquet [overrides ...]

Without ``--config`` the defaults of verl's evaluation config are used. The parquet file
``data.path`` (as written by ``python -m jrl.generate``) holds per row the prompt
(``data.prompt_key``, required but not scored), a list of responses
(``data.response_key``), the data source (``data.data_source_key``) and the reference
(``data.reward_model_key``, a struct with ``ground_truth``). Each response is scored by the
function of ``custom_reward_function.path`` / ``.name``, called as verl's evaluation calls it:
``compute_score(data_source, solution_str, ground_truth)``, positionally, with the
``reward_kwargs`` as keywords; without a path, by the built-in rule scorer of its data source
(`jrl.reward.default_compute_score`).

Printed as one JSON object (and returned by `main`), per data source:

- ``test_score/<data_source>``: the mean over rows of the mean score of the row's responses.
- ``pass@k/<data_source>``: with more than one response per row, the unbiased estimate of the
  chance that at least one of k responses drawn without replacement is correct, averaged over
  rows: 1 - C(n - c, k) / C(n, k) for n responses of which c are correct. A response is correct
  when its score is at least ``pass_at_k.threshold`` (1.0). ``pass_at_k.k`` lists the k to report
  (null: 1, 2, 4, ... up to the fewest responses of a row, and that number itself).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from jrl.config.entry import INPUT_ERRORS, load_entry_config, run_entry
from jrl.config.trees import EVALUATION
from jrl.data.files import local_path, read_parquet
from jrl.reward import default_compute_score, load_custom_reward_fn
from jrl.reward.base import score_calls
from jrl.runspec.eval_checks import validate_evaluation
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import custom_reward_function


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `n` responses of which `c` are correct (k <= n)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k} for n={n} responses")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to `n`, and `n` itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def _column(rows: Sequence[Mapping[str, Any]], key: str, config_key: str, path: str) -> list:
    if key not in rows[0]:
        raise KeyError(
            f"data.path: {path} has no column {key!r} ({config_key}); its columns are "
            f"{', '.join(rows[0])}"
        )
    return [row[key] for row in rows]


def score_rows(config: ConfigDict, rows: Sequence[Mapping[str, Any]], score_fn: Callable) -> list:
    """Per row (data source, scores of its responses)."""
    data, path = config.data, config.data.path
    _column(rows, data.prompt_key, "data.prompt_key", path)  # read, as verl reads it
    responses = _column(rows, data.response_key, "data.response_key", path)
    sources = _column(rows, data.data_source_key, "data.data_source_key", path)
    references = _column(rows, data.reward_model_key, "data.reward_model_key", path)
    out = []
    for i, (texts, source, reference) in enumerate(
        zip(responses, sources, references, strict=True)
    ):
        where = f"data.path: {path} row {i}"
        if isinstance(texts, str) or not isinstance(texts, Sequence | np.ndarray) or not len(texts):
            raise TypeError(
                f"{where}: {data.response_key!r} (data.response_key) must be a non-empty list of "
                f"responses, got {str(texts)[:200]}"
            )
        if not isinstance(reference, Mapping) or "ground_truth" not in reference:
            raise KeyError(
                f"{where}: {data.reward_model_key!r} (data.reward_model_key) must be a struct "
                f"with 'ground_truth', got {str(reference)[:200]}"
            )
        calls = [((source, text, reference["ground_truth"]), {}) for text in texts]
        scores = [s.value for s in score_calls(score_fn, calls, [source] * len(calls))]
        out.append((source, scores))
    return out


def summarise(scored_rows: Sequence[tuple[str, list[float]]], pass_cfg: Any) -> dict[str, float]:
    """``test_score/<source>`` and, with several responses per row, ``pass@k/<source>``."""
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for source, scores in scored_rows:
        by_source[source].append(scores)
    metrics: dict[str, float] = {}
    for source, rows in by_source.items():
        metrics[f"test_score/{source}"] = float(np.mean([np.mean(r) for r in rows]))
        fewest = min(len(r) for r in rows)
        if fewest < 2:
            continue
        ks = list(pass_cfg.k) if pass_cfg.k is not None else default_ks(fewest)
        too_many = [k for k in ks if k > fewest]
        if too_many:
            raise ValueError(
                f"pass_at_k.k={ks}: {too_many} exceed the {fewest} responses of some rows of "
                f"data source {source!r}; lower them or generate more responses"
            )
        for k in ks:
            correct = [sum(s >= pass_cfg.threshold for s in r) for r in rows]
            estimate = np.mean(
                [pass_at_k(len(r), c, k) for r, c in zip(rows, correct, strict=True)]
            )
            metrics[f"pass@{k}/{source}"] = float(estimate)
    return metrics


def evaluate(config: ConfigDict) -> dict[str, float]:
    """The metrics of the responses in ``data.path`` (see the module docstring)."""
    table = read_parquet(
        local_path(config.data.path, None, "data.path"), config.data.path, "data.path"
    )
    custom = custom_reward_function(KeyReads(config).custom_reward_function)
    score_fn = load_custom_reward_fn(custom) or default_compute_score
    return summarise(score_rows(config, table.to_pylist(), score_fn), config.pass_at_k)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Load the config, score, print the metrics as JSON; returns them."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return {}
    metrics = evaluate(load_entry_config(argv, EVALUATION, validate_evaluation))
    print(json.dumps(metrics, sort_keys=True), flush=True)
    return metrics


def cli() -> int:
    """Entry point: one-line errors and status 2 for bad configs, inputs and failing scorers."""
    return run_entry("jrl.evaluate", main, ((INPUT_ERRORS + (RuntimeError,), 2),))


if __name__ == "__main__":
    sys.exit(cli())
