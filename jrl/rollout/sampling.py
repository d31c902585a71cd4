"""Sampling parameters: how the engines pick tokens (the settings of a rollout's training and
validation sampling; `jrl.runspec.rollout` reads them from verl's keys). No JAX here: the token
selection itself is `jrl.rollout.selection`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jrl.config.errors import check_settings

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the sampler picks tokens; hashable, so it can be a static `jit` argument.

    `top_k` of -1 or 0 and `top_p` of 1 switch those filters off. Sampling is greedy when
    `do_sample` is false or `temperature` is 0. `logprobs_mode` names the log-probs returned
    with `calculate_log_probs`, as vLLM does: `processed_logprobs`, those of the distribution
    sampled from (logits / temperature, top-k and top-p applied, renormalised; greedy: of the
    logits at `log_prob_temperature`), or `raw_logprobs`, log_softmax of the model's logits.
    """

    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    n: int = 1
    ignore_eos: bool = False
    calculate_log_probs: bool = False
    logprobs_mode: str = "processed_logprobs"

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", as_token_ids(self.eos_token_ids))
        rules = {
            "max_new_tokens": (self.max_new_tokens >= 1, "must be at least 1"),
            "temperature": (self.temperature >= 0, "must be >= 0 (0 means greedy)"),
            "top_k": (self.top_k >= -1, "must be -1 or 0 (off) or a positive count"),
            "top_p": (0 < self.top_p <= 1, "must be in (0, 1] (1 means off)"),
            "n": (self.n >= 1, "must be at least 1"),
            "logprobs_mode": (
                self.logprobs_mode in LOGPROBS_MODES,
                f"is not supported (jrl keeps log-probs, not logits); use one of "
                f"{', '.join(LOGPROBS_MODES)}",
            ),
        }
        check_settings(self, rules)

    @property
    def greedy(self) -> bool:
        """True when tokens are picked by argmax."""
        return not self.do_sample or self.temperature == 0

    @property
    def log_prob_temperature(self) -> float:
        """The temperature that divides logits for log-probs (1 for greedy at temperature 0)."""
        return self.temperature if self.temperature > 0 else 1.0


def as_token_ids(ids: int | Iterable[int] | None) -> tuple[int, ...]:
    """Token ids as a tuple of ints (None means none; one int means one)."""
    if ids is None:
        return ()
    if isinstance(ids, int):
        return (ids,)
    return tuple(int(i) for i in ids)
