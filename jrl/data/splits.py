"""Preprocessor I/O: raw records from the Hugging Face hub, and one parquet file per split."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jrl.data.atomic import atomic_file


def load_hub_split(
    path: str, split: str, size: int | None, name: str | None = None
) -> list[dict[str, Any]]:
    """The records of hub dataset `path` (config `name`) for `split`, the first `size` if given."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"reading {path} from the Hugging Face hub needs the `datasets` package: "
            "`pip install datasets` (or `pip install jrl[hub]`); or pass --offline"
        ) from err
    data = datasets.load_dataset(path, name, split=split)
    if size is not None:
        data = data.select(range(min(size, len(data))))
    return list(data)


def write_splits(local_dir: str | Path, rows_by_split: Mapping[str, Sequence[dict]]) -> list[Path]:
    """Writes ``<split>.parquet`` under `local_dir` per split, each file replaced atomically."""
    out = Path(local_dir).expanduser()
    paths = []
    for split, rows in rows_by_split.items():
        path = out / f"{split}.parquet"
        with atomic_file(path) as tmp:
            pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
        print(f"jrl: wrote {len(rows)} rows to {path}", flush=True)
        paths.append(path)
    return paths


def add_save_dir(parser: argparse.ArgumentParser, default: str) -> None:
    """verl's ``--local_save_dir`` (default `default`) and its older spelling ``--local_dir``."""
    parser.add_argument("--local_save_dir", default=default, help=f"output folder ({default})")
    parser.add_argument("--local_dir", default=None, help="the same (verl's older name)")


def save_dir(args: argparse.Namespace) -> str:
    """The output folder of `add_save_dir`'s arguments: ``--local_dir`` when given (as verl)."""
    return args.local_save_dir if args.local_dir is None else args.local_dir
