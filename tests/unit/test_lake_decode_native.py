"""The native image decoder (``binlake.lake.decoding._imagec``) against the pure-Python
path it accelerates: the extension is built here, its output is byte-for-byte the
Python path's for every kind of datum and edge value, rows it does not decode
exactly go back to Python (results and errors identical), and the
``BINLAKE_NATIVE_DECODE`` switch works.

The comparisons run both paths on the same bytes and compare their results, so
nothing here hard-codes an expected image: a difference in either path fails."""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from binlake import codec, errors, tso
from binlake.lake.decoding import image as lake_image
from binlake.lake.decoding import native as lake_native
from binlake.lake.decoding.arrow_batches import changes_batch
from binlake.lake.decoding.change_decoder import ChangeDecoder
from binlake.lake.decoding.native import (
    NATIVE_DECODE_ENV,
    StringColumn,
    native_available,
    native_enabled,
    native_import_error,
)
from binlake.lake.decoding.rows import CHANGE_COLUMNS
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.lake.decoding.txn import CorruptBinlogError
from binlake.lake.pumps import datasource as source
from binlake.proto import binlog_pb2

TS = tso.compose(1_795_000_000_000)  # 2026-11-18
INT_MIN, INT_MAX, UINT_MAX = codec.INT_MIN, codec.INT_MAX, codec.UINT_MAX
DAY_US = 86_400_000_000
# Microseconds since the epoch of datetime(1, 1, 1) and of the last microsecond of year 9999.
DT_MIN_US, DT_MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999
COLUMN_TYPES = [binlog_pb2.ColumnType.Value(n) for n in binlog_pb2.ColumnType.keys()]

needs_native = pytest.mark.skipif(not native_available(), reason="binlake.lake.decoding._imagec is not built "
                                  "(test_the_extension_is_built says how to build it)")


# ---------------------------------------------------------------- the build
def test_the_extension_is_built() -> None:
    """CI runs on a fresh machine: a build that silently failed (setup.py marks the
    extension optional) must fail here, not just make decoding slower."""
    assert native_available(), (
        "the C extension binlake.lake.decoding._imagec did not import "
        f"({native_import_error()}). Build it with `make setup` (or `.venv/bin/pip install --no-deps -e .`) "
        "on a machine with a C compiler (gcc) and the Python headers; pip prints the compiler error "
        "(it is optional, so the install itself succeeds without it).")


@needs_native
def test_the_switch_and_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    info = _table([(1, "id", binlog_pb2.INT)], [1])
    history = SchemaHistory.from_tables([info])
    monkeypatch.delenv(NATIVE_DECODE_ENV, raising=False)
    decoder = ChangeDecoder(history)
    assert decoder.native and decoder._plan(100, TS).native is not None
    monkeypatch.setenv(NATIVE_DECODE_ENV, "0")
    assert not native_enabled()
    decoder = ChangeDecoder(history)
    assert not decoder.native and decoder._plan(100, TS).native is None
    assert ChangeDecoder(history, native=True).native  # an explicit choice wins
    monkeypatch.setattr(lake_native, "_imagec", None)  # as on a machine where it was not built
    assert not native_enabled() and not ChangeDecoder(history).native
    with pytest.raises(errors.FailedPrecondition, match="not built"):
        ChangeDecoder(history, native=True)


# ---------------------------------------------------------------- helpers
def _table(cols: list[tuple[int, str, int]], pk: list[int]) -> binlog_pb2.TableInfo:
    return binlog_pb2.TableInfo(
        table_id=100, db="app", name="t", schema_version=1, primary_key=pk,
        columns=[binlog_pb2.ColumnInfo(id=cid, name=name, type=t, nullable=True) for cid, name, t in cols])


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _ld(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _raw_row(entries: list[tuple[int, bytes | None]]) -> bytes:
    """A serialized Row from (column id, raw datum bytes) entries, any bytes allowed."""
    out = b""
    for cid, raw in entries:
        entry = b"\x08" + _varint(cid) + (b"" if raw is None else _ld(0x12, raw))
        out += _ld(0x0A, entry)
    return out


def _outcome(fn: Any, data: bytes) -> tuple[Any, ...]:
    try:
        return ("ok", fn(data))
    except Exception as exc:  # the point is comparing whatever is raised
        return ("error", type(exc), str(exc))


def _assert_canonical(text: str) -> None:
    """A str the extension built must be an ordinary str: the narrowest kind for its
    characters (CPython compares and hashes assuming so) and valid text."""
    again = text.encode("utf-8").decode("utf-8")
    assert again == text
    assert sys.getsizeof(again) == sys.getsizeof(text)
    assert text.isascii() == all(ord(c) < 128 for c in text)


def _check_row(plan: Any, data: bytes, update: bool = False) -> Any:
    """The native answer for one row is either None (Python decodes it) or exactly
    Python's result; never an answer where Python raises."""
    py = _outcome(plan.update_images if update else plan.images, data)
    native = (plan.native.update_images if update else plan.native.images)(data)
    if native is not None:
        assert py == ("ok", native), f"native {native!r} != python {py!r} for {data!r}"
        for text in native:
            _assert_canonical(text)
    return native


def _txn(mutation: binlog_pb2.TableMutation) -> binlog_pb2.Binlog:
    value = binlog_pb2.PrewriteValue(schema_version=1, mutations=[mutation])
    return binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=7, commit_ts=TS, prewrite_value=value.SerializeToString())


