"""Complete transactions -> change rows and DDL-history rows (``decode_window``).

The entry point of decoding, and the names the rest of binlake has always read
from here. Each concept lives in its own module:

* ``binlake.lake.decoding.rows`` - the two row shapes (``CHANGE_COLUMNS``, ``DDL_COLUMNS``), ``commit_date``;
* ``binlake.lake.decoding.txn`` - complete transactions: validation, prewrite parse, ``CorruptBinlogError``;
* ``binlake.lake.decoding.schema_history`` - ``SchemaHistory``, ``UnknownTableError``;
* ``binlake.lake.decoding.image`` - image JSON of datums and rows, ``image_values``, ``TablePlan``;
* ``binlake.lake.decoding.native`` - the optional C decoder and ``StringColumn`` (Arrow string buffers);
* ``binlake.lake.decoding.change_decoder`` - ``ChangeDecoder``, ``change_rows``;
* ``binlake.lake.decoding.ddl_rows`` - ``ddl_row``, ``table_json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from binlake.lake.decoding.change_decoder import ChangeDecoder, change_rows
from binlake.lake.decoding.ddl_rows import ddl_row, table_json
from binlake.lake.decoding.image import TablePlan, image_values, value_json
from binlake.lake.decoding.native import (
    IMAGE_COLUMNS,
    NATIVE_DECODE_ENV,
    StringColumn,
    native_available,
    native_enabled,
    native_import_error,
)
from binlake.lake.decoding.rows import (
    CHANGE_COLUMNS,
    CHANGES_DDL,
    DDL_COLUMNS,
    DDL_HISTORY_DDL,
    OPS,
    commit_date,
    commit_date_days,
)
from binlake.lake.decoding.schema_history import SchemaHistory, UnknownTableError
from binlake.lake.decoding.txn import CorruptBinlogError, check_txn, is_ddl, parse_prewrite
from binlake.proto import binlog_pb2

__all__ = [
    "CHANGES_DDL", "CHANGE_COLUMNS", "DDL_COLUMNS", "DDL_HISTORY_DDL", "IMAGE_COLUMNS", "NATIVE_DECODE_ENV", "OPS",
    "ChangeDecoder", "CorruptBinlogError", "SchemaHistory", "StringColumn", "TablePlan", "UnknownTableError",
    "change_rows", "commit_date", "commit_date_days", "ddl_row", "decode_window", "image_values",
    "is_ddl", "native_available", "native_enabled", "native_import_error", "parse_prewrite", "table_json",
    "value_json",
]


def decode_window(
    txns: Iterable[binlog_pb2.Binlog], history: SchemaHistory, pump: str = ""
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Change rows and DDL rows of transactions in commit_ts order.

    Each DDL is applied to ``history`` (which this mutates) as it is met, so
    later transactions decode with it; a caller that knows every DDL of the
    window up front may have added them already (adding one again is a no-op).
    """
    changes: list[dict[str, Any]] = []
    ddls: list[dict[str, Any]] = []
    last = -1
    for txn in txns:
        check_txn(txn)
        if txn.commit_ts < last:
            raise ValueError(f"transactions out of commit_ts order: {txn.commit_ts} after {last}")
        last = txn.commit_ts
        if is_ddl(txn):
            history.apply(txn)
            ddls.append(ddl_row(txn))
        changes.extend(change_rows(txn, history, pump))
    return changes, ddls
