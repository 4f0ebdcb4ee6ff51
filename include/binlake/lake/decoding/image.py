"""Image JSON: the text form of a row image in ``keys``, ``before`` and ``after``.

Image JSON is canonical and lossless: one object, keys sorted, no spaces,
non-ASCII kept as is, so equal rows always give equal text (a key can be
compared as a string). Values:

============  =================================================  ==================
column type   JSON value                                         example
============  =================================================  ==================
(any) NULL    null                                               null
int, uint     number, exact (any 64-bit value)                   -42
bool          true / false                                       true
float         number with a fraction or exponent (shortest        1.0, 1e+16
              text that round-trips), never NaN/Infinity
decimal       string with the exact stored digits                "12.50"
string        string                                             "héllo"
bytes         object tagged ``$base64``                           {"$base64":"AAE="}
date          string ``YYYY-MM-DD``                              "2026-11-21"
datetime      string, ISO, always microseconds, UTC, no zone      "2026-11-21T08:00:00.000000"
time          string ``HH:MM:SS.ffffff``                         "08:00:00.000001"
json          the document itself (canonical), not a string      {"a":[1,2]}
============  =================================================  ==================

Decimals are strings because a JSON number is read back as a double by most
tools (losing digits); floats always show a fraction or exponent so they never
read back as integers. Bytes carry a tag rather than a bare string so a
reader never mistakes them for text. ``image_values`` reads an image back to
the exact Python values ``binlake.codec`` produces, given the definition.

``TablePlan`` turns a table definition's serialized rows into image JSON (in C
through ``binlake.lake.decoding.native`` when it is built, with this module's Python
path as the reference and fallback).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Iterable
from typing import Any

from binlake import codec
from binlake.lake.decoding import native as native_mod
from binlake.lake.decoding.txn import CorruptBinlogError
from binlake.proto import binlog_pb2

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = _EPOCH.date()
_DAY_US = 86_400_000_000
# The C-accelerated JSON string quoting, without \\u escapes for non-ASCII.
_quote = json.encoder.encode_basestring


def _datum_json(datum: binlog_pb2.Datum, col_type: int) -> str:
    kind = datum.WhichOneof("value")
    if kind == "int_value":
        if col_type == binlog_pb2.BOOL:
            return "true" if datum.int_value else "false"
        return str(datum.int_value)
    if kind == "string_value":
        return _quote(datum.string_value)
    if kind is None or kind == "is_null":
        return "null"
    if kind == "decimal_value":
        return _quote(datum.decimal_value)
    if kind == "datetime_micros":
        return '"' + (_EPOCH + dt.timedelta(microseconds=datum.datetime_micros)).isoformat(
            timespec="microseconds") + '"'
    if kind == "uint_value":
        return str(datum.uint_value)
    if kind == "float_value":
        if not math.isfinite(datum.float_value):  # JSON has no NaN/Infinity (and the codec refuses them)
            raise CorruptBinlogError(f"float {datum.float_value} in a binlog: binlake refuses NaN and infinities")
        return repr(datum.float_value)
    if kind == "bytes_value":
        return '{"$base64":"' + base64.b64encode(datum.bytes_value).decode("ascii") + '"}'
    if kind == "date_micros":
        return '"' + (_EPOCH_DATE + dt.timedelta(days=datum.date_micros // _DAY_US)).isoformat() + '"'
    if kind == "time_micros":
        us = datum.time_micros
        return f'"{us // 3_600_000_000:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}"'
    if kind == "json_value":
        # The codec stores JSON documents canonically already.
        return datum.json_value
    raise CorruptBinlogError(f"unknown datum kind {kind}")


def value_json(value: Any, col_type: int | str) -> str:
    """One Python value (as ``codec`` accepts for ``col_type``) in image JSON."""
    code = codec.type_code(col_type) if isinstance(col_type, str) else col_type
    return _datum_json(codec.encode_value(value, code), code)


def _flat_messages() -> tuple[Any, Any]:
    """Two message classes that read binlake's Row and UpdatedRow bytes as plain maps
    column id -> serialized Datum: a Row's ``repeated Column{id = 1; value = 2}`` has
    exactly the wire shape of ``map<int64, bytes>``. One C-level parse then gives every
    datum's bytes without a Python object per column, which is what makes decoding
    fast enough (``_datum_bytes_json`` reads the common kinds straight from the bytes)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="binlake_lake_flat.proto", package="binlake.lakeflat",
                                               syntax="proto3")
    row = proto.message_type.add(name="FlatRow")
    entry = row.nested_type.add(name="ColumnsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    row.field.add(name="columns", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED,
                  type_name=".binlake.lakeflat.FlatRow.ColumnsEntry")
    upd = proto.message_type.add(name="FlatUpdatedRow")
    upd.field.add(name="old", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                  type_name=".binlake.lakeflat.FlatRow")
    upd.field.add(name="new", number=2, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                  type_name=".binlake.lakeflat.FlatRow")
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with the generated modules
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("binlake.lakeflat.FlatRow")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("binlake.lakeflat.FlatUpdatedRow")))


