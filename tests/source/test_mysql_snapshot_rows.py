"""The native encoder of the initial snapshot's rows (``source.mysql._snaprowc``)
against the Python path, on rows a real MariaDB stores and sends.

The contract (stated in ``_snaprowc.c``): for every batch of the SELECT's row
packets the encoder answers, its serialized Rows are byte for byte what
PyMySQL's parser + ``snapshot.as_binlog_value`` + ``RowEncoder`` give for the
same rows; for anything it does not reproduce it declines and the batch takes
the Python path, which gives the value or raises the error it always raised.
Hypothesis generates rows of every covered type; each batch is encoded three
ways: natively, by the Python path over the same packets (the fallback), and by
the old row path (``snapshot.batches``), which the fallback must equal.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from srckit import sql
from test_mysql_native_rows import ROW_VALUES

from binlake import errors
from binlake.source.mysql import snapshot
from binlake.source.mysql.source import _encode_part, load_catalog
from binlake.source.mysql.tables import TableFilter
from binlake.source.mysql.values import RowEncoder
from binlake.source.tables import SourceTable, assign_ids
from binlake.stack.localdb import LocalMariaDB

_needs_server = pytest.mark.skipif(not LocalMariaDB.available(),
                                   reason="MariaDB not installed (apt-get install mariadb-server)")
_needs_ext = pytest.mark.skipif(not snapshot.native_available(),
                                reason=f"_snaprowc not built: {snapshot.native_import_error()}")
pytestmark = [_needs_server, _needs_ext]

DB = "snaprows"
# Every type the encoder covers, nullable and NOT NULL (the native row tests' table
# without the types it leaves to Python: SET, BIT, TIME, a latin1 column).
COVERED = """CREATE TABLE covered (
  id INT NOT NULL PRIMARY KEY,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  i INT NOT NULL, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, b BOOL,
  d DECIMAL(65,30), d2 DECIMAL(10,2) UNSIGNED, d3 DECIMAL(5,0), d4 DECIMAL(20,12), d5 DECIMAL(9,9),
  f FLOAT, db DOUBLE NOT NULL,
  c CHAR(5), vc VARCHAR(300), tx TEXT, a1 CHAR(3) CHARACTER SET ascii,
  bn BINARY(4), vb VARBINARY(20), bl BLOB,
  dt DATE, dtm DATETIME(6), dt0 DATETIME, ts TIMESTAMP(3) NULL, yr YEAR,
  e ENUM('red','green','blue')
) CHARACTER SET utf8mb4"""
COLUMNS = ("ti", "tu", "si", "su", "mi", "mu", "i", "iu", "bi", "bu", "b", "d", "d2", "d3", "d4", "d5", "f", "db",
           "c", "vc", "tx", "a1", "bn", "vb", "bl", "dt", "dtm", "dt0", "ts", "yr", "e")
LEFT_TO_PYTHON = {"st": "SET('a','b')", "bt": "BIT(3)", "tm": "TIME", "l1": "VARCHAR(4) CHARACTER SET latin1",
                  "j": "JSON"}
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def server(mdb: LocalMariaDB) -> LocalMariaDB:
    sql(mdb, f"CREATE DATABASE IF NOT EXISTS {DB}")
    sql(mdb, COVERED, *[f"CREATE TABLE odd_{c} (id INT PRIMARY KEY, v {t})" for c, t in LEFT_TO_PYTHON.items()],
        db=DB)
    return mdb


def _connect(server: LocalMariaDB) -> Any:
    return pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=DB,
                           autocommit=True)


def _table(server: LocalMariaDB, name: str) -> SourceTable:
    conn = _connect(server)
    try:
        t = load_catalog(conn, TableFilter(f"{DB}.{name}")).tables[f"{DB}.{name}"]
    finally:
        conn.close()
    assign_ids(t, None, 100, 1)
    return t


def _snapshot_conn(server: LocalMariaDB) -> Any:
    """A connection set up as ``open_snapshot`` and ``raw_results`` leave the snapshot's."""
    conn = _connect(server)
    with conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
    snapshot.raw_results(conn)
    return conn


def three_ways(server: LocalMariaDB, t: SourceTable, rows: int) -> Iterator[tuple[list[bytes] | None, Any, Any]]:
    """Per batch of ``rows``: (native rows or None, the fallback's rows, the old path's
    rows), each path's rows a list of bytes or the FailedPrecondition it raised."""
    enc = RowEncoder(t, t.to_info())
    plan = snapshot.text_plan(t, enc)
    assert plan is not None

    def python(batch: list[dict[str, Any]]) -> Any:
        try:
            return _encode_part(t, enc, batch)
        except errors.FailedPrecondition as exc:
            return exc

    conn, old = _snapshot_conn(server), _snapshot_conn(server)
    try:
        olds = snapshot.batches(old, t, rows)
        for raw in snapshot.raw_batches(conn, t, rows):
            yield plan.rows(snapshot.payloads(raw)), python(snapshot.packets_rows(raw, t)), python(next(olds))
        assert next(olds, None) is None, "both reads hold the same rows"
    finally:
        conn.close()
        old.close()