def _decode_both(txn: binlog_pb2.Binlog, history: SchemaHistory) -> tuple[Any, ...]:
    """ChangeDecoder.add in Python and natively: the same rows, or the same error;
    and the same Arrow batch (the native path builds it from C buffers, the
    Python path from lists of str)."""
    out = []
    batches = []
    for native in (False, True):
        decoder = ChangeDecoder(history, "pump1", native=native)
        try:
            decoder.add(txn)
            out.append(("ok", decoder.take()))
        except Exception as exc:  # whatever it is, both paths must raise it
            out.append(("error", type(exc), str(exc)))
        # After an error: what it left behind (earlier mutations' rows), in step on both paths.
        batches.append(changes_batch(out[-1][1] if out[-1][0] == "ok" else decoder.take()))
    assert out[0] == out[1]
    _assert_same_batch(batches[0], batches[1])
    return out[1]


def _assert_same_batch(py: Any, native: Any) -> None:
    """Arrow batches equal in schema, values and nulls (and each valid on its own)."""
    native.validate(full=True)
    py.validate(full=True)
    assert py.schema == native.schema
    assert native.equals(py), f"native batch {native.to_pylist()!r} != python batch {py.to_pylist()!r}"


# ---------------------------------------------------------------- strategies
I64_EDGES = [INT_MIN, INT_MIN + 1, -(2**32), -(2**31) - 1, -65, -64, -1, 0, 1, 63, 64, 2**31, 2**32, INT_MAX - 1,
             INT_MAX]
I64 = st.integers(INT_MIN, INT_MAX) | st.sampled_from(I64_EDGES)
U64 = st.integers(0, UINT_MAX) | st.sampled_from([0, 1, 127, 128, 2**63 - 1, 2**63, UINT_MAX - 1, UINT_MAX])
# Text of every kind: the escapes, DEL, the 1/2/3/4-byte UTF-8 boundaries, separators.
SPECIAL = "\x00\x01\x08\t\n\x0b\x0c\r\x1f \"\\/\x7f\x80\xa0\xe9\xff\u0100\u07ff\u0800\u2028\u2029\ufeff\uffff" \
          "\U00010000\U0001f642\U0010ffff漢"
# Mostly plain ASCII with the odd character to escape: exercises the native
# quoting's eight-bytes-at-a-time path on either side of an escape.
MOSTLY_PLAIN = st.text(alphabet=st.sampled_from("abcdefghijklmnop \"\\\x01\x1f\x7fé漢"), min_size=8, max_size=80)
TEXT = (st.text(max_size=40) | st.text(alphabet=SPECIAL, max_size=40) | MOSTLY_PLAIN
        | st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=20)
        | st.text(min_size=130, max_size=300) | st.sampled_from(["", "x" * 20000, "é" * 70, "\u0100"]))
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 0.1, 1.0, -1.5, 1e15, 1e16, 1e-4, 1e-5, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
     123456789012345678.0, 1 / 3])
DATETIME_US = (st.integers(DT_MIN_US, DT_MAX_US)
               | st.sampled_from([DT_MIN_US, DT_MAX_US, -1, 0, 1, DAY_US - 1, -DAY_US, -DAY_US - 1]))
DATE_US = (st.integers(DT_MIN_US // DAY_US, DT_MAX_US // DAY_US).map(lambda d: d * DAY_US)
           | st.integers(DT_MIN_US, DT_MAX_US) | st.sampled_from([DT_MIN_US, DT_MAX_US, -1, 0, -DAY_US]))
TIME_US = st.integers(0, DAY_US - 1) | I64 | st.sampled_from([-1, DAY_US, -3_600_000_000, -36_000_000_001])
JSON_TEXT = st.sampled_from(['{"a":[1,2]}', "null", "[]", '"é\\n"', "1.5", "", '{"k":"漢"}']) | TEXT


def _datum(**kw: Any) -> binlog_pb2.Datum:
    return binlog_pb2.Datum(**kw)


# Datums any column may hold (the decoder reads the kind, not the column type, but BOOL).
VALID_DATUMS = st.one_of(
    st.just(binlog_pb2.Datum()), st.booleans().map(lambda b: _datum(is_null=b)),
    I64.map(lambda v: _datum(int_value=v)), U64.map(lambda v: _datum(uint_value=v)),
    FLOATS.map(lambda v: _datum(float_value=v)), TEXT.map(lambda v: _datum(decimal_value=v)),
    TEXT.map(lambda v: _datum(string_value=v)), st.binary(max_size=70).map(lambda v: _datum(bytes_value=v)),
    DATE_US.map(lambda v: _datum(date_micros=v)), DATETIME_US.map(lambda v: _datum(datetime_micros=v)),
    TIME_US.map(lambda v: _datum(time_micros=v)), JSON_TEXT.map(lambda v: _datum(json_value=v)),
)
# Datums Python refuses (NaN, infinities, dates beyond years 1..9999).
BAD_DATUMS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda v: _datum(float_value=v)),
    st.sampled_from([DT_MIN_US - 1, DT_MAX_US + 1, INT_MIN, INT_MAX]).map(lambda v: _datum(datetime_micros=v)),
    st.sampled_from([DT_MIN_US - 1, DT_MAX_US + 1, INT_MIN, INT_MAX]).map(lambda v: _datum(date_micros=v)),
)
CIDS = st.integers(1, 40) | st.integers(-5, 10_000) | st.sampled_from([0, INT_MIN, INT_MAX, 4095, 4096])
NAMES = st.text(min_size=1, max_size=6) | st.text(alphabet=SPECIAL, min_size=1, max_size=4)


