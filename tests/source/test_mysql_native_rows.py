"""The native row-event decoder (``source.mysql._rowsc``) against the Python path,
on row events a real MariaDB wrote.

The contract: for every rows event the native decoder answers, its serialized
Rows are byte for byte what mysql-replication + ``RowEncoder`` give for the
same event; for anything it does not reproduce it declines (None) and the
Python path, which reads the untouched event afterwards, decides. Hypothesis
generates rows of every covered type (NULLs, edge values, empty SETs,
fractions), writes them as inserts, updates and deletes, and every resulting
event is decoded both ways.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import os
import pathlib
import random
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import QueryEvent
from pymysqlreplication.row_event import DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent
from srckit import Cluster, SourceThread, sql

from binlake import errors
from binlake.source import prewrite
from binlake.source.mysql import rowsplan
from binlake.source.mysql.source import MySQLSource, _Txn, load_catalog
from binlake.source.mysql.tables import TableFilter
from binlake.source.mysql.values import prepare_table_map
from binlake.source.tables import assign_ids
from binlake.stack.localdb import LocalMariaDB

_needs_server = pytest.mark.skipif(not LocalMariaDB.available(),
                                   reason="MariaDB not installed (apt-get install mariadb-server)")
_needs_ext = pytest.mark.skipif(not rowsplan.available(), reason=f"_rowsc not built: {rowsplan.import_error()}")
pytestmark = [_needs_server, _needs_ext]

DB = "nativerows"
# Every type the native decoder covers, nullable and NOT NULL, several widths.
WIDE = """CREATE TABLE wide (
  id INT NOT NULL PRIMARY KEY,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  i INT NOT NULL, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, b BOOL,
  d DECIMAL(65,30), d2 DECIMAL(10,2) UNSIGNED, d3 DECIMAL(5,0), d4 DECIMAL(20,12), d5 DECIMAL(9,9),
  f FLOAT, db DOUBLE NOT NULL,
  c CHAR(5), vc VARCHAR(300), tx TEXT, l1 VARCHAR(20) CHARACTER SET latin1, a1 CHAR(3) CHARACTER SET ascii,
  bn BINARY(4), vb VARBINARY(20), bl BLOB,
  dt DATE, dtm DATETIME(6), dt0 DATETIME, ts TIMESTAMP(3) NULL, tm TIME(2), tm5 TIME(5), yr YEAR,
  e ENUM('red','green','blue'), st SET('a','b','c'), sn SET('x','y') NOT NULL, bt BIT(10), b1 BIT(1), b64 BIT(64)
) CHARACTER SET utf8mb4"""
# A column the decoder never covers (JSON): every event of this table takes the Python path.
WITH_JSON = "CREATE TABLE withjson (id INT PRIMARY KEY, j JSON, v VARCHAR(10)) CHARACTER SET utf8mb4"

_ids = itertools.count(1)


def _text(alphabet: st.SearchStrategy[str] | None = None, max_size: int = 20) -> st.SearchStrategy[str]:
    chars = alphabet if alphabet is not None else st.characters(codec="utf-8", exclude_categories=("Cs",))
    return st.text(chars, max_size=max_size)


def _dec(p: int, s: int, lo: int | None = None) -> st.SearchStrategy[decimal.Decimal]:
    hi = decimal.Decimal(10) ** (p - s) - decimal.Decimal(1).scaleb(-s)
    return st.decimals(min_value=(-hi if lo is None else lo), max_value=hi, places=s, allow_nan=False,
                       allow_infinity=False)


def _null(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


_DATETIMES = st.datetimes(min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59))
_TIMES = st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(hours=23, minutes=59, seconds=59))

# Each column's values (the snapshot row tests take the ones they cover).
ROW_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "ti": _null(st.integers(-128, 127)), "tu": _null(st.integers(0, 255)),
    "si": _null(st.integers(-(2**15), 2**15 - 1)), "su": _null(st.integers(0, 2**16 - 1)),
    "mi": _null(st.integers(-(2**23), 2**23 - 1)), "mu": _null(st.integers(0, 2**24 - 1)),
    "i": st.integers(-(2**31), 2**31 - 1), "iu": _null(st.integers(0, 2**32 - 1)),
    "bi": _null(st.integers(-(2**63), 2**63 - 1)), "bu": _null(st.integers(0, 2**64 - 1)), "b": _null(st.booleans()),
    "d": _null(_dec(65, 30)), "d2": _null(_dec(10, 2, lo=0)), "d3": _null(_dec(5, 0)), "d4": _null(_dec(20, 12)),
    "d5": _null(_dec(9, 9)),
    "f": _null(st.floats(width=32, allow_nan=False, allow_infinity=False)),
    "db": st.floats(allow_nan=False, allow_infinity=False),
    "c": _null(_text(max_size=5)), "vc": _null(_text(max_size=300)), "tx": _null(_text(max_size=400)),
    "l1": _null(_text(st.characters(codec="cp1252"), max_size=20)),
    "a1": _null(_text(st.characters(codec="ascii"), max_size=3)),
    "bn": _null(st.binary(max_size=4)), "vb": _null(st.binary(max_size=20)), "bl": _null(st.binary(max_size=300)),
    "dt": _null(st.dates(min_value=dt.date(1000, 1, 1), max_value=dt.date(9999, 12, 31))),
    "dtm": _null(_DATETIMES), "dt0": _null(_DATETIMES.map(lambda v: v.replace(microsecond=0))),
    "ts": _null(st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2038, 1, 1))
                .map(lambda v: v.replace(microsecond=v.microsecond // 1000 * 1000))),
    "tm": _null(_TIMES.map(lambda v: v - dt.timedelta(microseconds=v.microseconds % 10000))),
    "tm5": _null(_TIMES.map(lambda v: v - dt.timedelta(microseconds=v.microseconds % 10))),
    "yr": _null(st.integers(1901, 2155)), "e": _null(st.sampled_from(["", "red", "green", "blue"])),
    "st": _null(st.sets(st.sampled_from(["a", "b", "c"])).map(",".join)),
    "sn": st.sets(st.sampled_from(["x", "y"])).map(",".join),
    "bt": _null(st.integers(0, 2**10 - 1)), "b1": _null(st.integers(0, 1)), "b64": _null(st.integers(0, 2**64 - 1)),
}
ROW = st.fixed_dictionaries(ROW_VALUES)


def _connect(server: LocalMariaDB) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=DB,
                           autocommit=False)
    with conn.cursor() as cur:
        # UTC: TIMESTAMP values round-trip as written; '' in ENUM is the error value (index 0).
        cur.execute("SET time_zone = '+00:00', sql_mode = 'NO_ENGINE_SUBSTITUTION'")
    return conn


@pytest.fixture(scope="module")
def rig(mdb: LocalMariaDB, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MySQLSource]:
    sql(mdb, f"CREATE DATABASE IF NOT EXISTS {DB}")
    sql(mdb, WIDE, WITH_JSON, db=DB)
    src = MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=77, registry="127.0.0.1:1",
                      data_dir=str(tmp_path_factory.mktemp("native-src")), tables=f"{DB}.*")
    conn = src.dsn.connect()
    try:
        src.catalog = load_catalog(conn, TableFilter(f"{DB}.*"))
    finally:
        conn.close()
    for n, t in enumerate(sorted(src.catalog.tables.values(), key=lambda t: t.name)):
        assign_ids(t, None, 100 + n, 1)
    yield src
    src.state.close()


def _position(server: LocalMariaDB) -> tuple[str, int]:
    f, p = sql(server, "SHOW MASTER STATUS")[0][:2]
    return str(f), int(p)


def both_ways(server: LocalMariaDB, src: MySQLSource, start: tuple[str, int]) -> dict[str, int]:
    """Decode every rows event from ``start`` to the end of the binlog both ways; the
    native answer, whenever there is one, must equal the Python path's bytes."""
    stream = BinLogStreamReader(
        connection_settings=src.dsn.settings(), server_id=src.server_id, blocking=False, resume_stream=True,
        log_file=start[0], log_pos=start[1], freeze_schema=True, enable_logging=False,
        only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, QueryEvent],
    )
    counts = {"native": 0, "declined": 0, "no_plan": 0, "rows": 0}
    plans: dict[int, Any] = {}
    tables: dict[int, Any] = {}
    try:
        for ev in stream:
            if isinstance(ev, TableMapEvent):
                t = src.catalog.get(ev.schema, ev.table)
                if t is None:
                    continue
                prepare_table_map(ev, t)
                tables[ev.table_id] = t
                plans[ev.table_id] = rowsplan.build_plan(ev.columns, t, src._encoder(t))
            elif isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)) and ev.table_id in tables:
                t, plan = tables[ev.table_id], plans[ev.table_id]
                native = rowsplan.decode(plan, ev) if plan is not None else None
                want = _Txn()
                try:  # the Python path, reading the same (untouched) event afterwards
                    src._rows(want, t, ev, None)
                    python: list[bytes] | None = _rows_of(want, t.table_id)
                except errors.FailedPrecondition:
                    python = None
                if plan is None:
                    counts["no_plan"] += 1
                elif native is None:
                    counts["declined"] += 1
                else:
                    assert python is not None, f"native decoded an event the Python path refuses ({t.name})"
                    assert native == python, f"{t.name}: native and Python rows differ"
                    counts["native"] += 1
                    counts["rows"] += len(native)
    finally:
        stream.close()
    return counts


