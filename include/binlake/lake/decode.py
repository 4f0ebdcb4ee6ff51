"""Complete transactions -> change rows and DDL-history rows (pure functions).

A *complete transaction* is what a Pump serves: a COMMIT binlog carrying its
prewrite's ``prewrite_value`` (and, for DDL, ``ddl_query``/``ddl_table``).
Rows in a binlog are column id -> typed datum; turning them into named images
needs the table definition in force when the transaction committed, which is
what ``SchemaHistory`` answers.

Change rows (the ``changes`` table, ``CHANGE_COLUMNS``)::

    commit_ts long, start_ts long, seq int, commit_date date, db string, tbl string,
    table_id long, op string, keys string, before string, after string,
    schema_version long, pump string

* ``seq`` - position of the change inside its transaction: the mutations in
  their order in the prewrite (one per table, in order of first touch), each
  one's changes in its ``sequence`` order, numbered from 0 across tables.
* ``commit_date`` - the UTC date of ``commit_ts`` (the partition column).
* ``op`` - ``insert``, ``update`` or ``delete``.
* ``keys`` - image JSON of the primary-key columns only: the after image's for
  insert/update (an update that changes the key carries the new key here and
  the old one in ``before``), the before image's for delete.
* ``before``/``after`` - image JSON of the whole row (``before`` is null for an
  insert, ``after`` for a delete).
* ``schema_version`` - the version of the table definition the images were
  decoded with: the ``ddl_history`` row with this ``table_id`` and
  ``schema_version`` holds the column types needed to read them back typed.

Image JSON (the format of ``keys``, ``before`` and ``after``) is canonical and
lossless: one object, keys sorted, no spaces, non-ASCII kept as is, so equal
rows always give equal text (a key can be compared as a string). Values:

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

Native decoding: the step serialized row -> image JSON runs in the C extension
``binlake.lake._imagec`` when it is built (``pip install -e .`` builds it), which
returns exactly the text of the pure-Python path below, or hands the row back to
it (anything unusual: garbled bytes, invalid UTF-8, NaN, dates beyond year
9999), so results and errors never depend on whether it is there. Without the
extension everything runs in Python; ``BINLAKE_NATIVE_DECODE=0`` in the
environment forces the Python path (a diagnostic switch, read when a
``ChangeDecoder`` is made). Natively, ``ChangeDecoder`` has the C code write the
images (and op) straight into Arrow's string layout (``StringColumn``), rows
handed back to Python included, in their place: the Arrow batch the data source
builds from either path is the same (``batch.equals``).

DDL rows (the ``ddl_history`` table, ``DDL_COLUMNS``)::

    commit_ts long, start_ts long, schema_version long, db string, tbl string,
    table_id long, previous_table_id long, dropped boolean, query string,
    table_info binary (a serialized TableInfo), table_json string
"""

from __future__ import annotations

import array
import base64
import bisect
import dataclasses
import datetime as dt
import decimal
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from binlake import codec, errors, tso
from binlake.proto import binlog_pb2

try:  # the native image decoder; optional: without it the pure-Python path does everything
    from binlake.lake import _imagec  # type: ignore[attr-defined, unused-ignore]
    _IMAGEC_ERROR = ""
except ImportError as _exc:  # not built (no C compiler when installed), or built for another Python
    _imagec = None
    _IMAGEC_ERROR = str(_exc)

CHANGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("commit_ts", "long"), ("start_ts", "long"), ("seq", "int"), ("commit_date", "date"),
    ("db", "string"), ("tbl", "string"), ("table_id", "long"), ("op", "string"), ("keys", "string"),
    ("before", "string"), ("after", "string"), ("schema_version", "long"), ("pump", "string"),
)
DDL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("commit_ts", "long"), ("start_ts", "long"), ("schema_version", "long"), ("db", "string"),
    ("tbl", "string"), ("table_id", "long"), ("previous_table_id", "long"), ("dropped", "boolean"),
    ("query", "string"), ("table_info", "binary"), ("table_json", "string"),
)
# Spark DDL strings of the two row shapes (DataFrame schemas and the data source's).
CHANGES_DDL = ", ".join(f"{name} {kind}" for name, kind in CHANGE_COLUMNS)
DDL_HISTORY_DDL = ", ".join(f"{name} {kind}" for name, kind in DDL_COLUMNS)

