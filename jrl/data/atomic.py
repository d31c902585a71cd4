"""Atomic writes: build the output beside its target, then move it into place in one step."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path next to `path`; on success it replaces `path` with one rename.

    The file is made readable by all (0o644), as an ordinary new file would be.
    """
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yields an empty temporary folder next to `path`; on success it takes the place of `path`.

    An existing folder at `path` is moved aside first and deleted only once the new one is in place,
    so a failure at any point leaves either the old or the new folder complete.
    """
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if not target.exists():
            os.replace(tmp, target)
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, aside / target.name)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(aside / target.name, target)
            shutil.rmtree(aside)
            raise
        shutil.rmtree(aside)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
