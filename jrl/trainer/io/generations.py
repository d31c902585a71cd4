"""verl's generation dumps (``trainer.rollout_data_dir``, ``trainer.validation_data_dir``)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def write_generations(
    folder: str | os.PathLike,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    reward_extra_infos: Mapping[str, Sequence[Any]],
) -> Path:
    """Writes ``<folder>/<step>.jsonl`` as verl does, and returns its path.

    One JSON object per sample (``ensure_ascii=False``, each line ending in a newline) with keys
    ``input``, ``output``, ``gts``, ``score`` and ``step``, then every reward extra info holding
    one value per sample (a same-named one replaces the base key). The file is written to a
    temporary sibling and renamed onto its name, so a reader never sees it half-written.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = len(inputs)
    columns = {
        "input": inputs,
        "output": outputs,
        "gts": gts,
        "score": scores,
        "step": [step] * rows,
        **{k: v for k, v in reward_extra_infos.items() if len(v) == rows},
    }
    lines = [
        json.dumps({k: v[i] for k, v in columns.items()}, ensure_ascii=False, default=_plain)
        for i in range(rows)
    ]
    path = folder / f"{step}.jsonl"
    tmp = folder / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"Dumped generations to {path}", flush=True)
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (ground truths read from Parquet, say) as Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
