"""`dapo` reward manager: naive scoring plus DAPO's soft penalty for over-long responses.

With ``reward_model.overlong_buffer.enable``, a response longer than ``max_resp_len - len``
tokens (``max_resp_len`` = data.max_response_length) loses ``exceed / len * penalty_factor``
(exceed = its length minus that threshold), a penalty that reaches ``penalty_factor`` at the
maximum length.
"""

from __future__ import annotations

from jrl.reward.base import RewardManager, Scored, call_scorer, scored
from jrl.reward.rows import ScoringRows
from jrl.reward.settings import DAPOOptions


class DAPORewardManager(RewardManager):
    """Scores rows one by one like `naive` on the response less a trailing EOS text; a plain
    float score is also reported as "acc". With the overlong buffer enabled the penalty is added
    to the reward (and reported as "overlong_reward" / "overlong" when it logs)."""

    Options = DAPOOptions
    options: DAPOOptions

    def score(self, rows: ScoringRows) -> list[Scored]:
        """compute_score per row, then the overlong penalty."""
        eos = self.tokenizer.eos_token
        buffer = self.options.overlong_buffer
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
                penalty = buffer.penalty(int(rows.response_lengths[i]), self.options.max_resp_len)
                value += penalty
                if buffer.log:
                    info.update(overlong_reward=penalty, overlong=penalty < 0)
            results.append(Scored(value, info))
        return results
