"""Table checksums: one number per table that is equal exactly when two
databases hold the same rows, computed the same way on every database binlake
has a target for (SQLite, PostgreSQL, MySQL/MariaDB, DuckDB).

Each value is normalised to a canonical text by its type (so a decimal 1.50
read from PostgreSQL equals 1.5 read from SQLite), each row is hashed over its
column names and values (blake2b, 8 bytes), and the row hashes are combined
order-independently (their sum mod 2^64 and their XOR), so insertion order and
physical layout never matter. Rows are streamed, never loaded all at once.

Where the database has binlake's ``_binlake_schema`` (an upstream written by
TxnWriter), column types come from binlake's own table definitions, so values
stored as text (SQLite decimals) read back typed; otherwise from reflection.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import re
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from binlake import codec, errors
from binlake.proto import binlog_pb2
from binlake.sql import targets
from binlake.sql.targets.base import INTERNAL_PREFIX, recorded_schema
from binlake.sql.url import reader_engine

_MASK = (1 << 64) - 1
_NULL = b"\x00"  # a NULL is one tag byte; a value is another tag plus its framed text
_VALUE = b"\x01"
_BATCH = 2000


def canonical(value: Any, json_column: bool = False) -> str | None:
    """The canonical text of one value (None for SQL NULL)."""
    if value is None:
        return None
    if json_column:
        # Drivers hand JSON columns back parsed; a Python str is a JSON string.
        if isinstance(value, str):
            return codec.canonical_json(json.dumps(value))
        return codec.canonical_json(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        if value.is_zero():
            return "0"
        return format(value.normalize(), "f")
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, str):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:  # as the codec carries it (naive UTC), e.g. a PostgreSQL timestamptz
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return str(value.isoformat(sep="T", timespec="microseconds"))
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.timedelta):
        # MySQL's TIME arrives as a timedelta; inside one day it is a time of day.
        if dt.timedelta(0) <= value < dt.timedelta(days=1):
            return (dt.datetime.min + value).time().isoformat(timespec="microseconds")
        return str(value)
    if isinstance(value, (dict, list)):
        return codec.canonical_json(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def _frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def row_hash(row: Mapping[str, Any], json_columns: Iterable[str] = ()) -> int:
    """The 64-bit hash of one row: column names sorted, name = canonical value."""
    js = set(json_columns)
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(row):
        h.update(_frame(name.encode()))
        text = canonical(row[name], name in js)
        if text is None:
            h.update(_NULL)
        else:
            h.update(_VALUE + _frame(text.encode()))
    return int.from_bytes(h.digest(), "big")


class _Acc:
    def __init__(self) -> None:
        self.rows = 0
        self.total = 0
        self.xor = 0

    def add(self, h: int) -> None:
        self.rows += 1
        self.total = (self.total + h) & _MASK
        self.xor ^= h

    def hex(self) -> str:
        return f"{self.total:016x}{self.xor:016x}"


def load_schema(url: str) -> dict[str, binlog_pb2.TableInfo]:
    """binlake's current table definitions in ``url`` (empty if it has none)."""
    engine = reader_engine(url)
    try:
        with engine.connect() as conn:
            return recorded_schema(conn)
    except sa.exc.OperationalError as exc:
        raise errors.Unavailable(f"cannot read {_show(engine)}: {errors.first_line(exc)}") from None
    finally:
        engine.dispose()


def checksum(url: str, tables: Sequence[str] | None = None, *, include_internal: bool = False,
             schema: Mapping[str, binlog_pb2.TableInfo] | None = None,
             portable: bool = False) -> dict[str, tuple[int, str]]:
    """``{table: (row_count, checksum_hex)}`` for every table of ``url`` (or the
    named ones). binlake's own ``_binlake_*`` tables are skipped unless named or
    ``include_internal``. ``schema`` gives binlake table definitions to type the
    columns by (default: the database's own ``_binlake_schema``, if any).
    ``portable``: in the portable rendering (``portable_row_text``), the one a
    Spark frame's checksum is computed in (``binlake.restore.sparksum``)."""
    engine = reader_engine(url)
    try:
        with engine.connect() as conn:
            # One snapshot for every table, so the checksums belong to one moment.
            level = targets.kind(engine.dialect.name).snapshot_isolation
            if level is not None:
                conn = conn.execution_options(isolation_level=level)
            names = sa.inspect(conn).get_table_names()
            if tables:
                missing = [t for t in tables if t not in names]
                if missing:
                    shown = ", ".join(sorted(n for n in names if not n.startswith(INTERNAL_PREFIX))) or "none"
                    raise errors.NotFound(f"no table(s) {', '.join(missing)} in {_show(engine)} (tables: {shown})")
                wanted = list(dict.fromkeys(tables))
            else:
                wanted = [n for n in names if include_internal or not n.startswith(INTERNAL_PREFIX)]
            defs = dict(schema) if schema is not None else recorded_schema(conn)
            return {name: _table_checksum(conn, name, defs.get(name), portable) for name in sorted(wanted)}
    except sa.exc.OperationalError as exc:
        raise errors.Unavailable(f"cannot read {_show(engine)}: {errors.first_line(exc)}") from None
    finally:
        engine.dispose()


