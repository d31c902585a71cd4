"""What verl's reward keys become: `RewardSettings` (`jrl.reward.settings`).

- The manager: ``reward_model.reward_manager`` (v0.6's key; 'naive' when null), or current
  verl's ``reward_manager.name`` where it is set to another name (`manager_name`); with
  ``reward_manager.source=importlib`` the user's class ``reward_manager.module.path`` / ``.name``.
- Its options: ``reward_model.reward_kwargs``; `dapo` also reads ``data.max_response_length``
  and ``reward_model.overlong_buffer`` (reward_kwargs of the same names win).
- The scoring function: ``custom_reward_function.path`` / ``.name`` ('compute_score' when null)
  / ``.reward_kwargs``; no path: the manager's default.
- ``data.reward_fn_key`` ('data_source' when null).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

from jrl.config.errors import ConfigError
from jrl.reward.settings import (
    REWARD_MANAGERS,
    SOURCES,
    BuiltInManager,
    CustomRewardFunction,
    RewardSettings,
    UserManager,
)
from jrl.runspec.reads import KeyReads


def _not_one_of(key: str, value: object, allowed: tuple[str, ...] | list[str]) -> str:
    """The problem of `key` set to `value`, which is none of `allowed`."""
    return f"{key}={value!r} is not supported; use one of {', '.join(allowed)}"


def manager_name(config: Any) -> tuple[str, str]:
    """(key, name) of the built-in reward manager: ``reward_manager.name`` (current verl's key)
    where it is set to something else than v0.6's ``reward_model.reward_manager`` (which it
    follows by default), else that key ('naive' when null)."""
    legacy = config.reward_model.reward_manager or "naive"
    name = config.reward_manager.name
    if name is not None and name != legacy:
        return "reward_manager.name", name
    return "reward_model.reward_manager", legacy


def reward_manager_problems(config: Any) -> Iterator[str]:
    """``reward_manager.source`` and the built-in manager it selects (`manager_name`)."""
    source = config.reward_manager.source or "register"
    key, name = manager_name(config)
    if source not in SOURCES:
        yield _not_one_of("reward_manager.source", source, SOURCES)
    elif source == "register" and name not in REWARD_MANAGERS:
        yield _not_one_of(key, name, list(REWARD_MANAGERS))
    elif source == "importlib" and not config.reward_manager.module.path:
        yield (
            "reward_manager.source=importlib loads the manager from reward_manager.module.path, "
            f"which is not set; give the file that defines {config.reward_manager.module.name!r}"
        )


def custom_reward_function(section: KeyReads) -> CustomRewardFunction | None:
    """A ``custom_reward_function`` section's function, or None when no path is set."""
    if not section.path:
        for key in ("name", "timeout", "num_workers", "on_error"):
            section.skip(key, "custom_reward_function.path is not set")
        return None
    return CustomRewardFunction(
        path=section.path,
        name=section.name or "compute_score",
        kwargs=MappingProxyType(section.reward_kwargs.whole()),
        timeout=float(section.timeout),
        num_workers=int(section.num_workers or 0),
        on_error=section.on_error,
    )


def _manager(config: KeyReads) -> BuiltInManager | UserManager:
    kwargs = config.reward_model.reward_kwargs.whole()
    section = config.reward_manager
    if section.source == "importlib":
        module = section.module
        return UserManager(module.path, module.name, MappingProxyType(kwargs))
    section.skip("module", "reward_manager.source is not importlib")
    name = manager_name(config)[1]
    if name != "dapo":
        config.reward_model.skip("overlong_buffer", "the dapo reward manager's option")
    else:
        own = {
            "max_resp_len": int(config.data.max_response_length),
            "overlong_buffer": config.reward_model.overlong_buffer.whole(),
        }
        kwargs = {**own, **kwargs}
    return BuiltInManager(name, REWARD_MANAGERS[name].from_kwargs(name, kwargs))


def reward_settings(config: KeyReads) -> RewardSettings:
    """The RewardSettings of a PPO-family config; a bad manager choice raises ConfigError."""
    problems = list(reward_manager_problems(config))
    if problems:
        raise ConfigError("; ".join(problems))
    return RewardSettings(
        manager=_manager(config),
        custom_function=custom_reward_function(config.custom_reward_function),
        reward_fn_key=config.data.reward_fn_key or "data_source",
    )
