"""Row-event values (as mysql-replication decodes them) -> binlake codec values.

The library decodes by the binlog's own column types; what it cannot know
without the table definition (names, signedness, charsets, ENUM/SET members)
``prepare_table_map`` fills in from the tracked ``SourceTable`` before any row of
that table is read, so the server's *current* schema is never consulted.
"""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

from binlake import codec, errors
from binlake.proto import binlog_pb2
from binlake.source.tables import SourceColumn, SourceTable

# Every string column is handed to the library as ISO 8859-1, so it returns
# the raw bytes as one code point each and encoding back is exact. (Not the
# name "latin1": pymysql maps that to cp1252, which leaves five bytes undefined.)
_RAW = "iso8859-1"
# MySQL charset names Python spells differently (pymysql knows most of them).
_PY_CHARSET = {"utf8mb4": "utf-8", "utf8mb3": "utf-8", "utf8": "utf-8", "latin1": "cp1252", "ascii": "ascii",
               "binary": "iso8859-1", "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf32": "utf-32-be",
               "gbk": "gbk", "gb2312": "gb2312", "big5": "big5", "sjis": "shift_jis", "ujis": "euc_jp",
               "euckr": "euc_kr", "cp1251": "cp1251", "cp1250": "cp1250", "koi8r": "koi8_r"}


def prepare_table_map(event: Any, table: SourceTable) -> None:
    """Name and type the columns of a TABLE_MAP event from the tracked definition;
    a column count that differs means the tracked schema is out of step."""
    cols = event.columns
    if len(cols) != len(table.columns):
        raise errors.FailedPrecondition(
            f"the binlog has {len(cols)} columns for {table.full_name} but the tracked definition has "
            f"{len(table.columns)}: a DDL was missed (was the table changed with binlog off?); restart the "
            "source from a snapshot"
        )
    for col, mine in zip(cols, table.columns, strict=True):
        col.name = mine.name
        col.unsigned = mine.kind == "uint"
        # Every string comes back as raw bytes (latin1 round trip); we decode it ourselves.
        col.character_set_name = _RAW
        if mine.values:
            if mine.is_enum:
                col.enum_values = [""] + mine.values
            elif mine.is_set:
                col.set_values = list(mine.values)


def convert_row(values: dict[str, Any], table: SourceTable) -> dict[str, Any]:
    return {c.name: convert_value(values.get(c.name), c, table) for c in table.columns}


def _float32(v: float) -> float:
    # FLOAT holds a 32-bit value; the server shows it with 6 significant digits
    # ("1.1", not 1.100000023841858). Keep the shortest text that is the same float32.
    for digits in range(6, 10):
        text = f"{v:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == v:
            return float(text)
    return v


def convert_value(v: Any, c: SourceColumn, table: SourceTable) -> Any:
    if v is None:
        if c.is_set and not c.nullable:
            return ""
        return None
    kind = c.kind
    try:
        if kind == "string":
            if c.is_set:
                if isinstance(v, (set, frozenset)):
                    return ",".join(m for m in c.values if m in v)
                return str(v)
            if c.is_enum:
                return str(v)
            raw = v.encode(_RAW) if isinstance(v, str) else bytes(v)
            return raw.decode(_PY_CHARSET.get(c.charset or "utf8mb4", c.charset or "utf-8"))
        if kind == "bytes":
            if c.is_bit:
                n = int(v, 2) if isinstance(v, str) else int(v)
                return n.to_bytes((int(c.length or 1) + 7) // 8, "big")
            raw = v.encode(_RAW) if isinstance(v, str) else bytes(v)
            if c.is_fixed_binary and c.length and len(raw) < c.length:
                raw = raw + b"\x00" * (c.length - len(raw))
            return raw
        if kind == "json":
            if isinstance(v, str):
                return v.encode(_RAW).decode("utf-8")
            if isinstance(v, (bytes, bytearray)):
                return bytes(v).decode("utf-8")
            return _json_plain(v)
        if kind == "float":
            return _float32(float(v)) if c.is_float32 else float(v)
        if kind in ("int", "uint"):
            return int(v)
        if kind == "decimal":
            return v
        if kind == "time":
            if isinstance(v, dt.timedelta):
                if not dt.timedelta(0) <= v < dt.timedelta(days=1):
                    raise ValueError(f"TIME value {v} is outside one day, which binlake's time type cannot carry")
                return v
            return v
        if kind in ("date", "datetime"):
            return v
    except (UnicodeDecodeError, ValueError, TypeError) as exc:
        raise errors.FailedPrecondition(f"{table.full_name}.{c.name}: cannot carry value: {exc}") from None
    return v


def _json_plain(v: Any) -> Any:
    # MySQL's binary JSON comes back with bytes keys/strings.
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, dict):
        return {_json_plain(k): _json_plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_plain(x) for x in v]
    return v


class RowEncoder:
    """Binlog row values -> serialized binlake Rows for one table version.

    The same conversions (``convert_value``) and checks (``codec.encode_value``)
    as ``codec.encode_row(convert_row(...))``, with the per-column plan worked
    out once per table version instead of once per row: integers and text, the
    bulk of most rows, go straight into their Datum."""

    def __init__(self, table: SourceTable, info: binlog_pb2.TableInfo) -> None:
        by_name = {c.name: c for c in info.columns}
        self.table = table
        self.info = info
        self.plan = [(c, by_name[c.name].id, by_name[c.name].type, by_name[c.name].nullable) for c in table.columns]

    def row(self, values: dict[str, Any]) -> binlog_pb2.Row:
        out = binlog_pb2.Row()
        add = out.columns.add
        for c, cid, ctype, nullable in self.plan:
            v = convert_value(values.get(c.name), c, self.table)
            if v is None:
                if not nullable:
                    raise ValueError(f"{self.table.name}.{c.name} is NOT NULL but the row has no value for it")
                add(id=cid, value=_NULL_DATUM)
            elif ctype == binlog_pb2.INT and type(v) is int and codec.INT_MIN <= v <= codec.INT_MAX:
                add(id=cid, value=binlog_pb2.Datum(int_value=v))
            elif ctype == binlog_pb2.STRING and type(v) is str:
                add(id=cid, value=binlog_pb2.Datum(string_value=v))
            else:
                add(id=cid, value=codec.encode_value(v, ctype, f"{self.table.name}.{c.name}"))
        return out

    def encode(self, values: dict[str, Any]) -> bytes:
        return bytes(self.row(values).SerializeToString())

    def encode_update(self, before: dict[str, Any], after: dict[str, Any]) -> bytes:
        return bytes(binlog_pb2.UpdatedRow(old=self.row(before), new=self.row(after)).SerializeToString())


_NULL_DATUM = binlog_pb2.Datum(is_null=True)
