"""Data files: one path or a list, local or remote, copied to a local cache and read as parquet.

Remote paths (``hdfs://``, ``gs://``, ``s3://``, ``memory://``, any fsspec protocol) are copied
once into the cache folder (``data.cache_dir``); a copy is reused while the remote file is
unchanged (same size and modification stamp).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jrl.data.atomic import atomic_file

DEFAULT_CACHE_DIR = "~/.cache/jrl/rlhf"
_BACKENDS = "gcsfs for gs://, s3fs for s3://, pyarrow with libhdfs for hdfs://"


def file_list(files: Any, config_key: str) -> list[str]:
    """`files` (one path, or a list/tuple/sequence of paths) as a list of path strings."""
    if isinstance(files, str | os.PathLike):
        items = [files]
    elif isinstance(files, Iterable) and not isinstance(files, Mapping):
        items = list(files)
    else:
        raise TypeError(
            f"{config_key} must be a parquet path or a list of them, got "
            f"{type(files).__name__}: {files!r}"
        )
    if not items:
        raise ValueError(f"{config_key} is empty; give at least one parquet file")
    for i, item in enumerate(items):
        if not isinstance(item, str | os.PathLike):
            raise TypeError(
                f"{config_key}[{i}] must be a path string, got {type(item).__name__}: {item!r}"
            )
    return [os.fspath(item) for item in items]


def is_remote(path: str) -> bool:
    """Whether `path` names a file through a protocol other than the local ``file://``."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str, cache_dir: str | os.PathLike | None, config_key: str) -> Path:
    """A local file holding `path`: the path itself, or a cached copy of a remote file."""
    if not is_remote(path):
        local = Path(path.removeprefix("file://")).expanduser()
        if not local.is_file():
            raise FileNotFoundError(
                f"{config_key}: parquet file {str(local)!r} does not exist. Point {config_key} "
                "at an existing file, or make GSM8K-style data with "
                "`python -m jrl.data.gsm8k --local_dir <dir> --offline`"
            )
        return local
    return _cached_copy(path, Path(cache_dir or DEFAULT_CACHE_DIR).expanduser(), config_key)


def _cached_copy(url: str, cache_dir: Path, config_key: str) -> Path:
    import fsspec

    try:
        fs, remote = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise ImportError(
            f"{config_key}: cannot open {url!r}: {err}. Install the fsspec backend of its "
            f"protocol ({_BACKENDS})"
        ) from err
    try:
        info = fs.info(remote)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{config_key}: remote file {url!r} does not exist") from err
    if info.get("type") != "file":
        raise IsADirectoryError(
            f"{config_key}: {url!r} is a {info.get('type')}, not a file; list its parquet files"
        )
    stamp = json.dumps(info, sort_keys=True, default=str)
    key = hashlib.sha256(f"{url}\n{stamp}".encode()).hexdigest()[:16]
    target = cache_dir / key / PurePosixPath(remote).name
    if not target.is_file():
        with atomic_file(target) as tmp:
            fs.get_file(remote, str(tmp))
        print(f"jrl: copied {url} to {target}", flush=True)
    return target


def read_parquet(local: Path, origin: str, config_key: str) -> pa.Table:
    """The table in `local` (fetched from `origin`); a non-parquet or empty file is an error."""
    try:
        table = pq.read_table(local)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(
            f"{config_key}: {origin} is not a readable parquet file ({err}); jrl reads parquet "
            "files in verl's schema (see `python -m jrl.data.gsm8k --help`)"
        ) from err
    if table.num_rows == 0:
        raise ValueError(f"{config_key}: {origin} has no rows; remove it or fill it with data")
    return table
