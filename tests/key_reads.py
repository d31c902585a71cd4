"""Which config keys a real `jrl.train` run reads once its config is loaded.

`reads_of_run(argv)` runs ``jrl.train.main(argv)`` with every `ConfigDict` read recorded under
its dotted key. Reads made while loading and checking the config (before the run has it),
printing it, or writing the no-effect notice do not count: they are not the run acting on a key.
A section turned into a plain dict by the run's own code (``override_config``,
``reward_kwargs``) counts as a read of everything under it, recorded as ``section.*``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from unittest import mock

from ml_collections import ConfigDict

from jrl import train
from jrl.config.tree import key_paths

# Modules whose reads are about the config, not the run: printing it, the no-effect notice.
_NOT_ACTING = ("jrl.runspec.effects", "jrl.config.loading")


def _acting() -> bool:
    """Whether the read in progress comes from the run (no config-checking module on the
    stack)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_NOT_ACTING):
            return False
        frame = frame.f_back
    return True


@contextlib.contextmanager
def _recording(reads: set[str]) -> Iterator[None]:
    paths: dict[int, str] = {}
    inside_to_dict = [0]
    get, to_dict, load = ConfigDict.__getitem__, ConfigDict.to_dict, train.load_config

    def loading(argv):
        config, module = load(argv)
        sections = {
            id(config[k]): k for k in key_paths(config) if isinstance(config[k], ConfigDict)
        }
        paths.update(sections)
        paths[id(config)] = ""
        return config, module

    def getitem(self, key):
        path = paths.get(id(self))
        if path is not None and isinstance(key, str) and not inside_to_dict[0] and _acting():
            reads.add(f"{path}.{key}" if path else key)
        return get(self, key)

    def as_dict(self, *args, **kwargs):
        path = paths.get(id(self))
        if path and not inside_to_dict[0] and _acting():
            reads.add(f"{path}.*")
        inside_to_dict[0] += 1
        try:
            return to_dict(self, *args, **kwargs)
        finally:
            inside_to_dict[0] -= 1

    with (
        mock.patch.object(ConfigDict, "__getitem__", getitem),
        mock.patch.object(ConfigDict, "to_dict", as_dict),
        mock.patch.object(train, "load_config", loading),
    ):
        yield


def reads_of_run(argv: list[str]) -> set[str]:
    """The dotted keys (and ``section.*`` bulk reads) that ``jrl.train.main(argv)`` reads."""
    reads: set[str] = set()
    with _recording(reads):
        train.main(argv)
    return reads


def is_read(key: str, reads: set[str]) -> bool:
    """Whether `key` was read, itself or as part of a section read whole."""
    parts = key.split(".")
    return key in reads or any(f"{'.'.join(parts[:n])}.*" in reads for n in range(1, len(parts)))
