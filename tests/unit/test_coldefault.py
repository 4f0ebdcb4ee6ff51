"""Column DEFAULTs in table definitions: what each writer records, what rows that
predate an added column read (``restore.fills``), and the SQL a target gets."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
import sqlalchemy as sa

from binlake import codec, coldefault, errors
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.proto import binlog_pb2
from binlake.restore import fills
from binlake.source.mysql.tables import Catalog, TableFilter
from binlake.source.tables import assign_ids
from binlake.sql import dialect as dl
from binlake.sql import schema as sc

EACH = [("int", 7, {}), ("uint", 2**64 - 1, {}), ("float", -2.5, {}),
        ("decimal", decimal.Decimal("1.50"), {"precision": 10, "scale": 2}), ("string", "it's \\ ü", {}),
        ("bytes", b"\x00\xff", {}), ("date", dt.date(2024, 2, 29), {}),
        ("datetime", dt.datetime(2024, 1, 2, 3, 4, 5, 6), {}), ("time", dt.time(23, 59, 58, 1), {}),
        ("bool", True, {}), ("json", {"a": [1, "x"]}, {})]


def _base() -> binlog_pb2.TableInfo:
    return sc.new_table(100, "db", "t", [sc.ColumnDef("id", "int", False)], ["id"], None, 1)


@pytest.mark.parametrize("kind, value, extra", EACH)
def test_a_constant_of_each_type_round_trips_and_fills(kind: str, value: object, extra: dict[str, int]) -> None:
    col = sc.ColumnDef("c", kind, False, default=value, **extra)  # type: ignore[arg-type]
    info = sc.add_column(_base(), col, 2)
    ci = info.columns[-1]
    assert sc.column_def(ci) == col
    fill = coldefault.fill(ci)
    assert fill is not None and codec.decode_value(fill, ci.type) == value
    # Old definitions (no field) read as "no default".
    old = binlog_pb2.ColumnInfo.FromString(binlog_pb2.ColumnInfo(id=2, name="c", type=ci.type).SerializeToString())
    assert not coldefault.has_default(old) and coldefault.fill(old) is None


def test_add_column_rules_and_set_default() -> None:
    with pytest.raises(errors.InvalidArgument, match="needs a constant default"):
        sc.add_column(_base(), sc.ColumnDef("n", "int", False), 2)
    with pytest.raises(errors.InvalidArgument, match="is not a int"):
        sc.add_column(_base(), sc.ColumnDef("n", "int", True, default="x"), 2)
    info = sc.add_column(_base(), sc.ColumnDef("n", "int", False, default=7), 2)
    later = sc.set_default(info, "n", 9, 3)
    assert later.columns[-1].default_value.value.int_value == 9
    dropped = sc.set_default(later, "n", None, 4)
    assert not coldefault.has_default(dropped.columns[-1])
    # The rows before the column read the default of the definition that added it, not a later one.
    history = SchemaHistory()
    for ts, i in ((10, _base()), (20, info), (30, later), (40, dropped)):
        history.add(ts, i)
    got = fills.version_fills(history, 100)
    assert list(got[1]) == [2] and codec.decode_value(got[1][2].value) == 7
    assert got[2] == got[3] == got[4] == {}
    assert list(fills.base_fills(history, 100, 15)) == [2] and fills.base_fills(history, 100, 25) == {}


@pytest.mark.parametrize("url", ["sqlite://"])
def test_target_sql_keeps_each_constant(url: str) -> None:
    # SQLite stores what each DEFAULT gives exactly as binlake's own inserts do.
    engine = sa.create_engine(url)
    info = _base()
    for i, (kind, value, extra) in enumerate(EACH):
        info = sc.add_column(info, sc.ColumnDef(f"c{i}", kind, False, default=value, **extra), i + 2)  # type: ignore[arg-type]
    with engine.begin() as conn:
        for stmt in dl.create_table_sql(engine, info):
            conn.exec_driver_sql(stmt)
        conn.exec_driver_sql("INSERT INTO t (id) VALUES (1)")
        row = conn.execute(sa.select(dl.sa_table(info, "sqlite"))).one()
    assert list(row)[1:] == [v for _k, v, _e in EACH]
    assert dl.default_sql(sc.ColumnDef("at", "datetime", default_expr="now()"), "mysql") == "CURRENT_TIMESTAMP(6)"
    assert dl.default_sql(sc.ColumnDef("i", "int", default_expr="nextval('s'::regclass)"), "postgresql") is None


def test_mysql_ddl_defaults() -> None:
    cat = Catalog()
    f = TableFilter(None)
    ch = cat.apply("CREATE TABLE t (id INT PRIMARY KEY, n INT NOT NULL DEFAULT -3, s VARCHAR(9) DEFAULT 'a''b', "
                   "b VARBINARY(4) DEFAULT 0x00ff, z DATE DEFAULT '0000-00-00', at TIMESTAMP NOT NULL DEFAULT "
                   "current_timestamp() ON UPDATE current_timestamp(), ok BOOL DEFAULT TRUE, x INT DEFAULT NULL)",
                   "db", f)[0]
    assert ch.after is not None
    assign_ids(ch.after, None, 100, 1)
    cat.put(ch.after)
    cols = {c.name: c for c in ch.after.to_info().columns}
    assert cols["n"].default_value.value.int_value == -3 and cols["s"].default_value.value.string_value == "a'b"
    assert cols["b"].default_value.value.bytes_value == b"\x00\xff" and cols["ok"].default_value.value.int_value == 1
    assert cols["z"].default_value.expr == "'0000-00-00'"  # no such date in binlake: kept as text, fills NULL
    assert coldefault.is_now(cols["at"].default_value.expr) and not coldefault.has_default(cols["x"])
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    ch2 = cat.apply("ALTER TABLE t ADD COLUMN k INT NOT NULL, ADD COLUMN c DATETIME DEFAULT CURRENT_TIMESTAMP, "
                    "ALTER COLUMN n SET DEFAULT 9, ALTER COLUMN s DROP DEFAULT", "db", f, when)[0]
    assert ch2.after is not None
    assign_ids(ch2.after, ch2.before, 100, 2)
    cols = {c.name: c for c in ch2.after.to_info().columns}
    assert cols["k"].existing_value.int_value == 0 and not coldefault.has_default(cols["k"])  # implicit default
    assert codec.decode_value(cols["c"].existing_value) == when
    assert cols["n"].default_value.value.int_value == 9 and not coldefault.has_default(cols["s"])
