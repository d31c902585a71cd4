"""`RewardManager`: the shared shell of the reward managers (verl's ``reward_manager`` classes).

A manager decodes a batch, scores each row (how is up to the subclass) and puts the row's reward
on its last valid response token; every other position is 0. Scores already in the batch
(``rm_scores``) are returned unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
from transformers import PreTrainedTokenizerBase

from jrl.batch import Batch
from jrl.reward.rows import ScoringRows, decode_rows
from jrl.reward.settings import ManagerOptions, NaiveOptions

ScoreFn = Callable[..., Any]


class Scored(NamedTuple):
    """One row's reward and the extra values reported for it (reward_extra_info)."""

    value: float
    info: Mapping[str, Any]


def scored(result: Any, row: int, data_source: Any) -> Scored:
    """A scorer's result as `Scored`: a number, or a dict holding "score" (all keys reported)."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise KeyError(
                f"the reward function returned a dict without 'score' for row {row} "
                f"(data_source {data_source!r}): keys {sorted(result)}"
            )
        return Scored(float(result["score"]), dict(result))
    return Scored(float(result), {})


def call_scorer(fn: ScoreFn, row: int, /, **kwargs: Any) -> Any:
    """`fn(**kwargs)` for one row; an exception is re-raised naming the row and data source."""
    try:
        return fn(**kwargs)
    except Exception as err:
        raise RuntimeError(
            f"the reward function {getattr(fn, '__name__', fn)!r} failed on row {row} "
            f"(data_source {kwargs.get('data_source')!r}): {type(err).__name__}: {err}"
        ) from err


class RewardManager:
    """Base of the reward managers; subclasses implement `score`.

    Args:
      tokenizer: decodes prompts and responses (special tokens skipped).
      num_examine: how many decoded examples to print per data source on each call.
      compute_score: the scoring function (None: the manager's default).
      reward_fn_key: the meta field holding each row's data source (data.reward_fn_key).
      options: the manager's own options (None: `Options`' defaults).
    """

    Options: ClassVar[type[ManagerOptions]] = NaiveOptions

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        num_examine: int,
        compute_score: ScoreFn | None = None,
        reward_fn_key: str = "data_source",
        options: ManagerOptions | None = None,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or self.default_compute_score()
        self.reward_fn_key = reward_fn_key
        self.options = self.Options() if options is None else options

    @staticmethod
    def default_compute_score() -> ScoreFn:
        """The scoring function used when none is given: `default_compute_score`."""
        from jrl.reward.default import default_compute_score

        return default_compute_score

    def score(self, rows: ScoringRows) -> list[Scored]:
        """One `Scored` per row."""
        raise NotImplementedError

    def __call__(self, batch: Batch, return_dict: bool = False) -> np.ndarray | dict[str, Any]:
        """Token-level scores float32 [B, R] (or ``{"reward_tensor", "reward_extra_info"}``).

        A row with an empty response gets no score anywhere (its row stays 0).
        """
        if "rm_scores" in batch.tensors:
            scores = np.asarray(batch.tensors["rm_scores"], np.float32)
            return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores
        rows = decode_rows(batch, self.tokenizer, self.reward_fn_key)
        results = self.score(rows)
        if len(results) != len(rows):
            raise ValueError(
                f"{type(self).__name__} returned {len(results)} scores for {len(rows)} rows"
            )
        reward = np.zeros(np.shape(batch["responses"]), np.float32)
        for i, (result, length) in enumerate(zip(results, rows.response_lengths, strict=True)):
            if length > 0:
                reward[i, length - 1] = result.value
        self._show(rows, results)
        if not return_dict:
            return reward
        keys = list(dict.fromkeys(k for r in results for k in r.info))
        extra = {k: [r.info.get(k) for r in results] for k in keys}
        return {"reward_tensor": reward, "reward_extra_info": extra}

    def _show(self, rows: ScoringRows, results: list[Scored]) -> None:
        shown: Counter[Any] = Counter()
        for i, result in enumerate(results):
            source = rows.data_sources[i]
            if shown[source] >= self.num_examine:
                continue
            shown[source] += 1
            print("[prompt]", rows.prompts[i])
            print("[response]", rows.responses[i])
            print("[ground_truth]", rows.ground_truths[i])
            print("[score]", result.value)
            for key, value in result.info.items():
                if key != "score":
                    print(f"[{key}]", value)
