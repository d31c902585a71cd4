"""Batches of dataset rows: `collate` rows into a `Batch`, and a resumable Grain `DataLoader`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from jrl.batch import Batch

TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")


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

    The order of epoch ``e`` is a Grain global shuffle seeded by ``seed`` and ``e``, so it is the
    same on every run and on every host. `get_state` / `set_state` carry the epoch and the number of
    batches already handed out, so a resumed run continues with the next batch.
    """

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.rows = len(dataset)
        self.batch_size = batch_size
        self.drop_last = drop_last
        source = grain.MapDataset.source(dataset)
        # Shuffle then repeat: position e * N + i is row i of epoch e, shuffled with seed + e.
        self._stream = (source.shuffle(seed=seed) if shuffle else source).repeat()
        if len(self) == 0:
            raise ValueError(
                f"batch size {batch_size} is larger than the dataset ({self.rows} rows) with "
                "drop_last, so an epoch has no batch; lower the batch size or add data"
            )
        self._state = {"epoch": 0, "position": 0}

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch(self, epoch_index: int) -> Iterator[Batch]:
        """The batches of epoch `epoch_index`, starting after the saved position for that epoch."""
        rows = self._stream[epoch_index * self.rows : (epoch_index + 1) * self.rows]
        batches = rows.batch(self.batch_size, drop_remainder=self.drop_last, batch_fn=collate)
        start = self._state["position"] if self._state["epoch"] == epoch_index else 0
        for position in range(start, len(batches)):
            self._state = {"epoch": epoch_index, "position": position + 1}
            yield batches[position]
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
