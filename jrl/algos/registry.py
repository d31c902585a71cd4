"""Name -> function registries for advantage estimators and policy losses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Functions looked up by the name a config uses (e.g. `algorithm.adv_estimator`)."""

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding a function under `name`; a different function may not reuse a name."""
        key = _name(name)

        def decorator(fn: F) -> F:
            existing = self._entries.get(key)
            if existing is not None and existing is not fn:
                raise ValueError(
                    f"{self.kind} {key!r} is already registered ({existing.__qualname__}); "
                    "choose another name"
                )
            self._entries[key] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered under `name`; an unknown name lists the known ones."""
        key = _name(name)
        if key not in self._entries:
            raise ValueError(
                f"Unknown {self.kind} {key!r} (set by {self.config_key}); "
                f"registered: {', '.join(sorted(self._entries))}"
            )
        return self._entries[key]

    def is_built_in(self, name: str) -> bool:
        """Whether `name` is registered by jrl itself (not by a user's module)."""
        fn = self._entries.get(_name(name))
        return fn is not None and fn.__module__.split(".")[0] == "jrl"

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)


def _name(name: object) -> str:
    """Accept plain strings and string enums alike."""
    return str(getattr(name, "value", name))