@st.composite
def tables(draw: st.DrawFn) -> binlog_pb2.TableInfo:
    cids = draw(st.lists(CIDS, min_size=1, max_size=8, unique=True))
    cols = [(cid, draw(NAMES), draw(st.sampled_from(COLUMN_TYPES))) for cid in cids]
    pk = draw(st.lists(st.sampled_from(cids), unique=True, max_size=3))
    return _table(cols, pk)


@st.composite
def rows(draw: st.DrawFn, info: binlog_pb2.TableInfo, datums: st.SearchStrategy[binlog_pb2.Datum],
         base: list[tuple[int, bytes | None]] | None = None) -> list[tuple[int, bytes | None]]:
    """Row entries: each column present (any datum), absent, or (rarely) twice;
    columns the table does not have; given ``base``, some of its entries kept as they
    are (an update changing a few columns)."""
    entries: list[tuple[int, bytes | None]] = []
    for c in info.columns:
        if base is not None and draw(st.booleans()):
            entries.extend(e for e in base if e[0] == c.id)
            continue
        if draw(st.integers(0, 5)) == 0:
            continue  # absent: null
        raw = draw(datums).SerializeToString()
        if draw(st.integers(0, 15)) == 0:
            entries.append((c.id, draw(datums).SerializeToString()))  # a duplicate: the last one wins
        entries.append((c.id, None if draw(st.integers(0, 20)) == 0 else raw))  # None: no value field
    known = {c.id for c in info.columns}
    for cid in draw(st.lists(CIDS, max_size=2)):
        if cid not in known:
            entries.append((cid, draw(datums).SerializeToString()))
    return draw(st.permutations(entries))


@st.composite
def mutations(draw: st.DrawFn, bad: bool = False) -> tuple[binlog_pb2.TableInfo, binlog_pb2.TableMutation]:
    info = draw(tables())
    datums = st.one_of(VALID_DATUMS, BAD_DATUMS) if bad else VALID_DATUMS
    m = binlog_pb2.TableMutation(table_id=info.table_id)
    for op in draw(st.lists(st.sampled_from(["insert", "update", "delete"]), min_size=1, max_size=6)):
        row = draw(rows(info, datums))
        if op == "update":
            new = draw(rows(info, datums, base=row))
            parts = ([] if draw(st.integers(0, 10)) == 0 else [_ld(0x0A, _raw_row(row))]) + \
                    ([] if draw(st.integers(0, 10)) == 0 else [_ld(0x12, _raw_row(new))])
            m.updated_rows.append(b"".join(draw(st.permutations(parts))))
            m.sequence.append(binlog_pb2.UPDATE)
        elif op == "insert":
            m.inserted_rows.append(_raw_row(row))
            m.sequence.append(binlog_pb2.INSERT)
        else:
            m.deleted_rows.append(_raw_row(row))
            m.sequence.append(binlog_pb2.DELETE_ROW)
    return info, m


# ---------------------------------------------------------------- equivalence
@needs_native
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_native_equals_python_on_generated_tables(case: tuple[binlog_pb2.TableInfo, binlog_pb2.TableMutation]) -> None:
    """Every column type, NULLs and missing columns, unicode and control characters,
    64-bit edges, dates from year 1 to 9999, updates (changed and unchanged columns)
    and deletes: identical change rows, row by row and through ChangeDecoder."""
    info, m = case
    plan = lake_image.TablePlan(info, native=True)
    assert plan.native is not None
    # Valid values in the codec's encoding (whatever the order of entries, duplicates,
    # extra or missing columns): all decoded natively, none handed to Python.
    for data in [*m.inserted_rows, *m.deleted_rows]:
        assert _check_row(plan, data) is not None, "a row of valid values went to the Python path"
    for data in m.updated_rows:
        assert _check_row(plan, data, update=True) is not None, "an update of valid values went to the Python path"
    result = _decode_both(_txn(m), SchemaHistory.from_tables([info]))
    assert result[0] == "ok"


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations(bad=True))
def test_refused_values_give_the_same_error(case: tuple[binlog_pb2.TableInfo, binlog_pb2.TableMutation]) -> None:
    """NaN, infinities and dates beyond year 9999 among valid values: the native path
    hands those rows to Python, so the change rows or the CorruptBinlogError are the same."""
    info, m = case
    plan = lake_image.TablePlan(info, native=True)
    for data in [*m.inserted_rows, *m.deleted_rows]:
        _check_row(plan, data)
    for data in m.updated_rows:
        _check_row(plan, data, update=True)
    _decode_both(_txn(m), SchemaHistory.from_tables([info]))


