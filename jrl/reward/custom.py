"""Custom reward functions: ``custom_reward_function.path`` / ``.name`` (+ ``.reward_kwargs``),
resolved into `CustomRewardFunction`."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jrl.data.extern import PKG_PREFIX, load_object
from jrl.reward.guard import ContainedFunction
from jrl.reward.settings import CustomRewardFunction

ScoreFn = Callable[..., Any]
CONFIG_KEY = "custom_reward_function"


class FileFunction:
    """A function loaded from a Python file (or ``pkg://module``), called with fixed keywords.

    `fixed_kwargs` win over the caller's keywords; a coroutine result is run to completion. It
    pickles as its location and name, so a spawned worker process loads the file again.
    """

    def __init__(self, location: str, name: str, fixed_kwargs: Mapping[str, Any] | None = None):
        if not location.startswith(PKG_PREFIX):
            location = str(Path(location.removeprefix("file://")).expanduser().resolve())
        self.location = location
        self.name = name
        self.fixed_kwargs = dict(fixed_kwargs or {})
        self._fn = self._load()

    def _load(self) -> ScoreFn:
        fn = load_object(self.location, self.name, CONFIG_KEY)
        if not callable(fn):
            raise AttributeError(
                f"{CONFIG_KEY}.name={self.name!r} in {self.location!r} is not a function"
            )
        return fn

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "name": self.name, "fixed_kwargs": self.fixed_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fn = self._load()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._fn(*args, **{**kwargs, **self.fixed_kwargs})
        return asyncio.run(result) if inspect.iscoroutine(result) else result

    def __repr__(self) -> str:
        return f"FileFunction({self.location!r}, {self.name!r})"


def load_custom_reward_fn(settings: CustomRewardFunction | None) -> ContainedFunction | None:
    """The custom_reward_function `settings`' function (None: none is set), contained: its
    calls run in worker processes under the time limit, its faults are counted. Its kwargs are
    passed to every call (they win over the caller's)."""
    if settings is None:
        return None
    fn = ContainedFunction.of(FileFunction(settings.path, settings.name, settings.kwargs), settings)
    print(
        f"jrl: reward function {settings.name!r} from {fn.fn.location}: {fn.num_workers} worker "
        f"processes, {settings.timeout:g} s per call, on_error={settings.on_error}"
    )
    return fn
