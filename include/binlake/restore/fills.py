"""What rows that predate a column hold for it, from a table's definition history.

When a column is added, the upstream gives the rows that exist then a value
(``binlake.coldefault.fill``: the constant default, an expression evaluated at
the ALTER, MySQL's implicit default). Those rows' images in the lake were
written before the column existed, so they lack it; every rebuild (restore,
snapshot, history) reads such an image's missing column as that value instead
of NULL. Only images of definitions in force *before* the column was added are
filled: an image written after the column was dropped lacks it for another
reason (the history table keeps dropped columns; they are null there).

A later ``SET DEFAULT`` changes nothing here: the value is the one of the
definition that added the column.
"""

from __future__ import annotations

import dataclasses

from binlake import coldefault
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.proto import binlog_pb2


@dataclasses.dataclass(frozen=True)
class Fill:
    """Column ``column`` (as the definition that added it has it) was added by the DDL
    committed at ``added_ts``; the rows before hold ``value``."""

    added_ts: int
    column: binlog_pb2.ColumnInfo
    value: binlog_pb2.Datum


def added_fills(schema: SchemaHistory, table_id: int) -> dict[int, Fill]:
    """column id -> its Fill, for the columns of ``table_id`` added after its first
    definition whose earlier rows hold a non-NULL value."""
    if not isinstance(schema, SchemaHistory):
        raise TypeError(f"expected a SchemaHistory, got {type(schema).__name__}")
    seen: set[int] = set()
    out: dict[int, Fill] = {}
    first = True
    for ts, info in schema.entries_of(table_id):  # commit_ts order
        for col in info.columns:
            if col.id in seen:
                continue
            seen.add(col.id)
            value = None if first else coldefault.fill(col)
            if value is not None:
                out[col.id] = Fill(ts, col, value)
        first = False
    return out


def version_fills(schema: SchemaHistory, table_id: int) -> dict[int, dict[int, Fill]]:
    """schema_version -> {column id: Fill} of the columns its images lack because they
    were added after it."""
    fills = added_fills(schema, table_id)
    out: dict[int, dict[int, Fill]] = {}
    for ts, info in schema.entries_of(table_id):
        have = {c.id for c in info.columns}
        out[info.schema_version] = {cid: f for cid, f in fills.items() if cid not in have and ts < f.added_ts}
    return out


def base_fills(schema: SchemaHistory, table_id: int, base_ts: int) -> dict[int, Fill]:
    """{column id: Fill} for the rows of a base taken at ``base_ts`` (a snapshot or a
    history table) that lack columns added after it."""
    return {cid: f for cid, f in added_fills(schema, table_id).items() if f.added_ts > base_ts}
