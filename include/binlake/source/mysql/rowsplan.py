"""The native row-event decoder (``_rowsc``): per-table plans and the hook under
mysql-replication.

A plan says, column by column, how the C decoder reads a value from a
WRITE/UPDATE/DELETE_ROWS body and which Datum it writes, so that the result is
byte for byte the serialized Row that ``values.RowEncoder`` builds from
mysql-replication's parse (the contract is stated in ``_rowsc.c``). It is
built once per TABLE_MAP (mysql-replication's binlog column types and
metadata + the tracked ``SourceTable`` + the table version's ``RowEncoder``); a
table with any column the decoder does not cover gets no plan, and all its
events take the Python path.

The hooks: with the native framer (``framing``), the source hands
``plan.decode`` the row images' span of the packet directly. Under
mysql-replication's own reader (``BINLAKE_NATIVE_FRAMING=0``), which parses a
rows event's header when it builds the event and its rows only when ``.rows``
is first read, ``decode`` takes the body bytes still unread in the packet and
never touches ``.rows``. Either way, when the decoder declines an event (None),
the Python path reads ``.rows`` from mysql-replication's event for the
untouched packet as if the decoder did not exist.

``BINLAKE_NATIVE_ROWS=0`` in the environment forces the Python path (read
when a source starts); without the built extension it is the only path.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.row_event import UpdateRowsEvent

from binlake.source.mysql.values import _PY_CHARSET, RowEncoder
from binlake.source.tables import SourceTable

# The extension module (typed by its .pyi), or None where it was not built.
_rowsc: ModuleType | None
try:  # optional: built by `pip install -e .` (setup.py); without it everything runs in Python
    from binlake.source.mysql import _rowsc
    _IMPORT_ERROR = ""
except ImportError as _exc:
    _rowsc = None
    _IMPORT_ERROR = str(_exc)

NATIVE_ROWS_ENV = "BINLAKE_NATIVE_ROWS"

# The decoder's operations (the OP_* of _rowsc.c).
OP_INT, OP_YEAR, OP_FLOAT32, OP_DOUBLE, OP_DECIMAL, OP_STRING, OP_BYTES = 1, 2, 3, 4, 5, 6, 7
OP_ENUM, OP_SET, OP_BIT, OP_DATE, OP_DATETIME2, OP_TIMESTAMP2, OP_TIME2, OP_TIMESTAMP = 8, 9, 10, 11, 12, 13, 14, 15

_INT_SIZES = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
              FIELD_TYPE.LONGLONG: 8}
# Single-byte charsets: decoded through a byte -> code point table built from
# Python's own codec, so the text is the codec's by construction.
_SINGLE_BYTE = frozenset({"latin1", "ascii", "binary", "cp1251", "cp1250", "koi8r"})
_UTF8 = frozenset({"utf8mb4", "utf8mb3", "utf8"})
_tables: dict[str, list[int]] = {}


def available() -> bool:
    """Whether ``_rowsc`` was built and imports (``import_error()`` says why not)."""
    return _rowsc is not None


def import_error() -> str:
    return _IMPORT_ERROR


def enabled() -> bool:
    """Built, and not switched off with ``BINLAKE_NATIVE_ROWS=0``."""
    from binlake import config

    return _rowsc is not None and config.load(config.NativeSettings).rows


def _byte_table(codec: str) -> list[int]:
    table = _tables.get(codec)
    if table is None:
        table = []
        for i in range(256):
            try:
                table.append(ord(bytes([i]).decode(codec)))
            except UnicodeDecodeError:
                table.append(-1)
        _tables[codec] = table
    return table


def _string_entry(size: int, charset: str | None) -> tuple[int, int, int, int, Any] | None:
    name = charset or "utf8mb4"
    if name in _UTF8:
        return OP_STRING, size, 0, 0, None
    if name in _SINGLE_BYTE:
        return OP_STRING, size, 0, 0, _byte_table(_PY_CHARSET[name])
    return None


def build_plan(binlog_columns: list[Any], table: SourceTable, enc: RowEncoder) -> Any | None:
    """The decoder's plan for one TABLE_MAP of ``table`` (its columns already named
    by ``values.prepare_table_map``), or None when any column needs the Python path."""
    if _rowsc is None or len(binlog_columns) != len(enc.plan):
        return None
    cols = []
    for bc, (c, cid, _ctype, nullable) in zip(binlog_columns, enc.plan, strict=True):
        t = bc.type
        kind = c.kind
        members: list[bytes] | None = None
        table_: Any = None
        entry: tuple[int, int, int, int] | None = None
        if t in _INT_SIZES and kind in ("int", "uint"):
            entry = (OP_INT, _INT_SIZES[t], int(kind == "uint"), int(kind == "uint"))
        elif t == FIELD_TYPE.YEAR and kind == "int":
            entry = (OP_YEAR, 1, 0, 0)
        elif t == FIELD_TYPE.FLOAT and kind == "float":
            entry = (OP_FLOAT32, 4, int(c.is_float32), 0)
        elif t == FIELD_TYPE.DOUBLE and kind == "float" and not c.is_float32:
            entry = (OP_DOUBLE, 8, 0, 0)
        elif t == FIELD_TYPE.NEWDECIMAL and kind == "decimal":
            entry = (OP_DECIMAL, 0, int(bc.precision), int(bc.decimals))
        elif t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB) and not (c.is_enum or c.is_set):
            size = int(bc.length_size) if t == FIELD_TYPE.BLOB else (2 if bc.max_length > 255 else 1)
            if kind == "string":
                s = _string_entry(size, c.charset)
                if s is None:
                    return None
                entry, table_ = s[:4], s[4]
            elif kind == "bytes" and not c.is_bit:
                pad = int(c.length) if c.is_fixed_binary and c.length else 0
                entry = (OP_BYTES, size, pad, 0)
        elif t == FIELD_TYPE.ENUM and kind == "string" and c.is_enum:
            members = [b""] + [m.encode("utf-8") for m in c.values]
            entry = (OP_ENUM, int(bc.size), 0, 0)
        elif t == FIELD_TYPE.SET and kind == "string" and c.is_set:
            if len(set(c.values)) != len(c.values):
                return None  # the Python path joins by membership: duplicates would differ
            members = [m.encode("utf-8") for m in c.values]
            entry = (OP_SET, int(bc.size), 0, 0)
        elif t == FIELD_TYPE.BIT and kind == "bytes" and c.is_bit:
            out = (int(c.length or 1) + 7) // 8
            if out > 8:
                return None
            entry = (OP_BIT, int(bc.bytes), int(bc.bits), out)
        elif t == FIELD_TYPE.DATE and kind == "date":
            entry = (OP_DATE, 3, 0, 0)
        elif t == FIELD_TYPE.DATETIME2 and kind == "datetime":
            entry = (OP_DATETIME2, 5, int(bc.fsp), 0)
        elif t == FIELD_TYPE.TIMESTAMP2 and kind == "datetime":
            entry = (OP_TIMESTAMP2, 4, int(bc.fsp), 0)
        elif t == FIELD_TYPE.TIMESTAMP and kind == "datetime":
            entry = (OP_TIMESTAMP, 4, 0, 0)
        elif t == FIELD_TYPE.TIME2 and kind == "time":
            entry = (OP_TIME2, 3, int(bc.fsp), 0)
        if entry is None:
            return None  # JSON, GEOMETRY, old DATETIME/TIME encodings, other charsets, ...
        # convert_value's NULL rule: a SET that may not be NULL reads NULL as the empty set.
        null_empty = c.is_set and not c.nullable
        cols.append((*entry, cid, nullable, null_empty, members, table_))
    try:
        return _rowsc.Plan(cols)
    except (ValueError, TypeError, OverflowError):
        return None  # metadata outside what the decoder reads (e.g. DECIMAL precision > 65)


def decode(plan: Any, ev: Any) -> list[bytes] | None:
    """The event's rows as serialized Rows (UpdatedRows for an update), or None when
    the decoder declines it; ``ev.rows`` is not read, so the Python path still can."""
    wrapper = ev.packet
    raw = getattr(wrapper, "packet", None)
    # The library's internals this relies on (mysql-replication 1.0's packet wrapper over
    # PyMySQL's MysqlPacket); if a version lacks them, every event takes the Python path.
    pending = getattr(wrapper, "_BinLogPacketWrapper__data_buffer", None)
    data = getattr(raw, "_data", None)
    start = getattr(raw, "_position", None)
    if (pending is None or pending or not isinstance(data, bytes) or not isinstance(start, int)
            or not ev.complete or ev.event_type == BINLOG.PARTIAL_UPDATE_ROWS_EVENT):
        return None
    if ev.number_of_columns != plan.columns():
        return None
    end = start + ev.event_size - wrapper.read_bytes
    update = isinstance(ev, UpdateRowsEvent)
    rows: list[bytes] | None = plan.decode(data, start, end, update, ev.columns_present_bitmap,
                                           ev.columns_present_bitmap2 if update else None)
    return rows

