"""`Batch`: the unit of data that flows through one PPO step.

`tensors` holds arrays with verl's names (``input_ids``, ``attention_mask``, ``responses``, ...),
all sharing the leading row dimension. `meta` holds per-row host values as numpy object arrays
(``uid``, ``data_source``, ``reward_model``, ``extra_info``, ...), also one entry per row.
A Batch is a pytree over its tensors (meta travels as static data), so it can cross `jit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np


def _rows(value: Any) -> int:
    return int(value.shape[0])


@dataclasses.dataclass
class Batch:
    """Row-aligned tensors plus per-row host metadata."""

    tensors: dict[str, Any] = dataclasses.field(default_factory=dict)
    meta: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.meta = {k: _as_object_array(v) for k, v in self.meta.items()}
        sizes = {k: _rows(v) for k, v in {**self.tensors, **self.meta}.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the number of rows: {sizes}")

    def __len__(self) -> int:
        for value in (*self.tensors.values(), *self.meta.values()):
            return _rows(value)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        return self.meta[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.meta

    def select(self, tensor_keys: Sequence[str] = (), meta_keys: Sequence[str] = ()) -> Batch:
        """A batch holding only the named fields."""
        return Batch(
            {k: self.tensors[k] for k in tensor_keys}, {k: self.meta[k] for k in meta_keys}
        )

    def union(self, other: Batch) -> Batch:
        """Fields of both batches; `other` wins on name clashes."""
        return Batch({**self.tensors, **other.tensors}, {**self.meta, **other.meta})

    def take(self, index: Any) -> Batch:
        """Rows picked by an integer index array (a reorder, subset or repeat)."""
        index = np.asarray(index)
        return Batch(
            {k: _take(v, index) for k, v in self.tensors.items()},
            {k: v[index] for k, v in self.meta.items()},
        )

    def reorder(self, permutation: Any) -> Batch:
        """Rows in the order of `permutation`."""
        return self.take(permutation)

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row n times: p0,p0,..,p1,p1 (interleave) or p0,p1,..,p0,p1 (tiled), as verl."""
        rows = np.arange(len(self))
        return self.take(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def chunk(self, chunks: int) -> list[Batch]:
        """Split into `chunks` equal consecutive parts."""
        if len(self) % chunks:
            raise ValueError(f"cannot split {len(self)} rows into {chunks} equal chunks")
        size = len(self) // chunks
        return [self.take(np.arange(i * size, (i + 1) * size)) for i in range(chunks)]

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all batches, in order; all must have the same fields."""
        first = batches[0]
        return Batch(
            {k: _concat([b.tensors[k] for b in batches]) for k in first.tensors},
            {k: np.concatenate([b.meta[k] for b in batches]) for k in first.meta},
        )

    def to_numpy(self) -> Batch:
        """A copy whose tensors are host numpy arrays."""
        return Batch({k: np.asarray(v) for k, v in self.tensors.items()}, dict(self.meta))


def attended_lengths(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, response) lengths [B] int of verl's rollout layout, as verl counts them: the
    ``attention_mask`` ones before and within the last ``responses`` width (a multi-turn row's
    tool turns count among its response tokens)."""
    attention = np.asarray(batch.tensors["attention_mask"])
    width = np.asarray(batch.tensors["responses"]).shape[1]
    return attention[:, :-width].sum(-1), attention[:, -width:].sum(-1)


def _as_object_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype == object:
        return value
    out = np.empty(len(value), dtype=object)
    for i, item in enumerate(value):
        out[i] = item
    return out


def _take(value: Any, index: np.ndarray) -> Any:
    if isinstance(value, np.ndarray):
        return value[index]
    return jax.numpy.take(value, jax.numpy.asarray(index), axis=0)


def _concat(values: Sequence[Any]) -> Any:
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values)
    return jax.numpy.concatenate([jax.numpy.asarray(v) for v in values])


class _StaticMeta:
    """Wraps `meta` as pytree aux data: compared by identity so `jit` never hashes arrays."""

    def __init__(self, meta: Mapping[str, np.ndarray]):
        self.meta = dict(meta)


def _flatten(batch: Batch):
    keys = tuple(sorted(batch.tensors))
    return [batch.tensors[k] for k in keys], (keys, _StaticMeta(batch.meta))


def _unflatten(aux, children) -> Batch:
    keys, static = aux
    out = Batch.__new__(Batch)
    out.tensors = dict(zip(keys, children, strict=True))
    out.meta = dict(static.meta)
    return out


jax.tree_util.register_pytree_node(Batch, _flatten, _unflatten)
