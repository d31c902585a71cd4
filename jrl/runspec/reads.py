"""A read-only view of a config that records which keys the resolver read.

The resolver reads verl's keys through `KeyReads` only, so a run says itself which keys it used:
its `Ledger` holds the dotted path of every value read (a section read whole, as a mapping handed
to a user's function, counts for each key under it) and the RunSpec field each read went into
(`Ledger.into`). Where a resolver's choice leaves keys unread (the critic's under GRPO, the
cosine schedule's under a constant one), it says why with `KeyReads.skip`. A key the user set away
from its default and that no resolver read is a key this run ignores (`jrl.runspec.effects`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from ml_collections import ConfigDict

from jrl.config.moved import follows


def plain(value: Any) -> Any:
    """`value` with every ConfigDict (at any depth) turned into a dict."""
    if isinstance(value, ConfigDict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Skip:
    """Why a resolver left a key (or every key of a section) unread; `given_only`: a card's
    value says nothing (a switched-off role's settings, which cards keep as verl's configs do),
    only the command line's does."""

    reason: str
    given_only: bool = False


def _held(key: str) -> Iterator[str]:
    """`key` and the sections holding it, innermost first."""
    parts = key.split(".")
    return (".".join(parts[:n]) for n in range(len(parts), 0, -1))


@dataclasses.dataclass(frozen=True)
class KeyRecord:
    """What the resolver did with the keys of one run: `fields`, each key read -> the RunSpec
    fields it became; `skipped`, each key or section left unread -> why."""

    fields: Mapping[str, tuple[str, ...]]
    skipped: Mapping[str, Skip]

    def read(self, key: str) -> bool:
        """Whether `key` or a section holding it (read whole) was read."""
        return any(path in self.fields for path in _held(key))

    def skip_of(self, key: str) -> Skip | None:
        """Why `key` was left unread (its own reason, else its innermost section's)."""
        return next((self.skipped[p] for p in _held(key) if p in self.skipped), None)


class Ledger:
    """Which keys were read, and into which RunSpec fields (the innermost `into` at the time)."""

    def __init__(self) -> None:
        self._fields: dict[str, set[str]] = {}
        self._skipped: dict[str, Skip] = {}
        self._into: list[tuple[str, ...]] = []

    @contextlib.contextmanager
    def into(self, field: str | tuple[str, ...]) -> Iterator[None]:
        """Reads inside the block go into `field` (dotted, from the RunSpec's root; several: a
        fact that several fields share)."""
        self._into.append((field,) if isinstance(field, str) else field)
        try:
            yield
        finally:
            self._into.pop()

    def add(self, key: str) -> None:
        """Record that `key` was read (into the current field, if any)."""
        found = self._fields.setdefault(key, set())
        if self._into:
            found.update(self._into[-1])

    def skip(self, key: str, why: Skip) -> None:
        """Record that `key` (a key or a section) was left unread, and why (the first reason
        given for a key stands)."""
        self._skipped.setdefault(key, why)

    @property
    def keys(self) -> frozenset[str]:
        """Every key read."""
        return frozenset(self._fields)

    def fields(self) -> Mapping[str, tuple[str, ...]]:
        """Key -> the RunSpec fields it went into (sorted)."""
        return MappingProxyType({k: tuple(sorted(v)) for k, v in sorted(self._fields.items())})

    def record(self) -> KeyRecord:
        """The frozen record of the reads and skips so far."""
        return KeyRecord(self.fields(), MappingProxyType(dict(self._skipped)))


class KeyReads:
    """`tree` (a ConfigDict section at `prefix`) read by attribute, item or `get`; each leaf read
    goes into the shared `ledger`. Sections come back as views of their own."""

    __slots__ = ("_tree", "_prefix", "ledger")

    def __init__(self, tree: ConfigDict, prefix: str = "", ledger: Ledger | None = None):
        self._tree = tree
        self._prefix = prefix
        self.ledger = Ledger() if ledger is None else ledger

    @classmethod
    def of(cls, tree: ConfigDict | Mapping[str, Any] | KeyReads, prefix: str = "") -> KeyReads:
        """`tree` itself when it is a view already, else a view of it (a mapping is taken as a
        ConfigDict) at `prefix` with a ledger of its own, for checks and callers that run a
        resolver on a plain section."""
        if isinstance(tree, KeyReads):
            return tree
        return cls(tree if isinstance(tree, ConfigDict) else ConfigDict(tree), prefix)

    @property
    def reads(self) -> frozenset[str]:
        """Every key read so far, through this view or any view sharing its ledger."""
        return self.ledger.keys

    def skip(self, keys: str | Iterable[str], reason: str, given_only: bool = False) -> None:
        """Record that `keys` (of this section; a section stands for every key under it) are
        left unread in this run because of `reason` (see `Skip` for `given_only`)."""
        for key in [keys] if isinstance(keys, str) else keys:
            self.ledger.skip(self._path(key), Skip(reason, given_only))

    def resolve(self, field: str | tuple[str, ...], build: Callable[..., T], *args: Any) -> T:
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

    def peek(self, key: str) -> Any:
        """The value at `key` without recording a read: for a value that is only checked, or
        that decides whether its partner keys act (the keys chosen are then read or skipped)."""
        return KeyReads(self._tree, self._prefix, Ledger())._read(key)

    def follows(self, key: str) -> bool:
        """Whether `key` (dotted, from this section) holds what its default interpolation makes
        of other keys (`jrl.config.moved.follows`; only on the root view)."""
        return follows(self._tree, key)

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
