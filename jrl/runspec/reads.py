"""A read-only view of a config that records which keys the resolver read.

The resolver reads verl's keys through `KeyReads` only, so a run says itself which keys it used:
`reads` holds the dotted path of every value read (a section read whole, as a mapping handed to a
user's function, counts for each key under it). A key the user set away from its default and
that no resolver read is a key this run ignores.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ml_collections import ConfigDict


def plain(value: Any) -> Any:
    """`value` with every ConfigDict (at any depth) turned into a dict."""
    if isinstance(value, ConfigDict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


class KeyReads:
    """`tree` (a ConfigDict section at `prefix`) read by attribute, item or `get`; each leaf read
    is added to the shared set `reads`. Sections come back as views of their own."""

    __slots__ = ("_tree", "_prefix", "reads")

    def __init__(self, tree: ConfigDict, prefix: str = "", reads: set[str] | None = None):
        self._tree = tree
        self._prefix = prefix
        self.reads = set() if reads is None else reads

    def _path(self, key: str) -> str:
        return f"{self._prefix}.{key}" if self._prefix else key

    def _read(self, key: str) -> Any:
        head, dot, rest = key.partition(".")
        if dot:
            return self._read(head)._read(rest)
        value = self._tree[head]
        path = self._path(head)
        if isinstance(value, ConfigDict):
            return KeyReads(value, path, self.reads)
        self.reads.add(path)
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
        self.reads.add(self._prefix)
        return plain(self._tree)

    def record(self) -> dict[str, Any]:
        """This section as a plain dict, read by no one (a copy for the run's records, such as
        the config table a tracker stores): no key counts as read."""
        return plain(self._tree)


def was_read(key: str, reads: set[str] | frozenset[str]) -> bool:
    """Whether `key` or a section holding it is in `reads`."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in reads for n in range(len(parts), 0, -1))