_FlatRow, _FlatUpdatedRow = _flat_messages()
_TD = dt.timedelta
# The first byte of a serialized Datum: the tag of the one field it holds.
_IS_NULL, _INT, _DECIMAL, _STRING, _DATETIME, _JSON = (
    codec.wire_tag(binlog_pb2.Datum, f)
    for f in ("is_null", "int_value", "decimal_value", "string_value", "datetime_micros", "json_value"))


def _varint(b: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        x = b[i]
        result |= (x & 0x7F) << shift
        i += 1
        if x < 0x80:
            return result, i
        shift += 7


def _slow_json(b: bytes, col_type: int) -> str:
    return _datum_json(binlog_pb2.Datum.FromString(b), col_type)


def _datum_bytes_json(b: bytes, col_type: int) -> str:
    """``_datum_json`` of a serialized Datum, reading the common kinds (string,
    decimal, int, bool, null, datetime, json) from the bytes; anything else, or any
    encoding other than the one field a Datum normally holds, goes through the
    protobuf parse, so the result is always exactly ``_datum_json``'s."""
    if not b:
        return "null"
    tag = b[0]
    if tag == _STRING or tag == _DECIMAL:
        n = b[1]
        if n < 0x80:
            if n + 2 == len(b):
                return _quote(b[2:].decode())
        else:
            n, i = _varint(b, 1)
            if n + i == len(b):
                return _quote(b[i:].decode())
        return _slow_json(b, col_type)
    if tag == _INT:  # zigzag
        v, i = _varint(b, 1)
        if i != len(b):
            return _slow_json(b, col_type)
        v = (v >> 1) ^ -(v & 1)
        if col_type == binlog_pb2.BOOL:
            return "true" if v else "false"
        return str(v)
    if tag == _IS_NULL:
        return "null"
    if tag == _DATETIME:  # zigzag
        v, i = _varint(b, 1)
        if i != len(b):
            return _slow_json(b, col_type)
        return '"' + (_EPOCH + _TD(microseconds=(v >> 1) ^ -(v & 1))).isoformat(timespec="microseconds") + '"'
    if tag == _JSON:  # already canonical JSON text
        n = b[1]
        if n < 0x80:
            if n + 2 == len(b):
                return b[2:].decode()
        else:
            n, i = _varint(b, 1)
            if n + i == len(b):
                return b[i:].decode()
    return _slow_json(b, col_type)


class TablePlan:
    """What decoding one table definition needs, computed once per definition."""

    __slots__ = ("info", "db", "tbl", "version", "cols", "key_idx", "native")

    def __init__(self, info: binlog_pb2.TableInfo, native: bool = False) -> None:
        self.info = info
        self.db = info.db
        self.tbl = info.name
        self.version = info.schema_version
        ordered = sorted(info.columns, key=lambda c: c.name)
        # (column id, '"name":', type) in the canonical (sorted) key order.
        self.cols = [(c.id, _quote(c.name) + ":", c.type) for c in ordered]
        pk = set(info.primary_key)
        self.key_idx = [i for i, c in enumerate(ordered) if c.id in pk]
        # The same plan in C (same columns, order and prefixes, so the same text). A
        # definition it refuses (a column id twice) is decoded in Python.
        self.native: Any = None
        if native and native_mod.imagec() is not None and len({c[0] for c in self.cols}) == len(self.cols):
            try:
                self.native = native_mod.imagec().Plan(self.cols, self.key_idx)
            except (ValueError, OverflowError, TypeError):
                self.native = None

    def mutation_into(self, columns: Any, sequence: Iterable[int], inserted: Any, updated: Any,
                      deleted: Any) -> int:
        """One TableMutation's rows in sequence order (``mutation_py``, natively when
        this plan has a native twin), appending their op, keys, before and after to ``columns``
        (an ``_imagec.Columns``: Arrow string buffers) instead of returning lists; the
        number of rows appended. Rows the native twin hands back, and whole mutations
        of a plan without one, are decoded here and appended in their place. On an
        exception nothing of this mutation is appended."""
        if self.native is not None:
            return int(self.native.mutation_into(columns, sequence, inserted, updated, deleted, self))
        ops, keys, befores, afters = self.mutation_py(sequence, inserted, updated, deleted)
        columns.extend(ops, keys, befores, afters)
        return len(ops)

    def mutation_py(self, sequence: Iterable[int], inserted: Any, updated: Any,
                    deleted: Any) -> tuple[list[str], list[str], list[str | None], list[str | None]]:
        """(ops, keys, befores, afters) of one TableMutation's rows, in sequence order, in
        pure Python (the reference the native path must equal). Raises what decoding
        the bytes raises (the caller wraps it)."""
        ins = upd = dele = 0
        ops: list[str] = []
        keys: list[str] = []
        befores: list[str | None] = []
        afters: list[str | None] = []
        for kind in sequence:
            if kind == binlog_pb2.INSERT:
                after, key = self.images(inserted[ins])
                ins += 1
                ops.append("insert")
                befores.append(None)
                afters.append(after)
            elif kind == binlog_pb2.UPDATE:
                before, after, key = self.update_images(updated[upd])
                upd += 1
                ops.append("update")
                befores.append(before)
                afters.append(after)
            elif kind == binlog_pb2.DELETE_ROW:
                before, key = self.images(deleted[dele])
                dele += 1
                ops.append("delete")
                befores.append(before)
                afters.append(None)
            else:
                self.unknown_kind(kind)  # raises
            keys.append(key)
        return ops, keys, befores, afters

    @staticmethod
    def unknown_kind(kind: int) -> None:
        """Raises the error of a sequence entry that is no MutationType (both paths)."""
        raise CorruptBinlogError(f"unknown mutation type {kind}")

    def images(self, row: bytes | Any) -> tuple[str, str]:
        """(full image JSON, key image JSON) of a serialized Row (or a parsed flat row).
        Columns the row has but the definition does not are not part of the image;
        columns it lacks are null (as ``codec.decode_row``)."""
        values = (_FlatRow.FromString(row) if isinstance(row, bytes) else row).columns
        parts = [prefix + _datum_bytes_json(values.get(cid, b""), col_type) for cid, prefix, col_type in self.cols]
        return "{" + ",".join(parts) + "}", "{" + ",".join([parts[i] for i in self.key_idx]) + "}"

    def update_images(self, data: bytes) -> tuple[str, str, str]:
        """(before JSON, after JSON, after's key JSON) of a serialized UpdatedRow. An update
        usually changes few columns: a datum whose bytes did not change reuses its text."""
        upd = _FlatUpdatedRow.FromString(data)
        old, new = upd.old.columns, upd.new.columns
        before: list[str] = []
        after: list[str] = []
        for cid, prefix, col_type in self.cols:
            was = old.get(cid, b"")
            now = new.get(cid, b"")
            text = prefix + _datum_bytes_json(was, col_type)
            before.append(text)
            after.append(text if now == was else prefix + _datum_bytes_json(now, col_type))
        return ("{" + ",".join(before) + "}", "{" + ",".join(after) + "}",
                "{" + ",".join([after[i] for i in self.key_idx]) + "}")


def image_values(image: str | None, table: binlog_pb2.TableInfo) -> dict[str, Any] | None:
    """An image JSON back to column name -> Python value, exactly as ``codec``
    decodes the binlog (the inverse of the encoding above, typed by ``table``)."""
    if image is None:
        return None
    if not isinstance(table, binlog_pb2.TableInfo):
        raise TypeError(f"table must be a TableInfo, got {type(table).__name__}")
    try:
        doc = json.loads(image, parse_float=float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not image JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"an image is a JSON object, got {type(doc).__name__}")
    types = {c.name: c.type for c in table.columns}
    unknown = sorted(set(doc) - set(types))
    if unknown:
        raise ValueError(f"image has column(s) {', '.join(unknown)} that {table.db}.{table.name} does not")
    return {name: _value_of(doc.get(name), col_type) for name, col_type in types.items()}


def _value_of(v: Any, col_type: int) -> Any:
    if v is None:
        return None
    if col_type == binlog_pb2.JSON:
        return v
    if isinstance(v, dict) and set(v) == {"$base64"}:
        return base64.b64decode(v["$base64"])
    if col_type in (binlog_pb2.INT, binlog_pb2.UINT):
        return int(v)
    if col_type == binlog_pb2.BOOL:
        return bool(v)
    if col_type == binlog_pb2.FLOAT:
        return float(v)
    if col_type == binlog_pb2.DECIMAL:
        return decimal.Decimal(v) if isinstance(v, str) else v
    if col_type == binlog_pb2.DATE:
        return dt.date.fromisoformat(v)
    if col_type == binlog_pb2.DATETIME:
        return dt.datetime.fromisoformat(v)
    if col_type == binlog_pb2.TIME:
        return dt.time.fromisoformat(v)
    return v

