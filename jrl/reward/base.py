"""`RewardManager`: the shared shell of the reward managers (verl's ``reward_manager`` classes).

A manager decodes a batch, scores each row (how is up to the subclass) and puts the row's reward
on its last valid response token; every other position is 0. Scores already in the batch
(``rm_scores``) are returned unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from transformers import PreTrainedTokenizerBase

from jrl.batch import Batch
from jrl.reward.guard import Call, ContainedFunction, Scored, checked_score
from jrl.reward.rows import ScoringRows, decode_rows
from jrl.reward.settings import ManagerOptions, NaiveOptions

ScoreFn = Callable[..., Any]


def score_calls(fn: ScoreFn, calls: Sequence[Call], sources: Sequence[Any]) -> list[Scored]:
    """``fn(*args, **kwargs)`` for each row's call, checked (`checked_score`).

    A user's function (`ContainedFunction`) runs contained: a fault scores its row 0 (or stops
    the run, under on_error=raise). A built-in scorer runs in this process, and its first bad
    row raises, naming the row and its data source.
    """
    if isinstance(fn, ContainedFunction):
        return fn.score_rows(calls, sources)
    results = []
    for row, (args, kwargs) in enumerate(calls):
        try:
            results.append(checked_score(fn(*args, **kwargs)))
        except Exception as err:
            raise RuntimeError(
                f"the reward function {getattr(fn, '__name__', fn)!r} failed on row {row} "
                f"(data_source {sources[row]!r}): {type(err).__name__}: {err}"
            ) from err
    return results


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
