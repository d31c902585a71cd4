"""The exception types of the configuration system, and the check a frozen settings type runs on
its own fields (`check_settings`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ConfigError(ValueError):
    """A configuration problem; the message names the key(s) and how to fix it."""


class SettingsError(ConfigError):
    """Values a frozen settings type refuses: `problems` holds (field, value, rule) for each, so
    that the resolver can name the key each field came from."""

    def __init__(self, owner: str, problems: Sequence[tuple[str, Any, str]]):
        self.owner = owner
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{owner}.{f}={v!r} {rule}" for f, v, rule in self.problems))


def check_settings(settings: object, rules: Mapping[str, tuple[bool, str]]) -> None:
    """Raise SettingsError naming every field of `settings` whose rule fails; `rules` maps a field
    to (whether its value is allowed, what it must be)."""
    failed = [(name, getattr(settings, name), rule) for name, (ok, rule) in rules.items() if not ok]
    if failed:
        raise SettingsError(type(settings).__name__, failed)
