"""A transaction's serialized PrewriteValue, for every source: the MySQL stream's
transactions and both sources' snapshot parts.

The native writer (``_rowsc.prewrite_value``, built with the MySQL source's row
decoder, but it knows nothing of MySQL: mutations of serialized Rows in, the
value out) copies each row once; the protobuf message gives the same bytes
(tests/source/test_mysql_native_rows.py checks they are) at about 8 us a row.
"""

from __future__ import annotations

from collections.abc import Callable

from binlake.proto import binlog_pb2

# One mutation: (table_id, inserted rows, updated rows, deleted rows, sequence: one
# byte per MutationType), in order.
Mutation = tuple[int, list[bytes], list[bytes], list[bytes], bytes]

_native: Callable[[int, list[Mutation]], bytes] | None
try:  # optional: built by `pip install -e .` (setup.py); without it the protobuf message
    from binlake.source.mysql._rowsc import prewrite_value as _native
except ImportError:
    _native = None


def prewrite_value(schema_version: int, mutations: list[Mutation], native: bool) -> bytes:
    """The serialized PrewriteValue of ``mutations``: in one pass in C when ``native``
    and the writer is built, else through the protobuf message (the same bytes)."""
    if native and _native is not None:
        return bytes(_native(schema_version, mutations))
    value = binlog_pb2.PrewriteValue(schema_version=schema_version)
    for table_id, inserted, updated, deleted, sequence in mutations:
        m = value.mutations.add(table_id=table_id)
        m.inserted_rows.extend(inserted)
        m.updated_rows.extend(updated)
        m.deleted_rows.extend(deleted)
        m.sequence.extend(sequence)
    return bytes(value.SerializeToString())
