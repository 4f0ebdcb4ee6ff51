"""Decoding complete transactions into change rows and DDL rows (pure functions):
the image JSON of every type, lossless round trips, seq and keys, the schema
history's as-of lookups, and clear errors instead of silent drops."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from binlake import codec, tso
from binlake.lake.decoding import decode
from binlake.lake.decoding import image as lake_image
from binlake.lake.decoding.change_decoder import ChangeDecoder, change_rows
from binlake.lake.decoding.ddl_rows import ddl_row
from binlake.lake.decoding.image import image_values, value_json
from binlake.lake.decoding.rows import commit_date
from binlake.lake.decoding.schema_history import SchemaHistory, UnknownTableError
from binlake.lake.decoding.txn import CorruptBinlogError
from binlake.proto import binlog_pb2
from binlake.sql import schema as sc
from binlake.sql.schema import ColumnDef, new_table

TS = tso.compose(1_795_000_000_000)  # 2026-11-18
ALL_TYPES = ["int", "uint", "bool", "float", "decimal", "string", "bytes", "date", "datetime", "time", "json"]

JSON_DOC = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
).filter(lambda v: not isinstance(v, str))  # a top-level str is JSON *text* to the codec

VALUES = {
    "int": st.integers(codec.INT_MIN, codec.INT_MAX),
    "uint": st.integers(0, codec.UINT_MAX),
    "bool": st.booleans(),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "decimal": st.decimals(allow_nan=False, allow_infinity=False, places=None),
    "string": st.text() | st.text(min_size=130, max_size=300),
    "bytes": st.binary(),
    "date": st.dates(),
    "datetime": st.datetimes(),
    "time": st.times(),
    "json": JSON_DOC,
}


def table(table_id: int = 100, name: str = "t", version: int = 1, extra: list[ColumnDef] | None = None,
          pk: list[str] | None = None) -> binlog_pb2.TableInfo:
    cols = [ColumnDef("id", "int", False), ColumnDef("v", "string", True, length=20), *(extra or [])]
    return new_table(table_id, "app", name, cols, pk or ["id"], None, version)


def txn(start: int, commit: int, *mutations: binlog_pb2.TableMutation, version: int = 1,
        ddl: tuple[str, binlog_pb2.TableInfo] | None = None) -> binlog_pb2.Binlog:
    b = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start, commit_ts=commit,
                          prewrite_value=binlog_pb2.PrewriteValue(schema_version=version,
                                                                  mutations=list(mutations)).SerializeToString())
    if ddl is not None:
        b.ddl_query = ddl[0].encode()
        b.ddl_table.CopyFrom(ddl[1])
    return b


def mutation(info: binlog_pb2.TableInfo, *changes: tuple[str, dict | None, dict | None]) -> binlog_pb2.TableMutation:
    m = binlog_pb2.TableMutation(table_id=info.table_id)
    for op, before, after in changes:
        if op == "insert":
            m.inserted_rows.append(codec.encode_row(after, info))
            m.sequence.append(binlog_pb2.INSERT)
        elif op == "update":
            m.updated_rows.append(codec.encode_update(before, after, info))
            m.sequence.append(binlog_pb2.UPDATE)
        else:
            m.deleted_rows.append(codec.encode_row(before, info))
            m.sequence.append(binlog_pb2.DELETE_ROW)
    return m


# ---------------------------------------------------------------- image JSON
@pytest.mark.parametrize(("col_type", "value", "text"), [
    ("int", -42, "-42"),
    ("int", codec.INT_MIN, str(codec.INT_MIN)),
    ("uint", codec.UINT_MAX, str(codec.UINT_MAX)),
    ("bool", True, "true"),
    ("bool", False, "false"),
    ("float", 1.0, "1.0"),
    ("float", 1e16, "1e+16"),
    ("float", -0.1, "-0.1"),
    ("decimal", decimal.Decimal("12.50"), '"12.50"'),
    ("decimal", decimal.Decimal("-1E+3"), '"-1E+3"'),
    ("string", 'a "quoted"\\ line\nnext\t\x01 é漢🙂', '"a \\"quoted\\"\\\\ line\\nnext\\t\\u0001 é漢🙂"'),
    ("bytes", b"\x00\x01\xff", '{"$base64":"AAH/"}'),
    ("date", dt.date(2026, 11, 21), '"2026-11-21"'),
    ("datetime", dt.datetime(2026, 11, 21, 8, 0), '"2026-11-21T08:00:00.000000"'),
    ("datetime", dt.datetime(1969, 12, 31, 23, 59, 59, 999999), '"1969-12-31T23:59:59.999999"'),
    ("time", dt.time(8, 0, 0, 1), '"08:00:00.000001"'),
    ("json", {"b": [1, 2], "a": None}, '{"a":null,"b":[1,2]}'),
    ("string", None, "null"),
])
def test_image_json_of_each_type(col_type: str, value: object, text: str) -> None:
    assert value_json(value, col_type) == text


def test_image_is_canonical_sorted_and_compact() -> None:
    info = table(extra=[ColumnDef("b", "int"), ColumnDef("a", "json")])
    row = codec.encode_row({"id": 7, "v": None, "b": 3, "a": {"z": 1, "y": [True]}}, info)
    history = SchemaHistory.from_tables([info])
    rows = change_rows(txn(10, TS, mutation(info, ("insert", None, {"id": 7, "b": 3, "a": {"z": 1, "y": [True]}}))),
                       history)
    assert rows[0]["after"] == '{"a":{"y":[true],"z":1},"b":3,"id":7,"v":null}'
    assert rows[0]["keys"] == '{"id":7}'
    assert json.loads(rows[0]["after"]) == {"a": {"y": [True], "z": 1}, "b": 3, "id": 7, "v": None}
    assert codec.decode_row(row, info)["a"] == {"z": 1, "y": [True]}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_images_read_back_exactly(data: st.DataObject) -> None:
    """image_values(after) equals what codec.decode_row gives: the encoding is lossless."""
    types = data.draw(st.lists(st.sampled_from(ALL_TYPES), min_size=1, max_size=4))
    info = table()
    row = {"id": data.draw(VALUES["int"])}
    for i, t in enumerate(types):  # any type, no declaration limits: decoding needs none
        name = f"c{i}_{t}"
        info.columns.add(id=10 + i, name=name, type=codec.type_code(t), nullable=True)
        row[name] = data.draw(st.none() | VALUES[t])
    history = SchemaHistory.from_tables([info])
    out = change_rows(txn(10, TS, mutation(info, ("insert", None, row))), history)
    expected = codec.decode_row(codec.encode_row(row, info), info)
    assert image_values(out[0]["after"], info) == expected
    assert image_values(out[0]["keys"], new_table(100, "app", "t", [ColumnDef("id", "int", False)],
                                                  ["id"], None, 1)) == {"id": expected["id"]}


def _datums() -> st.SearchStrategy[tuple[binlog_pb2.Datum, int]]:
    def one(col_type: str) -> st.SearchStrategy[tuple[binlog_pb2.Datum, int]]:
        return (st.none() | VALUES[col_type]).map(
            lambda v: (codec.encode_value(v, codec.type_code(col_type)), codec.type_code(col_type)))
    return st.sampled_from(ALL_TYPES).flatmap(one)


@settings(max_examples=300, deadline=None)
@given(_datums())
def test_fast_datum_path_equals_the_reference(pair: tuple[binlog_pb2.Datum, int]) -> None:
    datum, col_type = pair
    assert lake_image._datum_bytes_json(datum.SerializeToString(), col_type) == lake_image._datum_json(datum, col_type)


@pytest.mark.parametrize("raw", [
    b"",  # no field set: NULL
    b"\x08\x00",  # is_null = false is still the NULL kind
    binlog_pb2.Datum(string_value="a").SerializeToString() + binlog_pb2.Datum(int_value=5).SerializeToString(),
    binlog_pb2.Datum(int_value=5).SerializeToString() + binlog_pb2.Datum(string_value="a").SerializeToString(),
    binlog_pb2.Datum(string_value="x" * 20000).SerializeToString(),  # a 3-byte length
    binlog_pb2.Datum(json_value='{"a":"' + "y" * 300 + '"}').SerializeToString(),
    binlog_pb2.Datum(int_value=-(2**63)).SerializeToString(),
])
def test_fast_datum_path_handles_unusual_encodings(raw: bytes) -> None:
    assert lake_image._datum_bytes_json(raw, binlog_pb2.STRING) == lake_image._datum_json(
        binlog_pb2.Datum.FromString(raw), binlog_pb2.STRING)


# ---------------------------------------------------------------- change rows
def test_seq_runs_across_tables_and_keys_follow_the_images() -> None:
    a = table(100, "a")
    b = table(101, "b", pk=["id", "v"])
    history = SchemaHistory.from_tables([a, b])
    t = txn(10, TS,
            mutation(a, ("insert", None, {"id": 1, "v": "x"}),
                     ("update", {"id": 1, "v": "x"}, {"id": 2, "v": "y"}),  # a primary-key change
                     ("delete", {"id": 2, "v": "y"}, None)),
            mutation(b, ("insert", None, {"id": 5, "v": "k"})))
    rows = change_rows(t, history, pump="pump1")
    assert [(r["seq"], r["tbl"], r["op"]) for r in rows] == [
        (0, "a", "insert"), (1, "a", "update"), (2, "a", "delete"), (3, "b", "insert")]
    ins, upd, dele, other = rows
    assert (ins["before"], ins["after"], ins["keys"]) == (None, '{"id":1,"v":"x"}', '{"id":1}')
    assert (upd["before"], upd["after"], upd["keys"]) == ('{"id":1,"v":"x"}', '{"id":2,"v":"y"}', '{"id":2}')
    assert (dele["before"], dele["after"], dele["keys"]) == ('{"id":2,"v":"y"}', None, '{"id":2}')
    assert other["keys"] == '{"id":5,"v":"k"}'
    assert {r["commit_ts"] for r in rows} == {TS} and {r["start_ts"] for r in rows} == {10}
    assert {r["pump"] for r in rows} == {"pump1"} and {r["db"] for r in rows} == {"app"}
    assert ins["commit_date"] == commit_date(TS) == tso.to_datetime(TS).date()
    assert ins["schema_version"] == 1 and other["table_id"] == 101


def test_sequence_order_interleaves_kinds() -> None:
    info = table()
    m = mutation(info, ("insert", None, {"id": 1}), ("delete", {"id": 9}, None))
    # Execution order: delete first, then insert, as the sequence says.
    m.sequence[:] = [binlog_pb2.DELETE_ROW, binlog_pb2.INSERT]
    rows = change_rows(txn(10, TS, m), SchemaHistory.from_tables([info]))
    assert [(r["seq"], r["op"], r["keys"]) for r in rows] == [(0, "delete", '{"id":9}'), (1, "insert", '{"id":1}')]


def test_ddl_inside_the_window_applies_to_later_transactions_only() -> None:
    v1 = table()
    v2 = sc.add_column(sc.rename_column(v1, "v", "w", 2), ColumnDef("z", "int"), 2)
    renamed = sc.rename_table(v2, "t2", 3)
    history = SchemaHistory()
    txns = [
        txn(1, TS + 1, version=1, ddl=("CREATE TABLE t", v1)),
        txn(2, TS + 3, mutation(v1, ("insert", None, {"id": 1, "v": "a"}))),
        txn(4, TS + 5, version=2, ddl=("ALTER TABLE t ...", v2)),
        txn(6, TS + 7, mutation(v2, ("insert", None, {"id": 2, "w": "b", "z": 3})), version=2),
        txn(8, TS + 9, version=3, ddl=("RENAME TABLE t TO t2", renamed)),
        txn(10, TS + 11, mutation(renamed, ("delete", {"id": 1, "w": "a"}, None)), version=3),
    ]
    changes, ddls = decode.decode_window(txns, history)
    assert [(c["tbl"], c["after"] or c["before"], c["schema_version"]) for c in changes] == [
        ("t", '{"id":1,"v":"a"}', 1),
        ("t", '{"id":2,"w":"b","z":3}', 2),
        ("t2", '{"id":1,"w":"a","z":null}', 3),
    ]
    assert [(d["commit_ts"], d["tbl"], d["table_id"], d["schema_version"], d["query"]) for d in ddls] == [
        (TS + 1, "t", 100, 1, "CREATE TABLE t"), (TS + 5, "t", 100, 2, "ALTER TABLE t ..."),
        (TS + 9, "t2", 100, 3, "RENAME TABLE t TO t2")]
    assert binlog_pb2.TableInfo.FromString(ddls[1]["table_info"]) == v2
    assert json.loads(ddls[1]["table_json"])["columns"][1]["name"] == "w"
    assert ddls[0]["dropped"] is False and ddls[0]["previous_table_id"] == 0


def test_unknown_table_is_an_error_naming_it() -> None:
    info = table(555)
    with pytest.raises(UnknownTableError, match="table id 555") as err:
        change_rows(txn(10, TS, mutation(info, ("insert", None, {"id": 1}))), SchemaHistory())
    assert err.value.table_id == 555


def test_corrupt_and_malformed_transactions_are_refused() -> None:
    info = table()
    history = SchemaHistory.from_tables([info])
    bad = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=1, commit_ts=TS, prewrite_value=b"\xff\xff")
    with pytest.raises(CorruptBinlogError, match="start_ts 1"):
        change_rows(bad, history)
    m = mutation(info, ("insert", None, {"id": 1}))
    m.sequence.append(binlog_pb2.INSERT)  # two in the sequence, one row
    with pytest.raises(CorruptBinlogError, match="sequence lists 2"):
        change_rows(txn(1, TS, m), history)
    m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[b"\x0a\x05\xff"], sequence=[binlog_pb2.INSERT])
    with pytest.raises(CorruptBinlogError, match="does not decode"):
        change_rows(txn(1, TS, m), history)
    with pytest.raises(ValueError, match="not a complete transaction"):
        change_rows(binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=1), history)
    with pytest.raises(TypeError, match="Binlog"):
        change_rows(b"raw", history)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SchemaHistory"):
        ChangeDecoder({})  # type: ignore[arg-type]


def test_transactions_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="out of commit_ts order"):
        decode.decode_window([txn(1, TS + 5), txn(2, TS + 1)], SchemaHistory())


# ---------------------------------------------------------------- schema history
def test_history_answers_as_of_a_commit_ts() -> None:
    v1 = table()
    v2 = sc.add_column(v1, ColumnDef("z", "int"), 2)
    history = SchemaHistory()
    history.add(200, v2)  # added out of order: lookups still see commit_ts order
    history.add(100, v1)
    assert history.table(100, 101) == v1
    assert history.table(100, 200) == v1  # a DDL is in force only after its own commit_ts
    assert history.table(100, 201) == v2
    assert history.table(100) == v2
    with pytest.raises(UnknownTableError, match="first DDL in the history committed later"):
        history.table(100, 100)
    history.add(200, v2)  # the same DDL again changes nothing
    assert len(history) == 2


def test_truncate_retires_the_old_id_and_drop_ends_the_table() -> None:
    v1 = table()
    truncated = sc.truncate_table(v1, 101, 2)
    dropped = sc.drop_table(truncated, 3)
    history = SchemaHistory.from_tables([v1], commit_ts=10)
    history.add(20, truncated)
    history.add(30, dropped)
    assert history.table(100, 15) == v1
    with pytest.raises(UnknownTableError, match="replaced by table id 101"):
        history.table(100, 25)
    assert history.table(101, 25) == truncated
    with pytest.raises(UnknownTableError, match=r"table id 101 \(app.t\).*was dropped"):
        history.table(101, 35)
    assert not history.knows(101, 35) and history.knows(101, 25)


def test_history_snapshot_and_transport() -> None:
    v1, other = table(), table(101, "o")
    v2 = sc.add_column(v1, ColumnDef("z", "int"), 2)
    v3 = sc.rename_table(v2, "t3", 3)
    history = SchemaHistory()
    for ts, info in ((10, v1), (11, other), (20, v2), (40, v3)):
        history.add(ts, info)
    snap = history.snapshot(30)
    assert len(snap) == 3  # v1 is no longer needed at or after 30
    for at in (30, 40, 41, 10**6):
        for table_id in (100, 101):
            assert snap.table(table_id, at) == history.table(table_id, at)
    back = SchemaHistory.from_json(history.to_json())
    assert list(back.entries()) == list(history.entries())
    rows = [{"commit_ts": ts, "table_info": info.SerializeToString()} for ts, info in history.entries()]
    rows.append({"commit_ts": 50, "table_info": None})  # a DDL without a definition
    assert list(SchemaHistory.from_rows(rows).entries()) == list(history.entries())
    with pytest.raises(ValueError, match="schema history"):
        SchemaHistory.from_json("[[1, \"not base64!\"]]")


def test_history_validates_its_inputs() -> None:
    history = SchemaHistory()
    with pytest.raises(TypeError, match="TableInfo"):
        history.add(1, "t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TSO"):
        history.add(-1, table())
    with pytest.raises(ValueError, match="no table id"):
        history.add(1, binlog_pb2.TableInfo(name="x"))
    with pytest.raises(ValueError, match="not a DDL"):
        history.apply(txn(1, TS))
    with pytest.raises(TypeError, match="table_id"):
        history.table("100")  # type: ignore[arg-type]


def test_image_values_checks_its_input() -> None:
    info = table()
    assert image_values(None, info) is None
    with pytest.raises(ValueError, match="does not"):
        image_values('{"id":1,"nope":2}', info)
    with pytest.raises(ValueError, match="JSON object"):
        image_values("[1]", info)


def test_ddl_row_of_a_ddl_without_a_definition() -> None:
    b = txn(1, TS, version=7)
    b.ddl_query = b"CREATE DATABASE x"
    row = ddl_row(b)
    assert (row["schema_version"], row["table_id"], row["table_info"], row["dropped"]) == (7, None, None, False)
    with pytest.raises(ValueError, match="not a DDL"):
        ddl_row(txn(1, TS))
