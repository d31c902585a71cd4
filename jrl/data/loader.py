"""Batches of dataset rows: `collate` rows into a `Batch`, and a resumable `DataLoader` whose
epochs take verl's row orders (`jrl.data.torch_order`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jrl.batch import Batch
from jrl.data.torch_order import distributed_sampler_epoch, random_sampler_epoch

TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")
# How a shuffling loader orders an epoch: as verl's RL sampler (torch's RandomSampler, one
# generator for the run) or its SFT sampler (torch's DistributedSampler, reseeded each epoch).
SAMPLERS = {"random": random_sampler_epoch, "distributed": distributed_sampler_epoch}


def collate(rows: Sequence[dict[str, Any]]) -> Batch:
    """Stacks token fields into int32 tensors [B, P]; every other field goes to `meta` per row."""
    if not rows:
        raise ValueError("cannot collate an empty list of rows")
    keys = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(keys):
            raise KeyError(
                f"row {i} has fields {sorted(row)} but row 0 has {sorted(keys)}; all rows of a "
                "batch need the same fields"
            )
    tensors = {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in keys if k in TENSOR_KEYS}
    meta = {k: [r[k] for r in rows] for k in keys if k not in TENSOR_KEYS}
    return Batch(tensors, meta)


class DataLoader:
    """Batches of a random-access dataset, reshuffled each epoch, resumable mid-epoch.

    With `shuffle`, epoch ``e``'s order is the one verl's `sampler` gives with `seed` (torch's
    permutations, `jrl.data.torch_order`), so it is verl's, the same on every run and every host;
    without, the rows in order. Each global batch of `batch_size` rows is split over the JAX
    processes: process ``p`` of ``P`` reads and returns rows ``[p * B // P, (p + 1) * B // P)``
    of a batch of ``B`` rows: equal slices when ``drop_last`` (the batch size must then be a
    multiple of ``P``); with ``drop_last=False`` a batch that ``P`` does not divide is split as
    evenly as possible. With one process nothing is split.

    `get_state` / `set_state` carry the epoch and the number of batches already handed out, so a
    resumed run continues with exactly the batches that were still to come.
    """

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        sampler: str = "random",
        drop_last: bool = True,
        process_index: int | None = None,
        process_count: int | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.dataset = dataset
        self.rows = len(dataset)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.process_count = jax.process_count() if process_count is None else process_count
        self.process_index = jax.process_index() if process_index is None else process_index
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(
                f"process_index {self.process_index} is outside [0, {self.process_count})"
            )
        if drop_last and batch_size % self.process_count:
            raise ValueError(
                f"batch size {batch_size} does not split evenly over {self.process_count} "
                "processes; make the batch size a multiple of the process count"
            )
        if len(self) == 0:
            raise ValueError(
                f"batch size {batch_size} is larger than the dataset ({self.rows} rows) with "
                "drop_last, so an epoch has no batch; lower the batch size or add data"
            )
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler={sampler!r}; use one of {', '.join(SAMPLERS)}")
        self.shuffle, self.seed, self.sampler = shuffle, seed, sampler
        self._state = {"epoch": 0, "position": 0}

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _local_batch(self, global_indices: np.ndarray) -> Batch:
        """This process's slice of one global batch, read and collated."""
        n, p = len(global_indices), self.process_index
        mine = global_indices[p * n // self.process_count : (p + 1) * n // self.process_count]
        return collate([self.dataset[int(i)] for i in mine])

    def order(self, epoch_index: int) -> np.ndarray:
        """The rows of epoch `epoch_index` in the order its batches take them."""
        if not self.shuffle:
            return np.arange(self.rows)
        return SAMPLERS[self.sampler](self.rows, self.seed, epoch_index)

    def epoch(self, epoch_index: int) -> Iterator[Batch]:
        """The batches of epoch `epoch_index`, starting after the saved position for that epoch."""
        start = self._state["position"] if self._state["epoch"] == epoch_index else 0
        if start > len(self):
            raise ValueError(
                f"the data loader state resumes epoch {epoch_index} at batch {start}, but an "
                f"epoch has only {len(self)} batches; the dataset or batch size changed since "
                "the state was saved"
            )
        order = self.order(epoch_index)
        for position in range(start, len(self)):
            rows = order[position * self.batch_size : (position + 1) * self.batch_size]
            batch = self._local_batch(rows)
            self._state = {"epoch": epoch_index, "position": position + 1}
            yield batch
        self._state = {"epoch": epoch_index + 1, "position": 0}

    def get_state(self) -> dict[str, int]:
        """The epoch and the number of its batches handed out so far."""
        return dict(self._state)

    def set_state(self, state: dict[str, int]) -> None:
        """Continue from a state returned by `get_state`."""
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"data loader state lacks {sorted(missing)}; got {state}")
        self._state = {"epoch": int(state["epoch"]), "position": int(state["position"])}
