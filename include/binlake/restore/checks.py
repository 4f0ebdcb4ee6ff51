"""Checksums of restored Spark tables in ``binlake.oracle``'s terms.

``frame_checksum`` gives the (rows, checksum) ``oracle.checksum`` gives for a
database table holding the same rows, so a restored Delta table can be
compared with the upstream's own state without loading it anywhere.
"""

from __future__ import annotations

from typing import Any

from binlake import oracle
from binlake.proto import binlog_pb2
from binlake.restore import columns as C


def frame_checksum(df: Any, info: binlog_pb2.TableInfo) -> tuple[int, str]:
    """(row count, checksum hex) of a typed frame with ``info``'s columns."""
    cols = C.columns_of(info)
    json_cols = [c.name for c in cols if c.type == binlog_pb2.JSON]
    acc = oracle._Acc()
    for row in df.select(*[f"`{c.name}`" for c in cols]).toLocalIterator(prefetchPartitions=True):
        values = {c.name: C.python_value(row[i], c.type) for i, c in enumerate(cols)}
        acc.add(oracle.row_hash(values, json_cols))
    return acc.rows, acc.hex()
