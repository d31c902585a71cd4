"""`dapo` reward manager: naive scoring plus DAPO's soft penalty for over-long responses.

With ``reward_model.overlong_buffer.enable``, a response longer than ``max_resp_len - len``
tokens (``max_resp_len`` = data.max_response_length) loses ``exceed / len * penalty_factor``
(exceed = its length minus that threshold), a penalty that reaches ``penalty_factor`` at the
maximum length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jrl.reward.base import RewardManager, Scored, ScoreFn, call_scorer, scored
from jrl.reward.rows import ScoringRows


@dataclasses.dataclass(frozen=True)
class OverlongBuffer:
    """reward_model.overlong_buffer: enable, len (tokens), penalty_factor, log."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False

    @classmethod
    def from_config(cls, section: Any) -> OverlongBuffer:
        """From a config section or dict; absent keys keep their defaults."""
        if section is None:
            return cls()
        if isinstance(section, OverlongBuffer):
            return section

        def read(name: str, default: Any) -> Any:
            if isinstance(section, Mapping):
                return section.get(name, default)
            return getattr(section, name, default)

        return cls(**{f.name: read(f.name, f.default) for f in dataclasses.fields(cls)})

    def penalty(self, length: int, max_resp_len: int) -> float:
        """The (non-positive) reward added to a response of `length` tokens."""
        exceed = length - (max_resp_len - self.len)
        return min(-exceed / self.len * self.penalty_factor, 0.0)


class DAPORewardManager(RewardManager):
    """Scores rows one by one like `naive` on the response less a trailing EOS text; a plain
    float score is also reported as "acc". With the overlong buffer enabled the penalty is added
    to the reward (and reported as "overlong_reward" / "overlong" when it logs)."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: ScoreFn | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer: OverlongBuffer | Any = None,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.max_resp_len = max_resp_len
        self.overlong_buffer = OverlongBuffer.from_config(overlong_buffer)
        if self.overlong_buffer.enable:
            if max_resp_len is None:
                raise ValueError(
                    "reward_model.overlong_buffer.enable needs the maximum response length "
                    "(data.max_response_length)"
                )
            if not 0 < self.overlong_buffer.len <= max_resp_len:
                raise ValueError(
                    f"reward_model.overlong_buffer.len={self.overlong_buffer.len} must be in "
                    f"(0, data.max_response_length={max_resp_len}]"
                )

    @classmethod
    def from_config(
        cls,
        config: Any,
        tokenizer: Any,
        num_examine: int,
        compute_score: ScoreFn | None,
        reward_fn_key: str,
        **kwargs: Any,
    ) -> DAPORewardManager:
        """Reads data.max_response_length and reward_model.overlong_buffer (absent: disabled)."""
        kwargs.setdefault("max_resp_len", int(config.data.max_response_length))
        kwargs.setdefault("overlong_buffer", getattr(config.reward_model, "overlong_buffer", None))
        return cls(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)

    def score(self, rows: ScoringRows) -> list[Scored]:
        """compute_score per row, then the overlong penalty."""
        eos = self.tokenizer.eos_token
        buffer = self.overlong_buffer
        results = []
        for i, source in enumerate(rows.data_sources):
            response = rows.responses[i]
            if eos and response.endswith(eos):
                response = response[: -len(eos)]
            result = call_scorer(
                self.compute_score,
                i,
                data_source=source,
                solution_str=response,
                ground_truth=rows.ground_truths[i],
                extra_info=rows.extra_infos[i],
            )
            value, info = scored(result, i, source)
            info = dict(info) or {"acc": value}
            if buffer.enable:
                penalty = buffer.penalty(int(rows.response_lengths[i]), self.max_resp_len)
                value += penalty
                if buffer.log:
                    info.update(overlong_reward=penalty, overlong=penalty < 0)
            results.append(Scored(value, info))
        return results