VALUES = {
    "int": st.integers(INT_MIN, INT_MAX), "uint": st.integers(0, UINT_MAX), "bool": st.booleans(),
    "float": FLOATS, "decimal": st.decimals(allow_nan=False, allow_infinity=False, places=None),
    "string": TEXT, "bytes": st.binary(max_size=100), "date": st.dates(), "datetime": st.datetimes(),
    "time": st.times(),
    "json": st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(alphabet=SPECIAL),
                         lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids,
                                                                                    max_size=3), max_leaves=8,
                         ).filter(lambda v: not isinstance(v, str)),  # a top-level str is JSON *text* to the codec
}


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_rows_the_codec_writes_are_decoded_natively(data: st.DataObject) -> None:
    """What the codec writes (every type, any value it accepts) never needs the
    Python path: the native answer is there, and it is Python's."""
    types = data.draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=6))
    info = _table([(1, "id", binlog_pb2.INT)] + [(10 + i, f"c{i}_{t}", codec.type_code(t))
                                                   for i, t in enumerate(types)], [1])
    values = {"id": data.draw(VALUES["int"])}
    for i, t in enumerate(types):
        values[f"c{i}_{t}"] = data.draw(st.none() | VALUES[t])
    row = codec.encode_row(values, info)
    plan = lake_image.TablePlan(info, native=True)
    assert _check_row(plan, row) is not None
    changed = dict(values, **{f"c0_{types[0]}": data.draw(st.none() | VALUES[types[0]])})
    assert _check_row(plan, codec.encode_update(values, changed, info), update=True) is not None


# One-column cases named outright, so each edge is checked on every run (not only
# when hypothesis happens to draw it). (column type, datum, natively decoded?)
EDGE_CASES: list[tuple[int, binlog_pb2.Datum, bool]] = [
    *[(binlog_pb2.INT, _datum(int_value=v), True) for v in I64_EDGES],
    *[(binlog_pb2.BOOL, _datum(int_value=v), True) for v in (0, 1, 2, -1, INT_MIN)],
    *[(binlog_pb2.UINT, _datum(uint_value=v), True) for v in (0, 1, 2**63, UINT_MAX)],
    *[(binlog_pb2.FLOAT, _datum(float_value=v), True) for v in
      (0.0, -0.0, 0.1, 1.0, 1e16, 1e-5, 5e-324, 1.7976931348623157e308, -2.5e-310, 9007199254740993.0)],
    *[(binlog_pb2.FLOAT, _datum(float_value=v), False) for v in (math.nan, math.inf, -math.inf)],
    *[(binlog_pb2.STRING, _datum(string_value=chr(c)), True) for c in range(0x20)],
    *[(binlog_pb2.STRING, _datum(string_value=s), True) for s in
      ("", '"', "\\", "\x7f", "\x80", "\xff", "\u0100", "\u07ff", "\u0800", "\uffff", "\U00010000", "\U0010ffff",
       "é" * 9, "a" * 8 + "é" + "漢" * 3 + "🙂", "x" * 20000, "\u2028\u2029", 'a "q"\\ \n\t\x01 é漢🙂',
       'abcdefg"hijklmnop', "abcdefgh\\ijklmnop", "abcdefghijk\x00mnop", "abcdefghijkl\x1fnop", "0123456\x7f89abcdef")],
    (binlog_pb2.DECIMAL, _datum(decimal_value="-12.50E+3"), True),
    *[(binlog_pb2.BYTES, _datum(bytes_value=b), True) for b in (b"", b"\x00", b"\x00\x01", b"\xff\xfe\xfd", bytes(range(256)))],
    *[(binlog_pb2.DATE, _datum(date_micros=v), True) for v in
      (0, -1, DT_MIN_US, DT_MAX_US, -DAY_US, 20_000 * DAY_US + 5)],
    *[(binlog_pb2.DATE, _datum(date_micros=v), False) for v in (DT_MIN_US - 1, DT_MAX_US + 1, INT_MIN, INT_MAX)],
    *[(binlog_pb2.DATETIME, _datum(datetime_micros=v), True) for v in
      (0, -1, 1, DT_MIN_US, DT_MAX_US, -DAY_US - 1, 1_795_000_000_000_000)],
    *[(binlog_pb2.DATETIME, _datum(datetime_micros=v), False) for v in (DT_MIN_US - 1, DT_MAX_US + 1, INT_MIN, INT_MAX)],
    *[(binlog_pb2.TIME, _datum(time_micros=v), True) for v in
      (0, 1, DAY_US - 1, DAY_US, -1, -3_600_000_000, -36_000_000_001, INT_MIN, INT_MAX)],
    *[(binlog_pb2.JSON, _datum(json_value=s), True) for s in ('{"a":[1,2]}', "", "null", '"é"')],
    *[(t, _datum(is_null=True), True) for t in (binlog_pb2.INT, binlog_pb2.JSON)],
    (binlog_pb2.STRING, _datum(), True),
]