OPS = ("insert", "update", "delete")
_DAY_MS = 86_400_000
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = _EPOCH.date()
_DAY_US = 86_400_000_000
# The C-accelerated JSON string quoting, without \\u escapes for non-ASCII.
_quote = json.encoder.encode_basestring
NATIVE_DECODE_ENV = "BINLAKE_NATIVE_DECODE"


def native_available() -> bool:
    """Whether the native image decoder (``binlake.lake._imagec``) was built and imports
    (``native_import_error()`` says why not)."""
    return _imagec is not None


def native_import_error() -> str:
    """Why ``binlake.lake._imagec`` did not import ("" when it did)."""
    return _IMAGEC_ERROR


def native_enabled() -> bool:
    """Whether a ChangeDecoder uses the native decoder by default: it is built and
    ``BINLAKE_NATIVE_DECODE`` is not ``0``."""
    return _imagec is not None and os.environ.get(NATIVE_DECODE_ENV, "").strip() != "0"


class UnknownTableError(errors.FailedPrecondition):
    """A row change names a table id the schema history has no definition for at
    its commit_ts. Decoding never drops such a change silently."""

    def __init__(self, message: str, table_id: int, commit_ts: int) -> None:
        super().__init__(message)
        self.table_id = table_id
        self.commit_ts = commit_ts


class CorruptBinlogError(errors.InvalidArgument):
    """A served transaction whose bytes do not decode (never skipped)."""