def _rows_of(txn: _Txn, table_id: int) -> list[bytes]:
    m = txn.mutations[table_id]
    return list(m.inserted_rows) + list(m.updated_rows) + list(m.deleted_rows)


def _insert(cur: Any, table: str, rows: list[dict[str, Any]]) -> None:
    """One multi-row INSERT (one rows event) per run of rows with the same columns."""
    for cols, group in itertools.groupby(rows, key=lambda r: tuple(r)):
        cur.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})",
                        [[r[c] for c in cols] for r in group])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(ROW, min_size=1, max_size=6), changes=st.lists(ROW, min_size=1, max_size=6))
def test_native_equals_python_on_generated_rows(mdb: LocalMariaDB, rig: MySQLSource, rows: list[dict[str, Any]],
                                                changes: list[dict[str, Any]]) -> None:
    start = _position(mdb)
    ids = [next(_ids) for _ in rows]
    conn = _connect(mdb)
    try:
        with conn.cursor() as cur:
            _insert(cur, "wide", [{"id": i, **r} for i, r in zip(ids, rows, strict=True)])
            for i, new in zip(ids, changes, strict=False):  # multi-row UPDATE images: before and after
                cur.execute(f"UPDATE wide SET {', '.join(f'{c} = %s' for c in new)} WHERE id = %s",
                            [*new.values(), i])
            cur.execute(f"DELETE FROM wide WHERE id IN ({', '.join(map(str, ids[: len(ids) // 2 + 1]))})")
        conn.commit()
    finally:
        conn.close()
    counts = both_ways(mdb, rig, start)
    # insert + delete (+ update unless it changed nothing); every generated value is one the decoder covers
    assert counts["native"] >= 2 and counts["declined"] == 0 and counts["no_plan"] == 0, counts


