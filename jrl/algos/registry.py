"""Name -> entry registries: verl's single-batch policy losses (entries are the functions), the
per-token policy losses and the advantage estimators (entries are descriptors holding the
function, `jrl.algos.policy_loss` and `jrl.algos.estimator`).

A registry imports the modules that register jrl's own entries on its first lookup, so it is
complete however it was reached (the package's names are imported lazily, `jrl.lazy`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

E = TypeVar("E")
F = TypeVar("F", bound=Callable)


def _itself(entry: Callable) -> Callable:
    return entry


class Registry(Generic[E]):
    """Entries looked up by the name a config uses (e.g. `algorithm.adv_estimator`);
    `function_of` gives an entry's function (the entry itself for a registry of functions);
    `built_in` names the modules that register jrl's own entries (imported on the first lookup).
    """

    def __init__(
        self,
        kind: str,
        config_key: str,
        function_of: Callable[[E], Callable] = _itself,
        built_in: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.config_key = config_key
        self._function_of = function_of
        self._built_in = tuple(built_in)
        self._entries: dict[str, E] = {}

    def _entries_with_built_ins(self) -> dict[str, E]:
        """The entries, jrl's own modules imported first (once)."""
        modules, self._built_in = self._built_in, ()
        for module in modules:
            importlib.import_module(module)
        return self._entries

    def add(self, name: object, entry: E) -> E:
        """Adds `entry` under `name`; a different function may not reuse a name."""
        key = entry_name(name)
        existing = self._entries.get(key)
        if existing is not None and self._function_of(existing) is not self._function_of(entry):
            raise ValueError(
                f"{self.kind} {key!r} is already registered "
                f"({self._function_of(existing).__qualname__}); choose another name"
            )
        self._entries[key] = entry
        return entry

    def register(self, name: object) -> Callable[[F], F]:
        """Decorator adding a function under `name` (a registry whose entries are functions)."""
        return self.register_with(name, lambda key, fn: fn)

    def register_with(self, name: object, describe: Callable[[str, F], E]) -> Callable[[F], F]:
        """Decorator adding `describe(key, fn)`, the entry describing the function, under `name`
        (whose registry key is `key`); the function itself is returned unchanged."""

        def decorator(fn: F) -> F:
            key = entry_name(name)
            self.add(key, describe(key, fn))
            return fn

        return decorator

    def find(self, name: object) -> E | None:
        """The entry registered under `name`, or None."""
        return self._entries_with_built_ins().get(entry_name(name))

    def get(self, name: object) -> E:
        """The entry registered under `name`; an unknown name lists the known ones."""
        entry = self.find(name)
        if entry is None:
            raise ValueError(
                f"Unknown {self.kind} {entry_name(name)!r} (set by {self.config_key}); "
                f"registered: {', '.join(sorted(self._entries))}"
            )
        return entry

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries_with_built_ins())


def entry_name(name: object) -> str:
    """The registry key of `name`: plain strings and string enums alike."""
    return str(getattr(name, "value", name))
