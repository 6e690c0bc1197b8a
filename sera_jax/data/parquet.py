"""Rows of a local parquet file as Python dicts, through pyarrow (the ``math`` extra), for the math datasets
(``sera_jax.data.math_data``) and the SERA authors' maze files (``experiments/maze/task.py``).

    columns, num_rows = parquet_layout(path)                      # the footer only: no rows read
    rows = read_parquet(path)                                     # every row, every column, in file order
    rows = read_parquet(path, ["prompt"], indices=np.array([3, 9]))  # rows 3 and 9: their row groups only
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

Path = str | os.PathLike[str]


def _pyarrow(path: Path):
    """``(pyarrow, pyarrow.parquet)``; ImportError naming the file and the extra that installs them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(f"reading {os.fspath(path)} needs pyarrow: pip install 'sera_jax[math]'") from e
    return pa, pq


def parquet_layout(path: Path) -> tuple[list[str], int]:
    """The column names of a parquet file and its row count, from its footer (no rows are read)."""
    _, pq = _pyarrow(path)
    source = pq.ParquetFile(path)
    return list(source.schema_arrow.names), source.metadata.num_rows


def read_parquet(path: Path, columns: Optional[Sequence[str]] = None,
                 indices: Optional[np.ndarray] = None) -> list[dict[str, Any]]:
    """Rows of a parquet file as dicts of ``columns`` (None: all of them): every row in file order (``indices``
    None), or the rows at the sorted ``indices``, reading only the row groups that hold one."""
    pa, pq = _pyarrow(path)
    source = pq.ParquetFile(path)
    columns = None if columns is None else list(columns)
    if indices is None:
        return source.read(columns=columns).to_pylist()
    rows: list[dict[str, Any]] = []
    offset = cursor = 0
    for group in range(source.num_row_groups):
        end = offset + source.metadata.row_group(group).num_rows
        first = cursor
        while cursor < len(indices) and indices[cursor] < end:
            cursor += 1
        if cursor > first:
            table = source.read_row_group(group, columns=columns)
            rows += table.take(pa.array(np.asarray(indices[first:cursor]) - offset)).to_pylist()
        offset = end
    return rows