def test_edge_values_and_mixed_fallback_events(mdb: LocalMariaDB, rig: MySQLSource) -> None:
    """Extremes of every type decode natively; values the Python path turns into
    NULL or refuses (a zero date, a TIME past a day, cp1252's undefined bytes) make
    the decoder decline that event only; a JSON table in the same transaction has
    no plan at all."""
    start = _position(mdb)
    conn = _connect(mdb)
    try:
        with conn.cursor() as cur:
            _insert(cur, "wide", [
                {"id": 900001, "ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608, "mu": 16777215,
                 "i": -2147483648, "iu": 4294967295, "bi": -(2**63), "bu": 2**64 - 1, "b": True,
                 "d": decimal.Decimal("-" + "9" * 35 + "." + "9" * 30), "d2": decimal.Decimal("0.00"),
                 "d3": decimal.Decimal(0), "d4": decimal.Decimal("0.000000000001"), "d5": decimal.Decimal("-0.5"),
                 "f": 3.4028234e38, "db": -0.0, "c": "", "vc": "x" * 300, "tx": "naïve 😀", "l1": "€ÿ", "a1": "abc",
                 "bn": b"\x00", "vb": b"", "bl": b"\x00\xff" * 100, "dt": dt.date(9999, 12, 31),
                 "dtm": dt.datetime(1000, 1, 1, 0, 0, 0, 1), "dt0": dt.datetime(2024, 2, 29, 23, 59, 59),
                 "ts": dt.datetime(2038, 1, 19, 3, 14, 7, 999000), "tm": dt.timedelta(hours=23, minutes=59,
                 seconds=59, microseconds=990000), "tm5": dt.timedelta(0), "yr": 2155, "e": "blue",
                 "st": "a,b,c", "sn": "", "bt": 1023, "b1": 1, "b64": 2**64 - 1},
                {"id": 900002, "i": 0, "db": 1e308, "d4": decimal.Decimal("-0.00000001")},
            ])
            cur.execute("INSERT INTO withjson VALUES (1, '{\"b\": [1, 2], \"a\": null}', 'v')")
            _insert(cur, "wide", [{"id": 900003, "i": 1, "db": 0.0, "dt": "0000-00-00"}])  # zero date: declined
            _insert(cur, "wide", [{"id": 900004, "i": 1, "db": 0.0, "tm": "30:00:00"}])  # > a day: declined
            cur.execute("INSERT INTO wide (id, i, db, l1) VALUES (900005, 1, 0, X'81')")  # undefined in cp1252
            cur.execute("UPDATE wide SET i = i + 1 WHERE id = 900001")
        conn.commit()
    finally:
        conn.close()
    counts = both_ways(mdb, rig, start)
    assert counts == {"native": 3, "declined": 3, "no_plan": 1, "rows": 3}, counts


