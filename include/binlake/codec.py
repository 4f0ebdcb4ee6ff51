"""binlake's row codec: Python values <-> typed ``Datum``s, rows <-> bytes.

The one place that decides how every value type travels in a binlog, so that
writers, Pumps, the lake and targets agree. Values by column type:

=========  =====================================  ==============================
type       Python value                           Datum
=========  =====================================  ==============================
int        int in [-2^63, 2^63)                   int_value (zigzag varint)
uint       int in [0, 2^64)                       uint_value
bool       bool                                   int_value 0/1
float      finite float                           float_value
decimal    decimal.Decimal (finite)               decimal_value, exact text
string     str (any unicode, any length)          string_value
bytes      bytes                                  bytes_value (NUL bytes kept)
date       datetime.date                          date_micros (days * 86400e6)
datetime   datetime.datetime (naive = UTC)        datetime_micros since epoch
time       datetime.time (or timedelta < 1 day)   time_micros since midnight
json       a JSON document; a str is JSON text     json_value, canonical text
(any)      None                                   is_null
=========  =====================================  ==============================

NaN and infinities are refused (ValueError): MySQL/MariaDB cannot store them,
so a backup that carried them could never be applied to every target.
Datetimes are normalised to UTC; their zone is not kept (the databases binlake
serves store timestamps without one). Decoding gives the same Python types back
(datetimes naive UTC), so ``decode(encode(v)) == v`` for every accepted value.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from binlake.proto import binlog_pb2

ColumnType = binlog_pb2.ColumnType

TYPE_NAMES: dict[str, int] = {
    "int": binlog_pb2.INT,
    "uint": binlog_pb2.UINT,
    "bool": binlog_pb2.BOOL,
    "float": binlog_pb2.FLOAT,
    "decimal": binlog_pb2.DECIMAL,
    "string": binlog_pb2.STRING,
    "bytes": binlog_pb2.BYTES,
    "date": binlog_pb2.DATE,
    "datetime": binlog_pb2.DATETIME,
    "time": binlog_pb2.TIME,
    "json": binlog_pb2.JSON,
}
TYPE_OF_CODE = {v: k for k, v in TYPE_NAMES.items()}

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
UINT_MAX = (1 << 64) - 1
_EPOCH = dt.datetime(1970, 1, 1)
_DAY_US = 86_400_000_000


def type_code(name: str) -> int:
    try:
        return TYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"unknown column type {name!r}; expected one of {', '.join(TYPE_NAMES)}") from None


# Protobuf wire types by field type (what follows a tag): 1 fixed64, 5 fixed32, 2
# length-delimited; every other scalar is a varint (0).
_WIRE_TYPES = {
    FieldDescriptor.TYPE_DOUBLE: 1, FieldDescriptor.TYPE_FIXED64: 1, FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_FLOAT: 5, FieldDescriptor.TYPE_FIXED32: 5, FieldDescriptor.TYPE_SFIXED32: 5,
    FieldDescriptor.TYPE_STRING: 2, FieldDescriptor.TYPE_BYTES: 2, FieldDescriptor.TYPE_MESSAGE: 2,
}


def wire_tag(message: Any, field: str) -> int:
    """The tag (field number << 3 | wire type) that starts ``field`` of ``message`` (a
    generated message class, e.g. ``binlog_pb2.Datum``) in its serialization.

    The paths that read or write serialized rows and binlogs by hand (the lake's
    image fast path, ``client.wire``) take their tags from here, so they follow
    binlog.proto; the C extensions' copies (``include/binlake/_native/binlake_tags.h``)
    are checked against this by tests/unit/test_native_tags.py."""
    fd = message.DESCRIPTOR.fields_by_name[field]
    # A packed repeated scalar (proto3's default) is one length-delimited field of all values.
    return int(fd.number) << 3 | (2 if fd.is_packed else _WIRE_TYPES.get(fd.type, 0))


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def canonical_json(value: Any) -> str:
    """JSON text with sorted keys and no spaces: equal documents, equal text."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON text: {exc}") from None
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value is not JSON-serialisable: {exc}") from None


