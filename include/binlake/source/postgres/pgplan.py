"""The native pgoutput tuple decoder (``_pgoutc``): per-table-version plans.

A plan says, column by column, how the C decoder turns a column's text in an
INSERT/UPDATE/DELETE tuple into the Datum of the serialized Row, so that the
result is byte for byte what the Python path (``values.decode_row`` then
``codec.encode_row``) builds (the contract is stated in ``_pgoutc.c``). It is
built once per table version, with the TableInfo the rows are encoded
against; a table with a column the decoder does not cover (JSON) gets no
plan, and all its changes take the Python path. When the decoder declines a
tuple (None), the Python path reads the same tuple from the same offset, as
if the decoder did not exist.

``BINLAKE_NATIVE_PGOUTPUT=0`` in the environment forces the Python path (read
when a source starts); without the built extension it is the only path.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from binlake.proto import binlog_pb2
from binlake.source.tables import SourceTable

# The extension module (typed by its .pyi), or None where it was not built.
_pgoutc: ModuleType | None
try:  # optional: built by `pip install -e .` (setup.py); without it everything runs in Python
    from binlake.source.postgres import _pgoutc
    _IMPORT_ERROR = ""
except ImportError as _exc:
    _pgoutc = None
    _IMPORT_ERROR = str(_exc)

NATIVE_PGOUTPUT_ENV = "BINLAKE_NATIVE_PGOUTPUT"

# The decoder's kinds (the K_* of _pgoutc.c) by type oid, as values.convert reads them.
K_INT, K_UINT, K_BOOL, K_FLOAT, K_DECIMAL, K_STRING, K_BYTES = 1, 2, 3, 4, 5, 6, 7
K_DATE, K_TIMESTAMP, K_TIMESTAMPTZ, K_TIME = 8, 9, 10, 11
KINDS = {20: K_INT, 21: K_INT, 23: K_INT, 26: K_UINT, 16: K_BOOL, 700: K_FLOAT, 701: K_FLOAT,
         1700: K_DECIMAL, 25: K_STRING, 1043: K_STRING, 1042: K_STRING, 19: K_STRING, 2950: K_STRING,
         17: K_BYTES, 1082: K_DATE, 1114: K_TIMESTAMP, 1184: K_TIMESTAMPTZ, 1083: K_TIME}


def available() -> bool:
    """Whether ``_pgoutc`` was built and imports (``import_error()`` says why not)."""
    return _pgoutc is not None


def import_error() -> str:
    return _IMPORT_ERROR


def enabled() -> bool:
    """Built, and not switched off with ``BINLAKE_NATIVE_PGOUTPUT=0``."""
    from binlake import config

    return _pgoutc is not None and config.load(config.NativeSettings).pgoutput


def build_plan(table: SourceTable, oids: Sequence[int], info: binlog_pb2.TableInfo) -> Any | None:
    """The decoder's plan for ``table`` (its columns' type ``oids``, in the order pgoutput
    sends them) encoded against ``info``, or None when a column needs the Python path."""
    if _pgoutc is None or len(oids) != len(table.columns) or len(info.columns) != len(table.columns):
        return None
    cols = []
    for c, oid, ci in zip(table.columns, oids, info.columns, strict=True):
        kind = KINDS.get(oid)
        # codec.encode_row walks the TableInfo's columns; the tuple comes in the table's order.
        if kind is None or ci.name != c.name:
            return None
        cols.append((kind, ci.id, ci.nullable))
    return _pgoutc.Plan(cols)