def _check_ts(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer TSO, got {type(value).__name__}")
    if not 0 <= value <= tso.MAX_TS:
        raise ValueError(f"{name} must be a TSO in [0, 2^63), got {value}")
    return value


def commit_date_days(commit_ts: int) -> int:
    """Days since 1970-01-01 of ``commit_ts``'s UTC date (Arrow's date32)."""
    return (commit_ts >> tso.LOGICAL_BITS) // _DAY_MS


def commit_date(commit_ts: int) -> dt.date:
    """The UTC date of ``commit_ts``: the partition value of its change rows."""
    _check_ts("commit_ts", commit_ts)
    return _EPOCH_DATE + dt.timedelta(days=commit_date_days(commit_ts))


# ---------------------------------------------------------------- schema history
@dataclasses.dataclass(frozen=True)
class _Version:
    commit_ts: int
    info: binlog_pb2.TableInfo | None  # None: the id was retired (TRUNCATE gave the table a new id)
    why: str = ""


class SchemaHistory:
    """Every table definition with the commit_ts from which it is in force.

    ``table(table_id, commit_ts)`` is the definition a transaction committed at
    ``commit_ts`` was written with: the newest one whose DDL committed strictly
    before it. Definitions added without a commit_ts (``from_tables``) count as
    in force since 0. DDLs may be added in any order; lookups always see them in
    commit_ts order.
    """

    def __init__(self) -> None:
        self._versions: dict[int, list[_Version]] = {}
        self._ts: dict[int, list[int]] = {}

    # -- building
    @classmethod
    def from_tables(cls, tables: Iterable[binlog_pb2.TableInfo], commit_ts: int = 0) -> SchemaHistory:
        """A history holding ``tables`` as in force since ``commit_ts`` (default 0)."""
        history = cls()
        for info in tables:
            history.add(commit_ts, info)
        return history

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any] | Any]) -> SchemaHistory:
        """A history from ``ddl_history`` rows (mappings or Spark Rows with
        ``commit_ts`` and ``table_info``); rows without a table definition are skipped."""
        history = cls()
        for row in rows:
            get = row.get if isinstance(row, Mapping) else row.__getitem__
            raw = get("table_info")
            if raw:
                history.add(cast(int, get("commit_ts")), _parse_table(bytes(raw), f"ddl_history row at {get('commit_ts')}"))
        return history

    def apply(self, ddl: binlog_pb2.Binlog) -> None:
        """Add the table definition a DDL transaction carries (as of its commit_ts).
        A DDL without a definition changes nothing."""
        if not isinstance(ddl, binlog_pb2.Binlog):
            raise TypeError(f"apply takes a Binlog, got {type(ddl).__name__}")
        if not ddl.ddl_query:
            raise ValueError(f"transaction start_ts {ddl.start_ts} is not a DDL (no ddl_query)")
        if ddl.HasField("ddl_table"):
            self.add(ddl.commit_ts, ddl.ddl_table)

    def add(self, commit_ts: int, info: binlog_pb2.TableInfo) -> None:
        """Record ``info`` as in force from ``commit_ts`` on (TRUNCATE also retires
        the id it replaced; a dropped table resolves to an error afterwards)."""
        _check_ts("commit_ts", commit_ts)
        if not isinstance(info, binlog_pb2.TableInfo):
            raise TypeError(f"expected a TableInfo, got {type(info).__name__}")
        if info.table_id <= 0:
            raise ValueError(f"table definition {info.db}.{info.name} has no table id")
        copy = binlog_pb2.TableInfo()
        copy.CopyFrom(info)
        self._insert(info.table_id, _Version(commit_ts, copy))
        if info.previous_table_id:
            why = f"replaced by table id {info.table_id} (TRUNCATE {info.db}.{info.name})"
            self._insert(info.previous_table_id, _Version(commit_ts, None, why))

    def _insert(self, table_id: int, version: _Version) -> None:
        stamps = self._ts.setdefault(table_id, [])
        versions = self._versions.setdefault(table_id, [])
        # After any equal commit_ts, so re-adding the same DDL keeps the later copy.
        pos = bisect.bisect_right(stamps, version.commit_ts)
        if pos and stamps[pos - 1] == version.commit_ts and versions[pos - 1].info == version.info:
            return  # the same definition again (a DDL read twice): nothing new
        stamps.insert(pos, version.commit_ts)
        versions.insert(pos, version)

    # -- lookups
    def table(self, table_id: int, commit_ts: int | None = None) -> binlog_pb2.TableInfo:
        """The definition of ``table_id`` a transaction committed at ``commit_ts`` used
        (the newest when ``commit_ts`` is None). Raises UnknownTableError naming the
        table when there is none, it was dropped, or TRUNCATE retired the id."""
        if isinstance(table_id, bool) or not isinstance(table_id, int):
            raise TypeError(f"table_id must be an integer, got {type(table_id).__name__}")
        at = tso.MAX_TS if commit_ts is None else _check_ts("commit_ts", commit_ts)
        stamps = self._ts.get(table_id)
        when = "" if commit_ts is None else f" at commit_ts {tso.format_ts(commit_ts)}"
        if not stamps:
            raise UnknownTableError(
                f"table id {table_id}{when} has no definition in the schema history "
                "(its CREATE TABLE is in no DDL the history holds)", table_id, at)
        # Definitions whose DDL committed strictly before ``at`` (a DDL is alone in its transaction).
        pos = bisect.bisect_left(stamps, at) if commit_ts is not None else len(stamps)
        if pos == 0:
            first = self._versions[table_id][0]
            raise UnknownTableError(
                f"table id {table_id}{when} has no definition yet: its first DDL in the history "
                f"committed later, at {tso.format_ts(first.commit_ts)}", table_id, at)
        version = self._versions[table_id][pos - 1]
        if version.info is None:
            raise UnknownTableError(
                f"table id {table_id}{when} no longer exists: {version.why} at {tso.format_ts(version.commit_ts)}",
                table_id, at)
        if version.info.dropped:
            raise UnknownTableError(
                f"table id {table_id} ({version.info.db}.{version.info.name}){when} was dropped at "
                f"{tso.format_ts(version.commit_ts)}", table_id, at)
        return version.info

    def knows(self, table_id: int, commit_ts: int | None = None) -> bool:
        try:
            self.table(table_id, commit_ts)
        except UnknownTableError:
            return False
        return True

    def table_ids(self) -> list[int]:
        return sorted(self._versions)

    def entries(self) -> Iterator[tuple[int, binlog_pb2.TableInfo]]:
        """Every (commit_ts, definition) added, in commit_ts order per table id."""
        for table_id in sorted(self._versions):
            for v in self._versions[table_id]:
                if v.info is not None and v.info.table_id == table_id:
                    yield v.commit_ts, v.info

    def snapshot(self, at_ts: int) -> SchemaHistory:
        """A smaller history that answers every lookup at ``commit_ts >= at_ts`` the
        same: per table, the definition in force at ``at_ts`` plus everything later."""
        _check_ts("at_ts", at_ts)
        out = SchemaHistory()
        for table_id in self._versions:
            stamps, versions = self._ts[table_id], self._versions[table_id]
            pos = bisect.bisect_left(stamps, at_ts)
            keep = versions[max(0, pos - 1):]
            out._versions[table_id] = list(keep)
            out._ts[table_id] = [v.commit_ts for v in keep]
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._versions.values())

    # -- transport (the data source receives the history as an option string)
    def to_json(self) -> str:
        """Text form: a JSON list of ``[commit_ts, base64(TableInfo)]``."""
        return json.dumps([[ts, base64.b64encode(info.SerializeToString()).decode()] for ts, info in self.entries()],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SchemaHistory:
        if not isinstance(text, str):
            raise TypeError(f"schema history text must be a str, got {type(text).__name__}")
        try:
            items = json.loads(text) if text.strip() else []
            pairs = [(int(ts), base64.b64decode(raw, validate=True)) for ts, raw in items]
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(
                f"schema history is not a JSON list of [commit_ts, base64 TableInfo]: {exc}") from None
        history = cls()
        for ts, raw in pairs:
            history.add(ts, _parse_table(raw, f"schema history entry at {ts}"))
        return history


def _parse_table(raw: bytes, what: str) -> binlog_pb2.TableInfo:
    try:
        info: binlog_pb2.TableInfo = binlog_pb2.TableInfo.FromString(raw)
    except DecodeError as exc:
        raise CorruptBinlogError(f"{what}: not a serialized TableInfo: {exc}") from None
    return info


# ---------------------------------------------------------------- image JSON
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
    if tag == 0x32 or tag == 0x2A:  # string_value / decimal_value
        n = b[1]
        if n < 0x80:
            if n + 2 == len(b):
                return _quote(b[2:].decode())
        else:
            n, i = _varint(b, 1)
            if n + i == len(b):
                return _quote(b[i:].decode())
        return _slow_json(b, col_type)
    if tag == 0x10:  # int_value (zigzag)
        v, i = _varint(b, 1)
        if i != len(b):
            return _slow_json(b, col_type)
        v = (v >> 1) ^ -(v & 1)
        if col_type == binlog_pb2.BOOL:
            return "true" if v else "false"
        return str(v)
    if tag == 0x08:  # is_null
        return "null"
    if tag == 0x48:  # datetime_micros (zigzag)
        v, i = _varint(b, 1)
        if i != len(b):
            return _slow_json(b, col_type)
        return '"' + (_EPOCH + _TD(microseconds=(v >> 1) ^ -(v & 1))).isoformat(timespec="microseconds") + '"'
    if tag == 0x5A:  # json_value: already canonical JSON text
        n = b[1]
        if n < 0x80:
            if n + 2 == len(b):
                return b[2:].decode()
        else:
            n, i = _varint(b, 1)
            if n + i == len(b):
                return b[i:].decode()
    return _slow_json(b, col_type)


class _TablePlan:
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
        if native and _imagec is not None and len({c[0] for c in self.cols}) == len(self.cols):
            try:
                self.native = _imagec.Plan(self.cols, self.key_idx)
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


# ---------------------------------------------------------------- transactions -> rows
def parse_prewrite(txn: binlog_pb2.Binlog) -> binlog_pb2.PrewriteValue:
    try:
        value: binlog_pb2.PrewriteValue = binlog_pb2.PrewriteValue.FromString(txn.prewrite_value)
    except DecodeError as exc:
        raise CorruptBinlogError(
            f"transaction start_ts {txn.start_ts} (commit_ts {txn.commit_ts}): prewrite_value is not a "
            f"PrewriteValue: {exc}") from None
    return value


def _check_txn(txn: Any) -> None:
    if not isinstance(txn, binlog_pb2.Binlog):
        raise TypeError(f"expected a Binlog (a complete transaction), got {type(txn).__name__}")
    if txn.tp != binlog_pb2.COMMIT or txn.commit_ts <= txn.start_ts:
        raise ValueError(
            f"transaction start_ts {txn.start_ts} is not a complete transaction "
            f"(type {binlog_pb2.BinlogType.Name(txn.tp)}, commit_ts {txn.commit_ts})")


# Change-row columns as ChangeDecoder keeps them. Numbers are array.array (machine
# integers: extending one by a repeated packed value is one C call per mutation,
# and Arrow wraps the memory as is instead of converting Python ints one by one).
# Images (and op) are lists of str in the Python path; natively they are
# StringColumn, Arrow's string layout built by the C decoder.
_ARRAY_CODES = {"long": "q", "int": "i", "date": "i"}
_PACK = {"q": struct.Struct("=q"), "i": struct.Struct("=i")}
_OFFSETS = struct.Struct("=2i")  # a value's start and end in a StringColumn
IMAGE_COLUMNS = ("op", "keys", "before", "after")  # the order of _imagec.Columns.take()
assert array.array("q").itemsize == 8 and array.array("i").itemsize == 4


def _new_columns() -> dict[str, Any]:
    return {name: array.array(_ARRAY_CODES[kind]) if kind in _ARRAY_CODES else []
            for name, kind in CHANGE_COLUMNS}


class StringColumn:
    """A column of str or None in Arrow's string layout: ``offsets`` (int32 per row +
    1, native byte order), ``data`` (the UTF-8 text back to back), ``validity`` (a
    bitmap, bit set = not null; None when there is no null). What the native decoder
    hands over instead of a list, so the text never becomes Python objects on its
    way to Arrow (``binlake.lake.source.changes_batch`` wraps the buffers). Reads
    like a list (``len``, iteration, indexing, ``==`` with a list) for everything else."""

    __slots__ = ("length", "offsets", "data", "validity", "null_count")

    def __init__(self, length: int, offsets: bytes, data: bytes, validity: bytes | None, null_count: int) -> None:
        self.length = length
        self.offsets = offsets
        self.data = data
        self.validity = validity
        self.null_count = null_count

    def __len__(self) -> int:
        return self.length

    def to_list(self) -> list[str | None]:
        offs = array.array("i", self.offsets)
        valid = self.validity
        data = self.data
        return [data[offs[i]:offs[i + 1]].decode() if valid is None or valid[i >> 3] >> (i & 7) & 1 else None
                for i in range(self.length)]

    def __iter__(self) -> Iterator[str | None]:
        return iter(self.to_list())

    def __getitem__(self, index: int) -> str | None:
        i = range(self.length)[index]  # a list's IndexError and negative indices
        if self.validity is not None and not self.validity[i >> 3] >> (i & 7) & 1:
            return None
        start, end = _OFFSETS.unpack_from(self.offsets, 4 * i)
        return self.data[start:end].decode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringColumn):
            return self.to_list() == other.to_list()
        if isinstance(other, list):
            return self.to_list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringColumn({self.to_list()!r})"


