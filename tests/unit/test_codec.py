"""The row codec: every type and edge value round-trips; bad values are refused clearly."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binlake import codec
from binlake.proto import binlog_pb2
from binlake.sql.schema import ColumnDef, new_table

# A top-level str is read as JSON *text* (what MySQL drivers return), so top-level
# documents here are non-strings; strings appear nested.
JSON_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
JSON = JSON_ANY.filter(lambda v: not isinstance(v, str))

STRATEGIES = {
    "int": st.integers(codec.INT_MIN, codec.INT_MAX),
    "uint": st.integers(0, codec.UINT_MAX),
    "bool": st.booleans(),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "decimal": st.decimals(allow_nan=False, allow_infinity=False, places=None),
    "string": st.text(),
    "bytes": st.binary(),
    "date": st.dates(),
    "datetime": st.datetimes(),
    "time": st.times(),
    "json": JSON,
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_round_trip_property(name: str) -> None:
    code = codec.type_code(name)

    @settings(max_examples=200, deadline=None)
    @given(STRATEGIES[name])
    def check(value: object) -> None:
        back = codec.decode_value(codec.encode_value(value, code), code)
        if name == "float" and value == 0.0:
            assert math.copysign(1, back) == math.copysign(1, value)  # -0.0 keeps its sign
        if name == "json":
            assert codec.canonical_json(back) == codec.canonical_json(value)
        else:
            assert back == value and type(back) is type(value)
        if name == "decimal":
            assert str(back) == str(value)  # full precision and scale, not just equal

    check()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("int", codec.INT_MIN), ("int", codec.INT_MAX), ("int", 0), ("uint", codec.UINT_MAX), ("uint", 0),
        ("float", 5e-324), ("float", 1.7976931348623157e308), ("float", -0.0),
        ("decimal", decimal.Decimal("-12345678901234567890123456789.123456789")),
        ("decimal", decimal.Decimal("1.10")), ("decimal", decimal.Decimal("0E-10")),
        ("string", ""), ("string", "naïve 日本語 🎉"), ("string", "x" * 1_000_000), ("string", "a\x00b"),
        ("bytes", b""), ("bytes", b"\x00" * 10), ("bytes", bytes(range(256))),
        ("date", dt.date(1, 1, 1)), ("date", dt.date(9999, 12, 31)), ("date", dt.date(1969, 12, 31)),
        ("datetime", dt.datetime(1, 1, 1)), ("datetime", dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
        ("datetime", dt.datetime(1969, 12, 31, 23, 59, 59, 999999)),
        ("time", dt.time(0, 0)), ("time", dt.time(23, 59, 59, 999999)),
        ("json", {"b": [1, 2.5, None, True], "a": {"é": "x"}}), ("json", []), ("json", 0),
        ("bool", True), ("bool", False),
    ],
)
def test_edge_values(name: str, value: object) -> None:
    code = codec.type_code(name)
    back = codec.decode_value(codec.encode_value(value, code), code)
    assert back == value
    if name == "decimal":
        assert str(back) == str(value)


def test_null_in_every_type() -> None:
    for code in codec.TYPE_NAMES.values():
        datum = codec.encode_value(None, code)
        assert datum.WhichOneof("value") == "is_null"
        assert codec.decode_value(datum, code) is None


def test_aware_datetime_is_normalised_to_utc() -> None:
    code = codec.type_code("datetime")
    aware = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert codec.decode_value(codec.encode_value(aware, code), code) == dt.datetime(2026, 1, 1, 10, 0)


def test_aware_datetime_outside_the_years_in_utc_is_a_value_error() -> None:
    # 0001-01-01 00:00 at +05 is year 0 in UTC: named, not an OverflowError from datetime.
    early = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    with pytest.raises(ValueError, match=r"c \(datetime\): 0001-01-01T00:00:00\+05:00 is outside the years 1..9999"):
        codec.encode_value(early, codec.type_code("datetime"), "c")


def test_mysql_time_as_timedelta() -> None:
    code = codec.type_code("time")
    assert codec.decode_value(codec.encode_value(dt.timedelta(hours=1, microseconds=5), code), code) == dt.time(
        1, 0, 0, 5
    )


def test_a_str_in_a_json_column_is_json_text() -> None:
    code = codec.type_code("json")
    assert codec.decode_value(codec.encode_value('"text"', code), code) == "text"
    assert codec.decode_value(codec.encode_value("[1, 2]", code), code) == [1, 2]


def test_json_text_is_canonical() -> None:
    code = codec.type_code("json")
    assert codec.encode_value('{"b": 1, "a": [1, 2]}', code).json_value == '{"a":[1,2],"b":1}'


@pytest.mark.parametrize(
    ("name", "value", "exc", "needle"),
    [
        ("float", math.nan, ValueError, "NaN"),
        ("float", math.inf, ValueError, "NaN and infinities"),
        ("float", -math.inf, ValueError, "infinities"),
        ("decimal", decimal.Decimal("NaN"), ValueError, "finite"),
        ("decimal", 1.5, TypeError, "floats lose precision"),
        ("int", 1 << 63, ValueError, "signed 64-bit"),
        ("int", -(1 << 63) - 1, ValueError, "signed 64-bit"),
        ("int", True, TypeError, "expected int"),
        ("uint", -1, ValueError, "unsigned 64-bit"),
        ("uint", 1 << 64, ValueError, "unsigned 64-bit"),
        ("string", b"x", TypeError, "expected str"),
        ("bytes", "x", TypeError, "expected bytes"),
        ("date", dt.datetime(2026, 1, 1), TypeError, "expected date"),
        ("time", dt.timedelta(days=1), ValueError, "within one day"),
        ("json", "{not json", ValueError, "not valid JSON"),
        ("json", {"x": math.nan}, ValueError, "JSON"),
        ("bool", 2, TypeError, "expected bool"),
    ],
)
def test_refusals_name_column_and_problem(name: str, value: object, exc: type, needle: str) -> None:
    with pytest.raises(exc) as err:
        codec.encode_value(value, codec.type_code(name), "t.col")
    assert "t.col" in str(err.value) and needle in str(err.value)


def _table() -> binlog_pb2.TableInfo:
    return new_table(7, "db", "t", [ColumnDef("id", "int"), ColumnDef("v", "string"), ColumnDef("n", "int")],
                     ["id"], None, 1)


def test_rows_decode_by_column_id_across_schema_changes() -> None:
    from binlake.sql import schema

    t1 = _table()
    data = codec.encode_row({"id": 1, "v": "a", "n": 5}, t1)
    t2 = schema.add_column(schema.drop_column(t1, "n", 2), ColumnDef("n", "string"), 3)  # new id for "n"
    t3 = schema.rename_column(t2, "v", "w", 4)
    # The dropped column's id is retired: old data never shows up in the new "n".
    assert codec.decode_row(data, t3) == {"id": 1, "w": "a", "n": None}
    assert codec.decode_row(data, t1) == {"id": 1, "v": "a", "n": 5}


def test_row_refuses_unknown_columns_and_missing_not_null() -> None:
    t = _table()
    with pytest.raises(ValueError, match="no column"):
        codec.encode_row({"id": 1, "zz": 2}, t)
    with pytest.raises(ValueError, match="NOT NULL"):
        codec.encode_row({"v": "x"}, t)


def test_update_pair_round_trip() -> None:
    t = _table()
    old, new = codec.decode_update(codec.encode_update({"id": 1, "v": "a"}, {"id": 2, "v": None}, t), t)
    assert old == {"id": 1, "v": "a", "n": None} and new == {"id": 2, "v": None, "n": None}


def test_writer_json_string_documents_round_trip(tmp_path) -> None:
    """Through TxnWriter a str in a JSON column is a JSON string document (SQLAlchemy's
    meaning), and it reaches the binlog as that document."""
    from binlake.sql.schema import ColumnDef, new_table
    from binlake.writer.txn_writer import Txn

    info = new_table(1, "db", "t", [ColumnDef("id", "int"), ColumnDef("doc", "json")], ["id"], None, 1)
    data = Txn._encode(None, info, {"id": 1, "doc": "plain text, not JSON"})  # type: ignore[arg-type]
    assert codec.decode_row(data, info) == {"id": 1, "doc": "plain text, not JSON"}
