"""Content checksums of checkpoint files: xxh3-64 of every byte, read in chunks, so that a file
whose size is right and whose bytes are not is found before anything is restored from it.

A step's manifest lists each file as ``{"size": bytes, "xxh3": hex digest}`` and carries the
digest of its own canonical JSON (``"digest"``), so that a change to the manifest is found too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

_CHUNK = 8 << 20  # bytes read at a time
# Files read at once (hashing releases the GIL), at most half the cores: the checksum pass runs
# beside training, whose CPU devices' collectives abort when their threads are starved.
_READERS = max(1, min(8, (os.cpu_count() or 2) // 2))
DIGEST_KEY = "digest"


def stream_digest(f: BinaryIO) -> tuple[int, str]:
    """(bytes read, xxh3-64 as 16 hex digits) of an open binary file, read in chunks."""
    hasher, size = xxhash.xxh3_64(), 0
    while chunk := f.read(_CHUNK):
        hasher.update(chunk)
        size += len(chunk)
    return size, hasher.hexdigest()


def file_digest(path: Path) -> str:
    """xxh3-64 of the file's bytes, as 16 hex digits."""
    with open(path, "rb") as f:
        return stream_digest(f)[1]


def bytes_digest(data: bytes) -> str:
    """xxh3-64 of `data`, as 16 hex digits."""
    return xxhash.xxh3_64(data).hexdigest()


def file_digests(paths: Iterable[Path]) -> list[str]:
    """`file_digest` of each path, several files read at once."""
    with ThreadPoolExecutor(_READERS) as pool:
        return list(pool.map(file_digest, paths))


def file_entries(folder: Path, checksums: bool = True) -> dict[str, dict[str, Any]]:
    """Every file under `folder` (relative path -> size and, with `checksums`, its digest)."""
    paths = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    digests = file_digests(paths) if checksums else [None] * len(paths)
    entries = {}
    for path, digest in zip(paths, digests, strict=True):
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if digest is not None:
            entry["xxh3"] = digest
        entries[str(path.relative_to(folder))] = entry
    return entries


def _canonical(manifest: dict[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != DIGEST_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sealed(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with the digest of its own content."""
    return {**manifest, DIGEST_KEY: bytes_digest(_canonical(manifest))}


def seal_is_broken(manifest: dict[str, Any]) -> bool:
    """Whether a sealed manifest's content no longer matches its digest (unsealed: False)."""
    digest = manifest.get(DIGEST_KEY)
    return digest is not None and digest != bytes_digest(_canonical(manifest))


def file_problems(
    folder: Path, files: dict[str, Any], contents: bool, unlisted: Collection[str] = ()
) -> list[str]:
    """Why the files of `folder` are not the ones listed in `files` (relative path -> entry;
    a bare int is a size, from manifests written before checksums): missing, of another size,
    and with `contents`, bytes that do not match their digest, or files not listed (other than
    the relative paths in `unlisted`)."""
    found, to_read = [], []
    for rel, entry in files.items():
        size, digest = (
            (entry, None) if isinstance(entry, int) else (entry["size"], entry.get("xxh3"))
        )
        path = folder / rel
        if not path.is_file():
            found.append(f"{path} is missing")
        elif path.stat().st_size != size:
            found.append(f"{path} has {path.stat().st_size} bytes, {size} were written")
        elif contents and digest is not None:
            to_read.append((path, digest))
    digests = file_digests(path for path, _ in to_read)
    for (path, digest), actual in zip(to_read, digests, strict=True):
        if actual != digest:
            found.append(f"{path} is damaged: its bytes do not match the checksum saved with it")
    if contents:
        for path in sorted(folder.rglob("*")):
            rel = str(path.relative_to(folder))
            if path.is_file() and rel not in files and rel not in unlisted:
                found.append(f"{path} is not part of the checkpoint (added after it was saved)")
    return found
