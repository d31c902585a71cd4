"""A read-only view of a config that records which keys the resolver read.

The resolver reads verl's keys through `KeyReads` only, so a run says itself which keys it used:
its `Ledger` holds the dotted path of every value read (a section read whole, as a mapping handed
to a user's function, counts for each key under it) and the RunSpec field each read went into
(`Ledger.into`). A key the user set away from its default and that no resolver read is a key this
run ignores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ml_collections import ConfigDict


def plain(value: Any) -> Any:
    """`value` with every ConfigDict (at any depth) turned into a dict."""
    if isinstance(value, ConfigDict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


T = TypeVar("T")


class Ledger:
    """Which keys were read, and into which RunSpec field (the innermost `into` at the time)."""

    def __init__(self) -> None:
        self._fields: dict[str, set[str]] = {}
        self._into: list[str] = []

    @contextlib.contextmanager
    def into(self, field: str) -> Iterator[None]:
        """Reads inside the block go into `field` (dotted, from the RunSpec's root)."""
        self._into.append(field)
        try:
            yield
        finally:
            self._into.pop()

    def add(self, key: str) -> None:
        """Record that `key` was read (into the current field, if any)."""
        found = self._fields.setdefault(key, set())
        if self._into:
            found.add(self._into[-1])

    @property
    def keys(self) -> frozenset[str]:
        """Every key read."""
        return frozenset(self._fields)

    def fields(self) -> Mapping[str, tuple[str, ...]]:
        """Key -> the RunSpec fields it went into (sorted)."""
        return MappingProxyType({k: tuple(sorted(v)) for k, v in sorted(self._fields.items())})


class KeyReads:
    """`tree` (a ConfigDict section at `prefix`) read by attribute, item or `get`; each leaf read
    goes into the shared `ledger`. Sections come back as views of their own."""

    __slots__ = ("_tree", "_prefix", "ledger")

    def __init__(self, tree: ConfigDict, prefix: str = "", ledger: Ledger | None = None):
        self._tree = tree
        self._prefix = prefix
        self.ledger = Ledger() if ledger is None else ledger

    @property
    def reads(self) -> frozenset[str]:
        """Every key read so far, through this view or any view sharing its ledger."""
        return self.ledger.keys

    def resolve(self, field: str, build: Callable[..., T], *args: Any) -> T:
        """`build(*args)`, its reads recorded as going into the RunSpec field `field`."""
        with self.ledger.into(field):
            return build(*args)

    def _path(self, key: str) -> str:
        return f"{self._prefix}.{key}" if self._prefix else key

    def _read(self, key: str) -> Any:
        head, dot, rest = key.partition(".")
        if dot:
            return self._read(head)._read(rest)
        value = self._tree[head]
        path = self._path(head)
        if isinstance(value, ConfigDict):
            return KeyReads(value, path, self.ledger)
        self.ledger.add(path)
        return value

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._read(key)
        except KeyError:
            raise AttributeError(f"no key {self._path(key)}") from None

    def __getitem__(self, key: str) -> Any:
        return self._read(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The value at `key` (dotted), or `default` where the tree has no such key."""
        try:
            return self._read(key)
        except (KeyError, AttributeError):
            return default

    def __contains__(self, key: str) -> bool:
        return key in self._tree

    def __iter__(self) -> Iterator[str]:
        return iter(self._tree)

    def whole(self) -> dict[str, Any]:
        """This section as a plain dict, every key under it counted as read (for the borders
        where verl's convention hands a user's function a whole section)."""
        self.ledger.add(self._prefix)
        return plain(self._tree)

    def record(self) -> dict[str, Any]:
        """This section as a plain dict, read by no one (a copy for the run's records, such as
        the config table a tracker stores): no key counts as read, and the copy is made by
        `ConfigDict.to_dict`, not key by key, so no other observer sees reads either."""
        return self._tree.to_dict()


def was_read(key: str, reads: set[str] | frozenset[str]) -> bool:
    """Whether `key` or a section holding it is in `reads`."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in reads for n in range(len(parts), 0, -1))
