"""Reading and writing Hugging Face safetensors checkpoints (one file, or shards plus an index).

Reads are lazy and blockwise: a file is opened (memory-mapped) for one block of one tensor and
closed again, so mapped pages never pile up in the process. Writes go tensor by tensor, block by
block, so host memory holds at most one tensor (as handed over by its `TensorSpec`) at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import struct
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np
from safetensors import safe_open

from jrl.models.streaming import row_blocks
from jrl.models.weights import TensorSpec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3

DTYPES: dict[str, np.dtype] = {
    code: np.dtype(dtype)
    for code, dtype in {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }.items()
}
_CODES = {dtype: code for code, dtype in DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor of a safetensors file; indexing reads just that region from disk."""

    file: Path
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        with safe_open(self.file, framework="numpy") as f:
            return f.get_slice(self.name)[index]


def _read_header(file: Path) -> dict[str, SafetensorsTensor]:
    """Name, shape and dtype of every tensor in a file (no tensor data is read)."""
    tensors = {}
    with safe_open(file, framework="numpy") as f:
        for name in f.keys():
            info = f.get_slice(name)
            code = info.get_dtype()
            if code not in DTYPES:
                raise ValueError(
                    f"{file}: tensor {name} has dtype {code}, which jrl cannot read; "
                    f"supported dtypes: {', '.join(DTYPES)}"
                )
            tensors[name] = SafetensorsTensor(file, name, tuple(info.get_shape()), DTYPES[code])
    return tensors


class SafetensorsCheckpoint(Mapping[str, SafetensorsTensor]):
    """Read-only mapping from tensor name to a lazily read `SafetensorsTensor`."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self._headers: dict[Path, dict[str, SafetensorsTensor]] = {}
        index, single = self.folder / INDEX_FILE, self.folder / SINGLE_FILE
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {name: self.folder / file for name, file in weight_map.items()}
        elif single.exists():
            self._headers[single] = _read_header(single)
            self._files = {name: single for name in self._headers[single]}
        else:
            raise FileNotFoundError(
                f"{self.folder} has neither {SINGLE_FILE} nor {INDEX_FILE}; jrl reads safetensors "
                "weights only (convert a pytorch_model.bin checkpoint with transformers first)"
            )

    def __getitem__(self, name: str) -> SafetensorsTensor:
        file = self._files[name]
        if file not in self._headers:
            if not file.exists():
                raise FileNotFoundError(f"{file} (listed in {INDEX_FILE} for {name}) is missing")
            self._headers[file] = _read_header(file)
        if name not in self._headers[file]:
            raise ValueError(
                f"{file} lacks tensor {name}, which {INDEX_FILE} places there; the index does "
                "not match the shards"
            )
        return self._headers[file][name]

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape)) * spec.dtype.itemsize


def _shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Groups tensors in order into shards of at most `max_shard_bytes` (a lone tensor may exceed
    it)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + _nbytes(spec) > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += _nbytes(spec)
    return shards


def _header(specs: list[TensorSpec]) -> bytes:
    """The safetensors header (length prefix and JSON) for tensors stored back to back in order."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        if spec.dtype not in _CODES:
            raise ValueError(
                f"tensor {spec.name} has dtype {spec.dtype}, which safetensors cannot store here; "
                f"supported dtypes: {', '.join(str(d) for d in _CODES)}"
            )
        end = offset + _nbytes(spec)
        entries[spec.name] = {
            "dtype": _CODES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _write_tensor(out: BinaryIO, spec: TensorSpec) -> None:
    """Writes one tensor's bytes, converting at most one block of rows to contiguous memory."""
    array = np.asarray(spec.load())
    if array.shape != spec.shape:
        raise ValueError(f"tensor {spec.name} came out with shape {array.shape}, not {spec.shape}")
    if array.ndim == 0:
        out.write(np.asarray(array, spec.dtype).tobytes())
        return
    for rows in row_blocks(array.shape, spec.dtype.itemsize):
        block = np.ascontiguousarray(array[rows], spec.dtype)
        out.write(block.reshape(-1).view(np.uint8).data)


def write_safetensors(
    folder: Path,
    specs: list[TensorSpec],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    file_name: str = SINGLE_FILE,
) -> None:
    """Writes tensors as `file_name` (`model.safetensors`), or as shards plus an index when they
    exceed one shard.

    Tensors are fetched (`spec.load()`) and written one at a time.
    """
    shards = _shards(specs, max_shard_bytes)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        file = file_name if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        with open(folder / file, "wb") as out:
            out.write(_header(shard))
            for spec in shard:
                _write_tensor(out, spec)
        weight_map.update({spec.name: file for spec in shard})
    if len(shards) > 1:
        total = sum(_nbytes(spec) for spec in specs)
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
    replace_directory(tmp, target)


def replace_directory(source: Path, target: Path) -> None:
    """Renames the finished folder `source` to `target`; an existing `target` is moved aside
    first and deleted only after the new folder is in place."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    os.replace(source, target)
    if old is not None and old.is_dir():
        shutil.rmtree(old)
    elif old is not None:
        old.unlink()
