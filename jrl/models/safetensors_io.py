"""Reading and writing Hugging Face safetensors checkpoints (one file, or shards plus an index)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jrl.models.weights import TensorSpec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


class SafetensorsCheckpoint(Mapping[str, np.ndarray]):
    """Read-only mapping from tensor name to numpy array, reading each tensor on access."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        index, single = self.folder / INDEX_FILE, self.folder / SINGLE_FILE
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {name: self.folder / file for name, file in weight_map.items()}
        elif single.exists():
            with safe_open(single, framework="numpy") as f:
                self._files = {name: single for name in f.keys()}
        else:
            raise FileNotFoundError(
                f"{self.folder} has neither {SINGLE_FILE} nor {INDEX_FILE}; jrl reads safetensors "
                "weights only (convert a pytorch_model.bin checkpoint with transformers first)"
            )
        self._handles: dict[Path, Any] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        file = self._files[name]
        if file not in self._handles:
            if not file.exists():
                raise FileNotFoundError(f"{file} (listed in {INDEX_FILE} for {name}) is missing")
            self._handles[file] = safe_open(file, framework="numpy")
        return self._handles[file].get_tensor(name)

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Groups tensors in order into shards of at most `max_shard_bytes` (a lone tensor may exceed
    it)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec.shape)) * spec.dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def write_safetensors(
    folder: Path, specs: list[TensorSpec], max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> None:
    """Writes tensors as `model.safetensors`, or as shards plus an index when they exceed one shard.

    Only one shard's tensors are held in host memory at a time.
    """
    shards = _shards(specs, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        file = (
            SINGLE_FILE if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        )
        arrays = {spec.name: np.ascontiguousarray(spec.load()) for spec in shard}
        save_file(arrays, folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in arrays})
        total += sum(a.nbytes for a in arrays.values())
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary sibling folder that replaces `path` only if the block succeeds.

    An existing `path` is moved aside first and deleted only after the new folder is in place.
    """
    target = Path(path).expanduser().absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None and old.is_dir():
        shutil.rmtree(old)
    elif old is not None:
        old.unlink()