def encode_value(value: Any, col_type: int, column: str = "value") -> binlog_pb2.Datum:
    """One value as a Datum; ValueError/TypeError name the column and what is wrong."""
    if value is None:
        return binlog_pb2.Datum(is_null=True)
    name = TYPE_OF_CODE.get(col_type, str(col_type))
    try:
        if col_type == binlog_pb2.INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"expected int, got {type(value).__name__}")
            if not INT_MIN <= value <= INT_MAX:
                raise ValueError(f"{value} is outside the signed 64-bit range")
            return binlog_pb2.Datum(int_value=value)
        if col_type == binlog_pb2.UINT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"expected int, got {type(value).__name__}")
            if not 0 <= value <= UINT_MAX:
                raise ValueError(f"{value} is outside the unsigned 64-bit range")
            return binlog_pb2.Datum(uint_value=value)
        if col_type == binlog_pb2.BOOL:
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise TypeError(f"expected bool, got {value!r}")
            return binlog_pb2.Datum(int_value=int(value))
        if col_type == binlog_pb2.FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"expected float, got {type(value).__name__}")
            f = float(value)
            if not math.isfinite(f):
                raise ValueError(f"{f} is not storable in MySQL/MariaDB; binlake refuses NaN and infinities")
            return binlog_pb2.Datum(float_value=f)
        if col_type == binlog_pb2.DECIMAL:
            if isinstance(value, (int, str)) and not isinstance(value, bool):
                value = decimal.Decimal(value)
            if not isinstance(value, decimal.Decimal):
                raise TypeError(f"expected Decimal, got {type(value).__name__} (floats lose precision)")
            if not value.is_finite():
                raise ValueError(f"{value} is not a finite decimal")
            return binlog_pb2.Datum(decimal_value=str(value))
        if col_type == binlog_pb2.STRING:
            if not isinstance(value, str):
                raise TypeError(f"expected str, got {type(value).__name__}")
            return binlog_pb2.Datum(string_value=value)
        if col_type == binlog_pb2.BYTES:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise TypeError(f"expected bytes, got {type(value).__name__}")
            return binlog_pb2.Datum(bytes_value=bytes(value))
        if col_type == binlog_pb2.DATETIME:
            if not isinstance(value, dt.datetime):
                raise TypeError(f"expected datetime, got {type(value).__name__}")
            if value.tzinfo is not None:
                try:
                    value = value.astimezone(dt.UTC).replace(tzinfo=None)
                except OverflowError:  # e.g. 0001-01-01 00:00:00+05: year 0 in UTC
                    raise ValueError(f"{value.isoformat()} is outside the years 1..9999 in UTC") from None
            return binlog_pb2.Datum(datetime_micros=_micros(value - _EPOCH))
        if col_type == binlog_pb2.DATE:
            if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
                raise TypeError(f"expected date, got {type(value).__name__}")
            return binlog_pb2.Datum(date_micros=(value - _EPOCH.date()).days * _DAY_US)
        if col_type == binlog_pb2.TIME:
            if isinstance(value, dt.timedelta):
                us = _micros(value)
            elif isinstance(value, dt.time):
                if value.tzinfo is not None:
                    raise ValueError("time with a zone is not supported")
                us = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
            else:
                raise TypeError(f"expected time, got {type(value).__name__}")
            if not 0 <= us < _DAY_US:
                raise ValueError("time must be within one day [00:00, 24:00)")
            return binlog_pb2.Datum(time_micros=us)
        if col_type == binlog_pb2.JSON:
            return binlog_pb2.Datum(json_value=canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{column} ({name}): {exc}") from None
    raise ValueError(f"{column}: unknown column type code {col_type}")


def decode_value(datum: binlog_pb2.Datum, col_type: int | None = None) -> Any:
    """A Datum back to its Python value (``col_type`` types BOOL; others are self-describing)."""
    kind = datum.WhichOneof("value")
    if kind is None or kind == "is_null":
        return None
    if kind == "int_value":
        return bool(datum.int_value) if col_type == binlog_pb2.BOOL else datum.int_value
    if kind == "uint_value":
        return datum.uint_value
    if kind == "float_value":
        return datum.float_value
    if kind == "decimal_value":
        return decimal.Decimal(datum.decimal_value)
    if kind == "string_value":
        return datum.string_value
    if kind == "bytes_value":
        return datum.bytes_value
    if kind == "date_micros":
        return _EPOCH.date() + dt.timedelta(days=datum.date_micros // _DAY_US)
    if kind == "datetime_micros":
        return _EPOCH + dt.timedelta(microseconds=datum.datetime_micros)
    if kind == "time_micros":
        us = datum.time_micros
        return dt.time(us // 3_600_000_000, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000)
    if kind == "json_value":
        return json.loads(datum.json_value)
    raise ValueError(f"unknown datum kind {kind}")


def encode_row(values: Mapping[str, Any], table: binlog_pb2.TableInfo) -> bytes:
    """A row (column name -> value) as a serialized Row, with every column of ``table``
    (missing ones are NULL). Unknown column names are an error."""
    known = {c.name for c in table.columns}
    extra = set(values) - known
    if extra:
        raise ValueError(f"table {table.db}.{table.name} has no column(s) {', '.join(sorted(extra))}")
    row = binlog_pb2.Row()
    for col in table.columns:
        value = values.get(col.name)
        if value is None and not col.nullable:
            raise ValueError(f"{table.name}.{col.name} is NOT NULL but the row has no value for it")
        row.columns.add(id=col.id, value=encode_value(value, col.type, f"{table.name}.{col.name}"))
    return bytes(row.SerializeToString())


def decode_row(data: bytes | binlog_pb2.Row, table: binlog_pb2.TableInfo) -> dict[str, Any]:
    """A serialized Row back to column name -> value, by the column ids of ``table``.
    Columns the row has but the table no longer has are skipped (a later DROP COLUMN);
    columns the table has but the row lacks are None (a later ADD COLUMN)."""
    row = binlog_pb2.Row.FromString(data) if isinstance(data, bytes) else data
    by_id = {c.id: c for c in table.columns}
    out: dict[str, Any] = {c.name: None for c in table.columns}
    for col in row.columns:
        info = by_id.get(col.id)
        if info is not None:
            out[info.name] = decode_value(col.value, info.type)
    return out


def encode_update(old: Mapping[str, Any], new: Mapping[str, Any], table: binlog_pb2.TableInfo) -> bytes:
    return bytes(binlog_pb2.UpdatedRow(
        old=binlog_pb2.Row.FromString(encode_row(old, table)),
        new=binlog_pb2.Row.FromString(encode_row(new, table)),
    ).SerializeToString())


def decode_update(data: bytes, table: binlog_pb2.TableInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    upd = binlog_pb2.UpdatedRow.FromString(data)
    return decode_row(upd.old, table), decode_row(upd.new, table)