@needs_native
@pytest.mark.parametrize(("col_type", "datum", "natively"), EDGE_CASES)
def test_edge_values(col_type: int, datum: binlog_pb2.Datum, natively: bool) -> None:
    plan = lake_image.TablePlan(_table([(3, "v", col_type), (1, "id", binlog_pb2.INT)], [1]), native=True)
    row = _raw_row([(1, _datum(int_value=5).SerializeToString()), (3, datum.SerializeToString())])
    native = _check_row(plan, row)
    assert (native is not None) == natively
    if not natively:  # Python refuses these: so does ChangeDecoder, the same way
        m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[row], sequence=[binlog_pb2.INSERT])
        assert _decode_both(_txn(m), SchemaHistory.from_tables([plan.info]))[1] is CorruptBinlogError


# ---------------------------------------------------------------- garbled bytes
# Datum bytes no codec writes; each one goes to Python or gives Python's answer.
UNUSUAL_DATUMS = [
    b"\x10\x80\x00",  # a non-minimal int varint (the Python fast path reads it)
    b"\x10" + b"\xff" * 10 + b"\x01",  # an 11-byte varint: Python reads a number beyond 64 bits
    b"\x10" + b"\xff" * 9 + b"\x01",  # 10 bytes, all 64 bits
    b"\x10" + b"\xff" * 9 + b"\x7f",  # 10 bytes, beyond 64 bits
    b"\x48" + b"\x80" * 9 + b"\x02",  # a datetime beyond 64 bits
    b"\x10\x80",  # truncated
    b"\x10",
    b"\x18\x81\x00", b"\x40\x80\x00", b"\x50\x80\x00",  # non-minimal on the protobuf-parsed kinds
    b"\x08\xff\xff\xff",  # is_null then garbage: the Python fast path says null
    b"\x32\x05ab",  # a string shorter than its length
    b"\x32", b"\x5a", b"\x2a\x01",
    b"\x32\x02\xc0\x80", b"\x32\x03\xed\xa0\x80", b"\x32\x04\xf4\x90\x80\x80", b"\x32\x01\x80",
    b"\x32\x02\xe6\xbc", b"\x5a\x02\xff\xfe", b"\x2a\x01\xff",  # invalid UTF-8
    b"\x32\x80\x01" + b"a" * 128, b"\x32\x81\x00a",  # a 2-byte length, a non-minimal one
    _datum(string_value="a").SerializeToString() + _datum(int_value=5).SerializeToString(),  # two fields
    _datum(int_value=5).SerializeToString() + _datum(string_value="a").SerializeToString(),
    b"\x21\x00\x00\x00\x00\x00\x00\xf8\x7f",  # a NaN by bits
    b"\x21\x00\x00",  # a short double
    b"\x3a\x02\x00", b"\x3a\x81\x00\x00",  # bytes shorter than their length, non-minimal length
    b"\x60\x01", b"\x00", b"\xff\xff",  # unknown fields, garbage
]


@needs_native
@pytest.mark.parametrize("raw", UNUSUAL_DATUMS)
@pytest.mark.parametrize("col_type", [binlog_pb2.STRING, binlog_pb2.BOOL])
def test_unusual_datum_encodings(raw: bytes, col_type: int) -> None:
    info = _table([(1, "id", binlog_pb2.INT), (2, "v", col_type)], [1])
    plan = lake_image.TablePlan(info, native=True)
    row = _raw_row([(1, b"\x10\x02"), (2, raw)])
    _check_row(plan, row)
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[row], sequence=[binlog_pb2.INSERT])
    _decode_both(_txn(m), SchemaHistory.from_tables([info]))


# Row-level encodings no codec writes.
UNUSUAL_ROWS = [
    _ld(0x0A, _ld(0x12, b"\x10\x02") + b"\x08\x01"),  # value before id: Python reads it, native hands it over
    _ld(0x0A, _ld(0x12, b"\x10\x02")),  # no id: column 0
    _ld(0x0A, b"\x08\x01" + _ld(0x12, b"\x10\x02") + _ld(0x12, b"\x10\x04")),  # value twice
    _ld(0x0A, b"\x08\x01\x18\x05"),  # an unknown field in a column
    _ld(0x0A, b"\x08\x01") + b"\x10\x01",  # an unknown field in the row
    b"\x0a\x05\xff",  # truncated
    b"\x0a",
    b"\x0a\x02\x08",
    _ld(0x0A, b"\x08" + b"\xff" * 10 + b"\x01"),  # an over-long column id
    _ld(0x0A, b"\x08\x81\x00" + _ld(0x12, b"\x10\x02")),  # a non-minimal column id
    b"",
]


