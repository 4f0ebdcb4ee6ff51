"""DDL rows: a DDL transaction as its ``ddl_history`` row (``DDL_COLUMNS`` in ``binlake.lake.decoding.rows``)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from binlake import codec
from binlake.lake.decoding.txn import check_txn, parse_prewrite
from binlake.proto import binlog_pb2


def ddl_row(txn: binlog_pb2.Binlog) -> dict[str, Any]:
    """The ``ddl_history`` row of a DDL transaction (``DDL_COLUMNS``)."""
    check_txn(txn)
    if not txn.ddl_query:
        raise ValueError(f"transaction start_ts {txn.start_ts} is not a DDL (no ddl_query)")
    has_table = txn.HasField("ddl_table")
    info = txn.ddl_table
    version = info.schema_version if has_table and info.schema_version else parse_prewrite(txn).schema_version
    return {
        "commit_ts": txn.commit_ts,
        "start_ts": txn.start_ts,
        "schema_version": version,
        "db": info.db if has_table else None,
        "tbl": info.name if has_table else None,
        "table_id": info.table_id if has_table else None,
        "previous_table_id": info.previous_table_id if has_table else None,
        "dropped": info.dropped if has_table else False,
        "query": txn.ddl_query.decode("utf-8", errors="replace"),
        "table_info": info.SerializeToString() if has_table else None,
        "table_json": table_json(info) if has_table else None,
    }


def table_json(info: binlog_pb2.TableInfo) -> str:
    """A readable, canonical JSON form of a table definition (type names spelled out)."""
    doc = json_format.MessageToDict(info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return codec.canonical_json(doc)