class ChangeDecoder:
    """Decodes complete transactions into change-row columns (Arrow-ready).

    Keeps one decoding plan per table definition, so a window of many
    transactions over few tables pays the per-definition work once.
    ``take()`` hands over the columns: numbers as ``array.array``, strings as
    lists, except op / keys / before / after on the native path, which are
    ``StringColumn`` (the C decoder writes the images straight into Arrow's
    layout; rows it hands back to Python are appended in their place).
    """

    def __init__(self, history: SchemaHistory, pump: str = "", native: bool | None = None) -> None:
        """``native``: decode rows with the C extension (None: ``native_enabled()``;
        True without the extension built is an error)."""
        if not isinstance(history, SchemaHistory):
            raise TypeError(f"history must be a SchemaHistory, got {type(history).__name__}")
        if not isinstance(pump, str):
            raise TypeError(f"pump must be a str, got {type(pump).__name__}")
        if native and _imagec is None:
            raise errors.FailedPrecondition(
                "the native decoder binlake.lake._imagec is not built (reinstall with a C compiler: make setup)")
        self.history = history
        self.pump = pump
        self.native = native_enabled() if native is None else bool(native)
        self._plans: dict[int, _TablePlan] = {}  # keyed by id() of the TableInfo the history holds
        self.columns: dict[str, Any] = _new_columns()
        # Natively, op/keys/before/after accumulate in C buffers (these list entries stay empty).
        self._images: Any = _imagec.Columns() if self.native else None
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def take(self) -> dict[str, Any]:
        """The rows decoded so far (column name -> column), and start anew."""
        out = self.columns
        if self._images is not None:
            rows, images = self._images.take()
            for name, (offsets, data, validity, nulls) in zip(IMAGE_COLUMNS, images, strict=True):
                out[name] = StringColumn(rows, offsets, data, validity, nulls)
        self.columns = _new_columns()
        self._rows = 0
        return out

    def _plan(self, table_id: int, commit_ts: int) -> _TablePlan:
        info = self.history.table(table_id, commit_ts)
        plan = self._plans.get(id(info))
        if plan is None or plan.info is not info:
            plan = _TablePlan(info, self.native)
            self._plans[id(info)] = plan
        return plan

    def add(self, txn: binlog_pb2.Binlog) -> int:
        """Decode one complete transaction's row changes; return how many."""
        _check_txn(txn)
        value = parse_prewrite(txn)
        cols = self.columns
        images = self._images
        commit_ts, start_ts = txn.commit_ts, txn.start_ts
        q, i = _PACK["q"].pack, _PACK["i"].pack
        commit_ts_b, start_ts_b, day_b = q(commit_ts), q(start_ts), i(commit_date_days(commit_ts))
        seq = 0
        for m in value.mutations:
            plan = self._plan(m.table_id, commit_ts)
            n_ins, n_upd, n_del = len(m.inserted_rows), len(m.updated_rows), len(m.deleted_rows)
            if len(m.sequence) != n_ins + n_upd + n_del:
                raise CorruptBinlogError(
                    f"transaction start_ts {start_ts}, table id {m.table_id}: sequence lists {len(m.sequence)} "
                    f"changes but the mutation holds {n_ins + n_upd + n_del}")
            try:
                if images is not None:
                    n = plan.mutation_into(images, m.sequence, m.inserted_rows, m.updated_rows, m.deleted_rows)
                else:
                    ops, keys, befores, afters = plan.mutation_py(m.sequence, m.inserted_rows, m.updated_rows,
                                                               m.deleted_rows)
                    n = len(ops)
            except (DecodeError, UnicodeDecodeError, OverflowError, IndexError, CorruptBinlogError) as exc:
                # (bytes that are not a Row, text that is not UTF-8, a datetime beyond year 9999)
                raise CorruptBinlogError(
                    f"transaction start_ts {start_ts}, table id {m.table_id}: a row does not decode: {exc}"
                ) from None
            if images is None:
                cols["op"].extend(ops)
                cols["keys"].extend(keys)
                cols["before"].extend(befores)
                cols["after"].extend(afters)
            # The per-transaction / per-table values: one packed value repeated n times.
            cols["commit_ts"].frombytes(commit_ts_b * n)
            cols["start_ts"].frombytes(start_ts_b * n)
            cols["seq"].extend(range(seq, seq + n))
            cols["commit_date"].frombytes(day_b * n)
            cols["db"].extend([plan.db] * n)
            cols["tbl"].extend([plan.tbl] * n)
            cols["table_id"].frombytes(q(m.table_id) * n)
            cols["schema_version"].frombytes(q(plan.version) * n)
            cols["pump"].extend([self.pump] * n)
            seq += n
            self._rows += n
        return seq