@needs_native
def test_an_update_image_given_twice_is_merged() -> None:
    """Protobuf merges a repeated message field: ``old`` given twice is the union of
    both rows (the later one winning a column both hold). The native path hands such
    an update to Python."""
    info = _table([(1, "id", binlog_pb2.INT), (2, "a", binlog_pb2.INT), (3, "b", binlog_pb2.INT)], [1])
    plan = lake_image.TablePlan(info, native=True)
    one = _raw_row([(1, b"\x10\x02"), (2, b"\x10\x04")])
    two = _raw_row([(3, b"\x10\x06"), (2, b"\x10\x08")])
    for data in (_ld(0x0A, one) + _ld(0x0A, two), _ld(0x12, one) + _ld(0x12, two) + _ld(0x0A, one)):
        assert _check_row(plan, data, update=True) is None
    assert plan.update_images(_ld(0x0A, one) + _ld(0x0A, two))[0] == '{"a":4,"b":3,"id":1}'


@needs_native
@pytest.mark.parametrize("row", UNUSUAL_ROWS)
def test_unusual_row_encodings(row: bytes) -> None:
    info = _table([(1, "id", binlog_pb2.INT), (0, "zero", binlog_pb2.INT)], [1])
    plan = lake_image.TablePlan(info, native=True)
    _check_row(plan, row)
    for upd in (_ld(0x0A, row), _ld(0x12, row), _ld(0x0A, row) + _ld(0x0A, row), _ld(0x12, row) + _ld(0x0A, row),
                _ld(0x1A, row)):
        _check_row(plan, upd, update=True)
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[row], sequence=[binlog_pb2.INSERT])
    _decode_both(_txn(m), SchemaHistory.from_tables([info]))


@st.composite
def garbled(draw: st.DrawFn) -> tuple[binlog_pb2.TableInfo, bytes, bool]:
    info, m = draw(mutations())
    kinds = [(d, False) for d in [*m.inserted_rows, *m.deleted_rows]] + [(d, True) for d in m.updated_rows]
    data, update = draw(st.sampled_from(kinds))
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "random"]))
    if how == "random":
        data = draw(st.binary(max_size=60))
    elif not data:
        data = draw(st.binary(min_size=1, max_size=8))
    else:
        i = draw(st.integers(0, len(data) - 1))
        if how == "truncate":
            data = data[:i]
        elif how == "flip":
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
        elif how == "insert":
            data = data[:i] + draw(st.binary(min_size=1, max_size=3)) + data[i:]
        else:
            data = data[:i] + data[i + 1:]
    return info, data, update


@needs_native
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbled())
def test_garbled_bytes_give_the_same_result_or_error(case: tuple[binlog_pb2.TableInfo, bytes, bool]) -> None:
    """Truncated, flipped, inserted, deleted or random bytes: the native path answers
    only where Python gives the same answer, so ChangeDecoder gives the same rows or
    the same CorruptBinlogError (class and message) either way."""
    info, data, update = case
    plan = lake_image.TablePlan(info, native=True)
    _check_row(plan, data, update=update)
    m = binlog_pb2.TableMutation(table_id=100)
    if update:
        m.updated_rows.append(data)
        m.sequence.append(binlog_pb2.UPDATE)
    else:
        m.inserted_rows.append(data)
        m.sequence.append(binlog_pb2.INSERT)
    _decode_both(_txn(m), SchemaHistory.from_tables([info]))


@needs_native
def test_fallback_is_per_row_and_errors_keep_their_order() -> None:
    """A row the extension does not decode is decoded by Python in place (the rows
    around it stay native); a bad sequence gives the Python loop's own errors."""
    info = _table([(1, "id", binlog_pb2.INT), (2, "v", binlog_pb2.STRING)], [1])
    history = SchemaHistory.from_tables([info])
    good = codec.encode_row({"id": 1, "v": "é"}, info)
    odd = _ld(0x0A, _ld(0x12, b"\x10\x04") + b"\x08\x01")  # value before id: valid, not what the codec writes
    plan = lake_image.TablePlan(info, native=True)
    assert plan.native.images(odd) is None and plan.images(odd) == ('{"id":2,"v":null}', '{"id":2}')
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[good, odd, good], sequence=[binlog_pb2.INSERT] * 3)
    rows = _decode_both(_txn(m), history)[1]
    assert rows["after"] == ['{"id":1,"v":"é"}', '{"id":2,"v":null}', '{"id":1,"v":"é"}']
    # The sequence names an update the mutation does not hold: the same IndexError text.
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[good, good], sequence=[binlog_pb2.INSERT, binlog_pb2.UPDATE])
    assert _decode_both(_txn(m), history)[2].endswith("a row does not decode: list index out of range")
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[good], sequence=[7])
    assert "unknown mutation type 7" in _decode_both(_txn(m), history)[2]
    bad_first = binlog_pb2.TableMutation(table_id=100, inserted_rows=[b"\x0a\x05\xff"], sequence=[binlog_pb2.INSERT])
    bad_first.updated_rows.append(b"")  # padding so the counts agree; the unknown kind comes second
    bad_first.sequence.append(9)
    assert "does not decode" in _decode_both(_txn(bad_first), history)[2]


