"""Complete transactions as the lake receives them: validation and the prewrite parse.

A *complete transaction* is what a Pump serves: a COMMIT binlog carrying its
prewrite's ``prewrite_value`` (and, for DDL, ``ddl_query``/``ddl_table``).
Bytes that do not decode raise ``CorruptBinlogError``: a served transaction is
never skipped.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from binlake import errors
from binlake.proto import binlog_pb2


class CorruptBinlogError(errors.InvalidArgument):
    """A served transaction whose bytes do not decode (never skipped)."""


def parse_prewrite(txn: binlog_pb2.Binlog) -> binlog_pb2.PrewriteValue:
    """The transaction's PrewriteValue (CorruptBinlogError when its bytes are not one)."""
    try:
        value: binlog_pb2.PrewriteValue = binlog_pb2.PrewriteValue.FromString(txn.prewrite_value)
    except DecodeError as exc:
        raise CorruptBinlogError(
            f"transaction start_ts {txn.start_ts} (commit_ts {txn.commit_ts}): prewrite_value is not a "
            f"PrewriteValue: {exc}") from None
    return value


def check_txn(txn: Any) -> None:
    """TypeError unless ``txn`` is a Binlog, ValueError unless it is a complete (COMMIT) transaction."""
    if not isinstance(txn, binlog_pb2.Binlog):
        raise TypeError(f"expected a Binlog (a complete transaction), got {type(txn).__name__}")
    if txn.tp != binlog_pb2.COMMIT or txn.commit_ts <= txn.start_ts:
        raise ValueError(
            f"transaction start_ts {txn.start_ts} is not a complete transaction "
            f"(type {binlog_pb2.BinlogType.Name(txn.tp)}, commit_ts {txn.commit_ts})")


def is_ddl(txn: binlog_pb2.Binlog) -> bool:
    """Whether the transaction is a DDL (it carries a ddl_query)."""
    return bool(txn.ddl_query)
