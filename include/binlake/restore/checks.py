"""Checksums of restored Spark tables in ``binlake.sql.checksum``'s terms.

``frame_checksum`` gives the (rows, checksum) ``checksum.checksum`` gives for a
database table holding the same rows, so a restored Delta table can be
compared with the upstream's own state without loading it anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from binlake.proto import binlog_pb2
from binlake.restore import columns as C
from binlake.sql import checksum


def frame_checksum(df: Any, info: binlog_pb2.TableInfo) -> tuple[int, str]:
    """(row count, checksum hex) of a typed frame with ``info``'s columns."""
    cols = C.columns_of(info)
    rows = df.select(*[f"`{c.name}`" for c in cols]).toLocalIterator(prefetchPartitions=True)
    return rows_checksum(([r[i] for i in range(len(cols))] for r in rows), info)


def delta_checksum(path: str, info: binlog_pb2.TableInfo) -> tuple[int, str]:
    """``frame_checksum`` of the local Delta table at ``path``, read in this process
    with delta-rs (no Spark job: tests check hundreds of restored tables)."""
    from deltalake import DeltaTable

    cols = C.columns_of(info)
    table = DeltaTable(path).to_pyarrow_table(columns=[c.name for c in cols])
    data = [table.column(c.name).to_pylist() for c in cols]
    return rows_checksum(zip(*data, strict=True) if data else iter(()), info)


def rows_checksum(rows: Iterable[Sequence[Any]], info: binlog_pb2.TableInfo) -> tuple[int, str]:
    """(row count, checksum hex) of typed rows (values in ``info``'s column order)."""
    cols = C.columns_of(info)
    json_cols = [c.name for c in cols if c.type == binlog_pb2.JSON]
    acc = checksum._Acc()
    for row in rows:
        values = {c.name: C.python_value(row[i], c.type) for i, c in enumerate(cols)}
        acc.add(checksum.row_hash(values, json_cols))
    return acc.rows, acc.hex()