@needs_native
def test_a_definition_with_a_column_id_twice_is_decoded_in_python() -> None:
    info = _table([(1, "id", binlog_pb2.INT), (2, "a", binlog_pb2.STRING), (2, "b", binlog_pb2.INT)], [1])
    assert lake_image.TablePlan(info, native=True).native is None
    with pytest.raises(ValueError, match="appears twice"):
        lake_native._imagec.Plan([(2, '"a":', binlog_pb2.STRING), (2, '"b":', binlog_pb2.INT)], [])
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[_raw_row([(1, b"\x10\x02"), (2, b"\x10\x04")])],
                                 sequence=[binlog_pb2.INSERT])
    assert _decode_both(_txn(m), SchemaHistory.from_tables([info]))[1]["after"] == ['{"a":2,"b":2,"id":1}']


@needs_native
def test_a_float_is_reprs_text() -> None:
    """Floats use float.__repr__'s own formatting (shortest round trip, '.0' added)."""
    info = _table([(1, "f", binlog_pb2.FLOAT)], [])
    plan = lake_image.TablePlan(info, native=True)
    for bits in (0, 1, 0x7FEFFFFFFFFFFFFF, 0x0010000000000000, 0x3FB999999999999A, 0x8000000000000001,
                 0x4340000000000000, 0x3EE4F8B588E368F1):
        x = struct.unpack("<d", struct.pack("<Q", bits))[0]
        image, keys = plan.native.images(_raw_row([(1, _datum(float_value=x).SerializeToString())]))
        assert image == '{"f":' + repr(x) + "}" and keys == "{}"


