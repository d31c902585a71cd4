"""The reward's settings, resolved once from verl's keys (by `jrl.runspec.reward`).

`RewardSettings` says which manager scores a batch (a built-in one of `REWARD_MANAGERS` with its
typed options, or a user's class from a file), the custom scoring function if any, and the meta
field holding each row's data source. Imports no jax and no manager, so the resolver and the
checks can ask for the names without building anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

# Where the manager class comes from (``reward_manager.source``).
SOURCES = ("register", "importlib")
_KWARGS_KEY = "reward_model.reward_kwargs"


def check_option_names(manager: str, known: Iterable[str], given: Iterable[str]) -> None:
    """Raises ValueError when `given` (reward_model.reward_kwargs) names an option that the
    `manager` does not take (`known`)."""
    known = list(known)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(
            f"{_KWARGS_KEY} {unknown} are not options of the {manager!r} reward manager; its "
            f"options are {', '.join(known) or 'none'}"
        )


@dataclasses.dataclass(frozen=True)
class ManagerOptions:
    """A built-in manager's own options: the fields, set from reward_model.reward_kwargs."""

    @classmethod
    def from_kwargs(cls, manager: str, kwargs: Mapping[str, Any]) -> ManagerOptions:
        """The options named in `kwargs`; one that is not a field is refused."""
        check_option_names(manager, (f.name for f in dataclasses.fields(cls)), kwargs)
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class NaiveOptions(ManagerOptions):
    """`naive` takes no options."""


@dataclasses.dataclass(frozen=True)
class BatchOptions(ManagerOptions):
    """`batch`: every reward_model.reward_kwargs item is passed to each call of the function."""

    scorer_kwargs: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def from_kwargs(cls, manager: str, kwargs: Mapping[str, Any]) -> BatchOptions:
        """All of `kwargs`, for the scoring function."""
        return cls(MappingProxyType(dict(kwargs)))


@dataclasses.dataclass(frozen=True)
class PrimeOptions(ManagerOptions):
    """`prime`: `timeout` seconds per row (> 0) and `num_processes` worker processes (None or
    0: the CPU count, at most 64)."""

    timeout: float = 300.0
    num_processes: int | None = None

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(
                f"{_KWARGS_KEY}.timeout must be positive (seconds per row), got {self.timeout}"
            )


@dataclasses.dataclass(frozen=True)
class OverlongBuffer:
    """reward_model.overlong_buffer: DAPO's soft penalty over the last `len` tokens.

    A response of `length` tokens past ``max_resp_len - len`` loses
    ``(length - (max_resp_len - len)) / len * penalty_factor``; `log` reports it per row.
    """

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False

    def penalty(self, length: int, max_resp_len: int) -> float:
        """The (non-positive) reward added to a response of `length` tokens."""
        exceed = length - (max_resp_len - self.len)
        return min(-exceed / self.len * self.penalty_factor, 0.0)


VERL_BUFFER_NAME = "overlong_buffer_cfg"  # verl's DAPO manager's argument for the buffer


@dataclasses.dataclass(frozen=True)
class DAPOOptions(ManagerOptions):
    """`dapo`: `max_resp_len` (data.max_response_length) and the `overlong_buffer`; an enabled
    buffer needs ``0 < len <= max_resp_len``."""

    max_resp_len: int | None = None
    overlong_buffer: OverlongBuffer = OverlongBuffer()

    @classmethod
    def from_kwargs(cls, manager: str, kwargs: Mapping[str, Any]) -> DAPOOptions:
        """The options of `kwargs`, verl's argument name ``overlong_buffer_cfg`` (what verl's
        ``main_ppo`` scripts set under reward_kwargs) read as `overlong_buffer`."""
        kwargs = dict(kwargs)
        if VERL_BUFFER_NAME in kwargs:
            kwargs["overlong_buffer"] = kwargs.pop(VERL_BUFFER_NAME)
        return super().from_kwargs(manager, kwargs)

    def __post_init__(self) -> None:
        buffer = self.overlong_buffer
        if isinstance(buffer, Mapping):
            buffer = OverlongBuffer(**buffer)
            object.__setattr__(self, "overlong_buffer", buffer)
        if not buffer.enable:
            return
        if self.max_resp_len is None:
            raise ValueError(
                "reward_model.overlong_buffer.enable needs the maximum response length "
                "(data.max_response_length)"
            )
        if not 0 < buffer.len <= self.max_resp_len:
            raise ValueError(
                f"reward_model.overlong_buffer.len={buffer.len} must be in "
                f"(0, data.max_response_length={self.max_resp_len}]"
            )


# Each built-in manager's name and the type of its options.
REWARD_MANAGERS: Mapping[str, type[ManagerOptions]] = MappingProxyType(
    {"naive": NaiveOptions, "prime": PrimeOptions, "batch": BatchOptions, "dapo": DAPOOptions}
)


@dataclasses.dataclass(frozen=True)
class BuiltInManager:
    """A manager of `REWARD_MANAGERS`: its `name` and its `options`."""

    name: str
    options: ManagerOptions


@dataclasses.dataclass(frozen=True)
class UserManager:
    """``reward_manager.source=importlib``: class `name` of the file (or ``pkg://module``) at
    `path`, built with verl's arguments (tokenizer, num_examine, compute_score, reward_fn_key)
    and `kwargs` (reward_model.reward_kwargs)."""

    path: str | None
    name: str
    kwargs: Mapping[str, Any]


# What a fault of a user's reward function does (custom_reward_function.on_error).
ON_ERROR = ("zero", "raise")


@dataclasses.dataclass(frozen=True)
class CustomRewardFunction:
    """custom_reward_function: function `name` of the file (or ``pkg://module``) at `path`;
    `kwargs` are added to every call and win over the caller's.

    It runs contained (`jrl.reward.guard`): in `num_workers` worker processes (0: up to 4),
    `timeout` seconds per call; `on_error` says what a fault does ("zero": the row scores 0
    and is counted; "raise": the run stops).
    """

    path: str
    name: str
    kwargs: Mapping[str, Any]
    timeout: float = 60.0
    num_workers: int = 0
    on_error: str = "zero"

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(
                f"custom_reward_function.timeout must be positive (seconds per call), got "
                f"{self.timeout}"
            )
        if self.num_workers < 0:
            raise ValueError(
                f"custom_reward_function.num_workers must be >= 0 (0: up to 4), got "
                f"{self.num_workers}"
            )
        if self.on_error not in ON_ERROR:
            raise ValueError(
                f"custom_reward_function.on_error must be one of {ON_ERROR}, got {self.on_error!r}"
            )


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    """How rule rewards are computed: the `manager`, the `custom_function` it scores with (None:
    the manager's default) and `reward_fn_key`, the meta field naming each row's data source."""

    manager: BuiltInManager | UserManager
    custom_function: CustomRewardFunction | None
    reward_fn_key: str
