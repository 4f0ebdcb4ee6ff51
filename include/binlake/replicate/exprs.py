"""Expression filters' view of an image: the Spark schema that ``from_json``
reads an image JSON with, so a predicate sees the table's columns typed.

Decimals and unsigned integers read as exact decimals, datetimes as
timestamps without a zone (images are UTC wall-clock), dates as dates; times,
bytes and JSON documents as their text. A decimal wider than Spark's 38 digits
(MySQL allows 65) reads as its exact text, as the restore types it: Spark has
no decimal type for it, and a rounded one would compare wrong.
"""

from __future__ import annotations

from typing import Any

from binlake.proto import binlog_pb2
from binlake.sql.schema import column_def

# Spark's widest decimal.
SPARK_DECIMAL_MAX_PRECISION = 38


def spark_type(col: binlog_pb2.ColumnInfo) -> str:
    t = col.type
    if t == binlog_pb2.INT:
        return "bigint"
    if t == binlog_pb2.UINT:
        return "decimal(20,0)"
    if t == binlog_pb2.BOOL:
        return "boolean"
    if t == binlog_pb2.FLOAT:
        return "double"
    if t == binlog_pb2.DECIMAL:
        cd = column_def(col)
        if (cd.precision or 0) > SPARK_DECIMAL_MAX_PRECISION:
            return "string"
        return f"decimal({cd.precision or SPARK_DECIMAL_MAX_PRECISION},{cd.scale or 0})"
    if t == binlog_pb2.DATE:
        return "date"
    if t == binlog_pb2.DATETIME:
        return "timestamp_ntz"
    return "string"


def spark_schema(info: binlog_pb2.TableInfo) -> Any:
    """A Spark DDL schema string for the images of ``info``."""
    return ", ".join(f"`{c.name}` {spark_type(c)}" for c in info.columns)