# ---------------------------------------------------------------- Arrow batches
def _read_both(txns: list[binlog_pb2.Binlog], history: SchemaHistory, batch_rows: int,
               monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """``source.read_changes`` over ``txns`` (the Pump stream stubbed) with the Python
    path and the native one: their batches must be equal one by one."""
    monkeypatch.setattr(source, "pull_resumable", lambda *args, **kwargs: iter(txns))
    part = source.PumpWindow("pump1", "127.0.0.1:1", 0, tso.MAX_TS, [], "")
    out = []
    for switch in ("0", "1"):
        monkeypatch.setenv(NATIVE_DECODE_ENV, switch)
        out.append(list(source.read_changes(part, history, batch_rows=batch_rows)))
    py, native = out
    assert [b.num_rows for b in py] == [b.num_rows for b in native]
    for a, b in zip(py, native, strict=True):
        _assert_same_batch(a, b)
    return out


def _txn_at(i: int, *mutations: binlog_pb2.TableMutation) -> binlog_pb2.Binlog:
    value = binlog_pb2.PrewriteValue(schema_version=1, mutations=list(mutations))
    return binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=TS + 2 * i, commit_ts=TS + 2 * i + 1,
                             prewrite_value=value.SerializeToString())


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutations(), min_size=1, max_size=4), st.integers(1, 7))
def test_batches_across_transactions_and_the_batch_size(
        cases: list[tuple[binlog_pb2.TableInfo, binlog_pb2.TableMutation]], batch_rows: int) -> None:
    """Several transactions through the data source's read loop, with batch sizes
    that cut batches anywhere (a batch is handed over once it reaches the size, so
    one transaction may overrun it): the same batches on both paths, nulls
    (before of inserts, after of deletes) included."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        # One table definition per case, each under its own table id.
        infos, txns = [], []
        for i, (info, m) in enumerate(cases):
            info.table_id = m.table_id = 100 + i
            infos.append(info)
            txns.append(_txn_at(i, m))
        py, _native = _read_both(txns, SchemaHistory.from_tables(infos), batch_rows, monkeypatch)
        assert sum(b.num_rows for b in py) == sum(len(m.sequence) for _, m in cases)


@needs_native
def test_empty_batches_and_a_batch_of_nulls(monkeypatch: pytest.MonkeyPatch) -> None:
    info = _table([(1, "id", binlog_pb2.INT), (2, "v", binlog_pb2.STRING)], [1])
    history = SchemaHistory.from_tables([info])
    for native in (False, True):  # nothing decoded: an empty batch of the right schema
        batch = changes_batch(ChangeDecoder(history, native=native).take())
        assert batch.num_rows == 0 and batch.schema.names == [n for n, _ in CHANGE_COLUMNS]
    _assert_same_batch(*(changes_batch(ChangeDecoder(history, native=n).take()) for n in (False, True)))
    assert _read_both([], history, 4, monkeypatch) == [[], []]
    row = codec.encode_row({"id": 1, "v": "é"}, info)
    deletes = binlog_pb2.TableMutation(table_id=100, deleted_rows=[row] * 9, sequence=[binlog_pb2.DELETE_ROW] * 9)
    inserts = binlog_pb2.TableMutation(table_id=100, inserted_rows=[row] * 9, sequence=[binlog_pb2.INSERT] * 9)
    py, native = _read_both([_txn_at(0, deletes), _txn_at(1, inserts)], history, 9, monkeypatch)
    assert [b.column("after").null_count for b in native] == [9, 0]
    assert [b.column("before").null_count for b in native] == [0, 9]
    decoder = ChangeDecoder(history, native=True)  # a StringColumn reads like the list it stands for
    decoder.add(_txn_at(0, deletes))
    after, before = decoder.take()["after"], decoder.columns["before"]
    assert isinstance(after, StringColumn) and after == [None] * 9 and before == []
    decoder.add(_txn_at(1, inserts))
    keys = decoder.take()["keys"]
    assert keys[0] == keys[-1] == '{"id":1}' and list(keys) == ['{"id":1}'] * 9 and len(keys) == 9
    with pytest.raises(IndexError):
        keys[9]


@needs_native
def test_rows_decoded_in_python_keep_their_place_in_a_native_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows the extension hands back, and a whole table it has no plan for (a column
    id twice), are appended in place among the native rows of the same batch; an
    error drops only the failing mutation's rows, on both paths alike."""
    info = _table([(1, "id", binlog_pb2.INT), (2, "v", binlog_pb2.STRING)], [1])
    twice = binlog_pb2.TableInfo(
        table_id=200, db="app", name="twice", schema_version=1, primary_key=[1],
        columns=[binlog_pb2.ColumnInfo(id=1, name="id", type=binlog_pb2.INT),
                 binlog_pb2.ColumnInfo(id=2, name="a", type=binlog_pb2.STRING),
                 binlog_pb2.ColumnInfo(id=2, name="b", type=binlog_pb2.INT)])
    history = SchemaHistory.from_tables([info, twice])
    good = codec.encode_row({"id": 1, "v": 'é"\n'}, info)
    odd = _ld(0x0A, _ld(0x12, b"\x10\x04") + b"\x08\x01")  # valid, not the codec's encoding: decoded in Python
    nan = _raw_row([(1, b"\x10\x02"), (2, _datum(float_value=math.nan).SerializeToString())])
    upd = codec.encode_update({"id": 1, "v": "a"}, {"id": 1, "v": "b"}, info)
    odd_upd = _ld(0x12, odd) + _ld(0x0A, good)  # new before old: decoded in Python
    mixed = binlog_pb2.TableMutation(
        table_id=100, inserted_rows=[good, odd, good], updated_rows=[upd, odd_upd, upd], deleted_rows=[odd, good],
        sequence=[binlog_pb2.INSERT, binlog_pb2.UPDATE, binlog_pb2.INSERT, binlog_pb2.UPDATE, binlog_pb2.DELETE_ROW,
                  binlog_pb2.INSERT, binlog_pb2.UPDATE, binlog_pb2.DELETE_ROW])
    other = binlog_pb2.TableMutation(table_id=200, inserted_rows=[_raw_row([(1, b"\x10\x06"), (2, b"\x10\x08")])],
                                     sequence=[binlog_pb2.INSERT])
    plan = lake_image.TablePlan(info, native=True)
    assert plan.native.images(odd) is None and plan.native.update_images(odd_upd) is None
    txns = [_txn_at(0, mixed, other), _txn_at(1, other, mixed), _txn_at(2, mixed)]
    for batch_rows in (1, 4, 9, 100):
        py, native = _read_both(txns, history, batch_rows, monkeypatch)
        rows = [r for b in native for r in b.to_pylist()]
        assert [r["op"] for r in rows[:9]] == ["insert", "update", "insert", "update", "delete", "insert", "update",
                                               "delete", "insert"]
        assert [r["after"] for r in rows[:3]] == [lake_image.TablePlan(info).images(good)[0], '{"id":1,"v":"b"}',
                                                  '{"id":2,"v":null}']
        assert rows[8]["tbl"] == "twice" and rows[8]["after"] == '{"a":4,"b":4,"id":3}'
    # A mutation that fails after some native rows: none of its rows stay, on either path.
    failing = binlog_pb2.TableMutation(table_id=100, inserted_rows=[good, good, nan], sequence=[binlog_pb2.INSERT] * 3)
    left = []
    for native in (False, True):
        decoder = ChangeDecoder(history, "pump1", native=native)
        decoder.add(txns[0])
        with pytest.raises(CorruptBinlogError, match="a row does not decode"):
            decoder.add(_txn_at(5, other, failing))
        assert len(decoder) == 10  # txns[0], then the other table's row of the failing transaction
        left.append(changes_batch(decoder.take()))
    _assert_same_batch(*left)