def _table_checksum(conn: Connection, name: str, info: binlog_pb2.TableInfo | None,
                    portable: bool = False) -> tuple[int, str]:
    if portable:
        return _portable_checksum(conn, name, info)
    table, json_cols = _read_shape(conn, name, info)
    acc = _Acc()
    result = conn.execution_options(yield_per=_BATCH).execute(sa.select(table))
    for row in result:
        acc.add(row_hash(cast("Mapping[str, Any]", row._mapping), json_cols))
    return acc.rows, acc.hex()


def _read_shape(conn: Connection, name: str, info: binlog_pb2.TableInfo | None) -> tuple[sa.Table, list[str]]:
    """The table ``name`` to read (typed by ``info`` when it holds exactly its columns, else
    reflected) and its JSON columns."""
    table = _typed_table(conn, name, info)
    if table is None:
        table = targets.kind(conn.dialect.name).reflect(conn, name)
    return table, [c.name for c in table.columns if isinstance(c.type, sa.JSON)]


def _typed_table(conn: Connection, name: str, info: binlog_pb2.TableInfo | None) -> sa.Table | None:
    """binlake's Table for ``info`` if the stored table has exactly its columns."""
    if info is None:
        return None
    stored = set(targets.kind(conn.dialect.name).column_names(conn, name))
    if stored != {c.name for c in info.columns}:
        return None
    renamed = binlog_pb2.TableInfo()
    renamed.CopyFrom(info)
    renamed.name = name
    return targets.kind(conn.dialect.name).sa_table(renamed)


def _show(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


# The portable rendering: the same canonical text per value (a float as its IEEE
# 754 bits, the one spelling Spark and Python share), each row framed as text and
# hashed with MD5 (first 8 bytes), so a Spark executor can compute a row's hash
# with built-in SQL functions (``binlake.restore.sparksum``) and this process the
# same one from a database's rows: a restored frame and a database table compare
# by checksum without either table passing through one process.
def portable_text(value: Any, json_column: bool = False) -> str | None:
    """The canonical text of one value in the portable rendering (None for SQL NULL)."""
    if isinstance(value, float) and not json_column:
        return str(struct.unpack(">q", struct.pack(">d", value))[0])
    text = canonical(value, json_column)
    if json_column and text is not None:
        # The lake keeps a JSON document's characters beyond the BMP as \\u surrogate pairs.
        text = _ASTRAL.sub(_surrogates, text)
    return text


_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")


def _surrogates(m: re.Match[str]) -> str:
    code = ord(m.group(0)) - 0x10000
    return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"


def name_frame(name: str) -> str:
    """A column name's frame in a portable row text."""
    return f"{len(name.encode())}:{name}"


def portable_row_text(row: Mapping[str, Any], json_columns: Iterable[str] = ()) -> str:
    """A row as portable text: for each column name, sorted, its frame, then ``N`` for
    NULL or ``V<bytes>:<text>``."""
    js = set(json_columns)
    parts = []
    for name in sorted(row):
        text = portable_text(row[name], name in js)
        parts.append(name_frame(name) + ("N" if text is None else f"V{len(text.encode())}:{text}"))
    return "".join(parts)


def portable_hash(text: str) -> int:
    """The 64-bit row hash of a portable row text: MD5's first 8 bytes, big-endian."""
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[:8], "big")


def _portable_checksum(conn: Connection, name: str, info: binlog_pb2.TableInfo | None) -> tuple[int, str]:
    """``portable_rows``' hashes of a whole table, summed: the same texts, built with the
    columns' order, frames and kinds worked out once (a drill reads every restored row)."""
    table, json_list = _read_shape(conn, name, info)
    names = [c.name for c in table.columns]
    json_cols = set(json_list)
    order = sorted(range(len(names)), key=lambda i: names[i])
    plan = [(i, name_frame(names[i]), names[i] in json_cols) for i in order]
    md5 = hashlib.md5
    total = xor = rows = 0
    result = conn.execution_options(yield_per=_BATCH).execute(sa.select(table))
    for row in result:
        parts = []
        for i, frame, js in plan:
            v = row[i]
            if v is None:
                parts.append(frame + "N")
                continue
            # The common kinds first; the rest as portable_text renders them.
            text = v if type(v) is str and not js else str(v) if type(v) is int else portable_text(v, js)
            if text is None:
                parts.append(frame + "N")
            else:
                parts.append(f"{frame}V{len(text.encode())}:{text}")
        h = int.from_bytes(md5("".join(parts).encode(), usedforsecurity=False).digest()[:8], "big")
        rows += 1
        total = (total + h) & _MASK
        xor ^= h
    return rows, f"{total:016x}{xor:016x}"


def portable_rows(conn: Connection, name: str, info: binlog_pb2.TableInfo | None,
                  key: Sequence[str]) -> Iterable[tuple[str, int]]:
    """Each row of table ``name`` as (its ``key`` columns' portable texts as a JSON list,
    its portable hash), streamed."""
    table, json_cols = _read_shape(conn, name, info)
    result = conn.execution_options(yield_per=_BATCH).execute(sa.select(table))
    for row in result:
        values = cast("Mapping[str, Any]", row._mapping)
        text = portable_row_text(values, json_cols)
        yield (json.dumps([portable_text(values[k], k in json_cols) for k in key]), portable_hash(text))