def change_rows(txn: binlog_pb2.Binlog, history: SchemaHistory, pump: str = "") -> list[dict[str, Any]]:
    """One complete transaction's row changes as dicts (``CHANGE_COLUMNS``;
    ``commit_date`` as a ``datetime.date``), with the definitions in force at its commit_ts."""
    decoder = ChangeDecoder(history, pump)
    decoder.add(txn)
    cols = decoder.take()
    cols["commit_date"] = [_EPOCH_DATE + dt.timedelta(days=d) for d in cols["commit_date"]]
    names = [name for name, _ in CHANGE_COLUMNS]
    columns = [list(cols[n]) for n in names]  # plain Python values (ints, str, None)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def is_ddl(txn: binlog_pb2.Binlog) -> bool:
    return bool(txn.ddl_query)


def ddl_row(txn: binlog_pb2.Binlog) -> dict[str, Any]:
    """The ``ddl_history`` row of a DDL transaction (``DDL_COLUMNS``)."""
    _check_txn(txn)
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
        _check_txn(txn)
        if txn.commit_ts < last:
            raise ValueError(f"transactions out of commit_ts order: {txn.commit_ts} after {last}")
        last = txn.commit_ts
        if is_ddl(txn):
            history.apply(txn)
            ddls.append(ddl_row(txn))
        changes.extend(change_rows(txn, history, pump))
    return changes, ddls