def _exponent_form(row: dict[str, Any]) -> bool:
    """A DECIMAL Python prints in exponent form (0E-12): the encoder leaves those to Python."""
    return any(isinstance(v, decimal.Decimal) and "E" in str(v) for v in row.values())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(st.fixed_dictionaries({c: ROW_VALUES[c] for c in COLUMNS}), min_size=1, max_size=9))
def test_snapshot_rows_native_equal_the_python_path(server: LocalMariaDB, rows: list[dict[str, Any]]) -> None:
    sql(server, "DELETE FROM covered", db=DB)
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=DB)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00', sql_mode = 'NO_ENGINE_SUBSTITUTION'")
            cur.executemany(f"INSERT INTO covered (id, {', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * (len(COLUMNS) + 1))})",
                            [[next(_ids), *(r[c] for c in COLUMNS)] for r in rows])
        conn.commit()
    finally:
        conn.close()
    t = _table(server, "covered")
    answered = 0
    for native, fallback, old in three_ways(server, t, 3):
        assert not isinstance(old, Exception), f"a generated row the Python path refuses: {old}"
        assert fallback == old, "the fallback over the packets is the old path"
        if native is not None:
            assert native == old
            answered += 1
    conn = _snapshot_conn(server)
    try:
        stored = [r for b in snapshot.batches(conn, t, 100) for r in b]
    finally:
        conn.close()
    if not any(_exponent_form(r) for r in stored):
        assert answered == -(-len(rows) // 3), "the encoder declined a batch of canonical rows"


def test_edge_values_encode_natively_and_refused_ones_decline(server: LocalMariaDB) -> None:
    sql(server, "DELETE FROM covered", db=DB)
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", charset="utf8mb4", database=DB)
    extremes = {"ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608, "mu": 16777215, "i": -2147483648,
                "iu": 4294967295, "bi": -(2**63), "bu": 2**64 - 1, "b": True,
                "d": decimal.Decimal("-" + "9" * 35 + "." + "9" * 30), "d2": decimal.Decimal("0.00"),
                "d3": decimal.Decimal(0), "d4": decimal.Decimal("123.000000000001"), "d5": decimal.Decimal("-0.5"),
                "f": 3.4028234e38, "db": -0.0, "c": "", "vc": "x" * 300, "tx": "naïve 😀\t\n\\", "a1": "abc",
                "bn": b"\x00", "vb": b"", "bl": b"\x00\xff" * 100, "dt": dt.date(9999, 12, 31),
                "dtm": dt.datetime(1000, 1, 1, 0, 0, 0, 1), "dt0": dt.datetime(2024, 2, 29, 23, 59, 59),
                "ts": dt.datetime(2038, 1, 19, 3, 14, 7, 999000), "yr": 2155, "e": "blue"}
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00', sql_mode = 'NO_ENGINE_SUBSTITUTION'")
            cur.execute(f"INSERT INTO covered (id, {', '.join(extremes)}) VALUES (1, {', '.join(['%s'] * len(extremes))})",
                        list(extremes.values()))
            cur.execute("INSERT INTO covered (id, i, db, f, e, bn) VALUES (2, 0, 1e308, 1.1, '', 'ab')")
            cur.execute("INSERT INTO covered (id, i, db, d5) VALUES (3, 0, 0, 0.000000001)")  # Python: 1E-9
            cur.execute("INSERT INTO covered (id, i, db, dt) VALUES (4, 0, 0, '0000-00-00')")  # zero date: refused
        conn.commit()
    finally:
        conn.close()
    t = _table(server, "covered")
    got = list(three_ways(server, t, 2))
    assert len(got) == 2
    (native1, fallback1, old1), (native2, fallback2, old2) = got
    assert native1 is not None and native1 == old1 == fallback1
    assert native2 is None, "an exponent-form DECIMAL and a zero date: the Python path decides"
    assert isinstance(old2, errors.FailedPrecondition) and str(old2) == str(fallback2)
    # the same batch without the zero date: Python's own text for the DECIMAL, one batch declined
    sql(server, "DELETE FROM covered WHERE id = 4", db=DB)
    (_n1, _f1, _o1), (native2, fallback2, old2) = list(three_ways(server, t, 2))
    assert native2 is None and fallback2 == old2 and not isinstance(old2, Exception)


@pytest.mark.parametrize("column", sorted(LEFT_TO_PYTHON))
def test_types_left_to_python_get_no_plan(server: LocalMariaDB, column: str) -> None:
    t = _table(server, f"odd_{column}")
    assert snapshot.text_plan(t, RowEncoder(t, t.to_info())) is None
