"""Writing rows in verl's schema to parquet (what the preprocessing scripts produce)."""

from __future__ import annotations

import pathlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet_rows(rows: list[dict[str, Any]], path: str | pathlib.Path) -> pathlib.Path:
    """Write ``rows`` (dicts with the same keys) to ``path``, creating its folder; returns the path."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    path = pathlib.Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_train_test(
    train_rows: list[dict[str, Any]], test_rows: list[dict[str, Any]], local_dir: str | pathlib.Path
) -> tuple[pathlib.Path, pathlib.Path]:
    """``local_dir/train.parquet`` and ``local_dir/test.parquet``."""
    local_dir = pathlib.Path(local_dir).expanduser()
    return write_parquet_rows(train_rows, local_dir / "train.parquet"), write_parquet_rows(
        test_rows, local_dir / "test.parquet"
    )