@pytest.fixture
def native_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rowsplan.NATIVE_ROWS_ENV, "0")


def test_env_switch_forces_the_python_path(native_off: None) -> None:
    assert not rowsplan.enabled()


def test_source_sends_the_same_with_and_without_native(mdb: LocalMariaDB, cluster: Cluster,
                                                       tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: one source run natively (C framing + C rows), one reading through
    mysql-replication with the native rows, one on the Python path for both, all from
    the same start over a mixed workload (a JSON table's events on the Python path in
    the same transactions, a binlog rotation), send the Pump identical transactions
    (DDL in the stream: test_mysql_source, which runs the default, native path)."""
    from pumpkit import wait_until

    from binlake.source import base as source_mod  # the Emitter every source makes
    from binlake.source.mysql import framing

    sent: dict[str, list[tuple[str, bytes]]] = {}

    def mode() -> str:
        return os.environ[framing.NATIVE_FRAMING_ENV] + os.environ[rowsplan.NATIVE_ROWS_ENV]

    class Recording(source_mod.Emitter):  # type: ignore[misc, name-defined]
        def emit(self, key: str, value: Any, *args: Any, **kw: Any) -> Any:
            sent.setdefault(mode(), []).append((key, value.SerializeToString()))
            return super().emit(key, value, *args, **kw)

        def step(self, decide: Any, txns: Any) -> Any:
            for key, value in txns:
                sent.setdefault(mode(), []).append((key, value))
            return super().step(decide, txns)

    monkeypatch.setattr(source_mod, "Emitter", Recording)
    sql(mdb, "CREATE DATABASE IF NOT EXISTS e2e", "CREATE TABLE e2e.t (id INT PRIMARY KEY, v VARCHAR(20), "
        "d DECIMAL(12,4), ts DATETIME(3), j JSON)", "CREATE TABLE e2e.u (id INT PRIMARY KEY, n BIGINT UNSIGNED, "
        "s SET('p','q') NOT NULL)")
    start = _position(mdb)
    sql(mdb, "INSERT INTO e2e.t SELECT seq, CONCAT('v', seq), seq / 7, '2024-01-01 00:00:00.5', NULL "
        "FROM seq_1_to_300", "UPDATE e2e.t SET j = '[1]' WHERE id < 5", "INSERT INTO e2e.u SELECT seq, seq * 1000, "
        "IF(seq % 2, 'p', '') FROM seq_1_to_200", "DELETE FROM e2e.u WHERE id > 150", "FLUSH BINARY LOGS",
        "UPDATE e2e.u SET n = n + 1", db="e2e")
    sql(mdb, "BEGIN", "INSERT INTO e2e.t VALUES (1000, 'a', 1, NULL, '{}')", "INSERT INTO e2e.u VALUES (1000, 1, 'q')",
        "COMMIT")
    end = _position(mdb)
    for n, (framed, native) in enumerate((("1", "1"), ("0", "1"), ("0", "0"))):
        monkeypatch.setenv(framing.NATIVE_FRAMING_ENV, framed)
        monkeypatch.setenv(rowsplan.NATIVE_ROWS_ENV, native)
        src = MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=500 + n, registry=cluster.registry.addr,
                          data_dir=str(tmp_path / f"s{n}"), tables="e2e.*", start=f"{start[0]}:{start[1]}")
        assert src.native == (native == "1") and src.native_framing == (framed == "1" and framing.available())
        th = SourceThread(src).start()
        try:
            wait_until(lambda s=src, t=th: (s.file, s.pos) >= end or t.error is not None, timeout=60,
                       what="source caught up")  # type: ignore[misc]
        finally:
            th.stop()
        assert (src.native_events > 0) == (native == "1") and src.python_events > 0, native
    # 2 initial table definitions + 6 transactions, byte-identical from every path
    assert len(sent["11"]) == 8 and sent["11"] == sent["01"] == sent["00"]


def test_without_the_extension_everything_takes_the_python_path(monkeypatch: pytest.MonkeyPatch,
                                                                 rig: MySQLSource) -> None:
    t = rig.catalog.get(DB, "wide")
    assert t is not None
    monkeypatch.setattr(rowsplan, "_rowsc", None)
    assert not rowsplan.available() and not rowsplan.enabled()
    assert rowsplan.build_plan([], t, rig._encoder(t)) is None


def test_plan_refuses_bad_entries() -> None:
    from binlake.source.mysql import _rowsc

    with pytest.raises(ValueError, match="invalid plan entry"):
        _rowsc.Plan([(rowsplan.OP_INT, 5, 0, 0, 1, True, False, None, None)])
    with pytest.raises(ValueError, match="256 entries"):
        _rowsc.Plan([(rowsplan.OP_STRING, 1, 0, 0, 1, True, False, None, [0] * 10)])
    plan = _rowsc.Plan([(rowsplan.OP_INT, 4, 0, 0, 1, True, False, None, None)])
    # A truncated body is declined, never read past its end.
    assert plan.decode(b"\x00\x01\x02", 0, 3, False, b"\x01", None) is None
    # null bitmap, then the INT little-endian: the Row the protobuf library writes
    assert plan.decode(b"\x00\x01\x02\x03\x04", 0, 5, False, b"\x01", None) == [_expected_int_row(1, 0x04030201)]
    # A bitmap naming no column: each row would read no byte, so the plan declines the
    # event (the Python path decides) instead of listing empty rows forever.
    assert plan.decode(b"\x00\x00", 0, 2, False, b"\x00", None) is None


def test_utf8_check_across_ascii_runs() -> None:
    """The decoder's UTF-8 check skips ASCII eight bytes at a time: a bad or good
    multi-byte sequence at every offset around those eight-byte steps is judged as
    Python's strict decoder judges it (declined, or the same Row)."""
    from binlake.proto import binlog_pb2
    from binlake.source.mysql import _rowsc

    plan = _rowsc.Plan([(rowsplan.OP_STRING, 1, 0, 0, 1, False, False, None, None)])
    for tail in (b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xc3", b"\xff", b"\xed\xa0\x80", b"\xc0\xaf"):
        for lead in range(20):
            for after in (b"", b"abcdefghij"):
                text = b"x" * lead + tail + after
                body = b"\x00" + bytes([len(text)]) + text
                got = plan.decode(body, 0, len(body), False, b"\x01", None)
                try:
                    value = text.decode("utf-8")
                except UnicodeDecodeError:
                    assert got is None, text
                    continue
                want = binlog_pb2.Row()
                want.columns.add(id=1, value=binlog_pb2.Datum(string_value=value))
                assert got == [want.SerializeToString()], text


def test_prewrite_value_native_equals_protobuf() -> None:
    """``_rowsc.prewrite_value`` (each row copied once) writes what the protobuf message
    with the same lists serializes to: zero and large schema versions and table ids,
    empty rows, rows longer than one varint byte of length, empty and long sequences."""
    rng = random.Random(18)

    def rows(n: int) -> list[bytes]:
        return [rng.randbytes(rng.choice([0, 1, 127, 128, 300])) for _ in range(rng.randrange(n))]

    for _ in range(200):
        muts = [(rng.choice([0, 1, 100, 2**33]), rows(4), rows(3), rows(3),
                 bytes(rng.randrange(3) for _ in range(rng.choice([0, 1, 200]))))
                for _ in range(rng.randrange(4))]
        sv = rng.choice([0, 1, 300, 2**40])
        assert prewrite.prewrite_value(sv, muts, True) == prewrite.prewrite_value(sv, muts, False)
    with pytest.raises(TypeError, match="list of bytes"):
        prewrite.prewrite_value(1, [(1, ["x"], [], [], b"")], True)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="past 127"):
        prewrite.prewrite_value(1, [(1, [b"x"], [], [], b"\x80")], True)


def _expected_int_row(cid: int, value: int) -> bytes:
    from binlake.proto import binlog_pb2

    row = binlog_pb2.Row()
    row.columns.add(id=cid, value=binlog_pb2.Datum(int_value=value))
    return row.SerializeToString()


def test_partial_column_bitmaps_read_missing_columns_as_null() -> None:
    """A column left out of the image's column bitmap (a row image other than FULL,
    which the source refuses at start, or a v2 event from such a server) reads as
    NULL, as mysql-replication reports it: NULL datum, '' for a NOT NULL SET, and
    the event declined where the column may not be NULL."""
    from binlake.proto import binlog_pb2
    from binlake.source.mysql import _rowsc

    def plan(nullable_b: bool) -> Any:
        return _rowsc.Plan([(rowsplan.OP_INT, 4, 0, 0, 1, True, False, None, None),
                            (rowsplan.OP_INT, 4, 0, 0, 2, nullable_b, False, None, None),
                            (rowsplan.OP_SET, 1, 0, 0, 3, False, True, [b"a", b"b"], None)])

    # columns 0 and 2 present: a null bitmap of 2 bits (none NULL), INT 7, SET mask 0b11
    body = b"\x00" + (7).to_bytes(4, "little") + b"\x03"
    want = binlog_pb2.Row()
    want.columns.add(id=1, value=binlog_pb2.Datum(int_value=7))
    want.columns.add(id=2, value=binlog_pb2.Datum(is_null=True))
    want.columns.add(id=3, value=binlog_pb2.Datum(string_value="a,b"))
    assert plan(True).decode(body, 0, len(body), False, b"\x05", None) == [want.SerializeToString()]
    assert plan(False).decode(body, 0, len(body), False, b"\x05", None) is None
    # only column 0 present: the NOT NULL SET reads as the empty set
    body = b"\x00" + (7).to_bytes(4, "little")
    want.columns[2].value.string_value = ""
    assert plan(True).decode(body, 0, len(body), False, b"\x01", None) == [want.SerializeToString()]
