"""The MariaDB row-binlog source against a real MariaDB (log-bin, ROW, FULL
images) and a real registry + Pump on loopback: what the Pump serves, replayed
from the binlogs alone, equals the upstream tables (binlake.sql.checksum checksums)."""

from __future__ import annotations

import pathlib

import pytest
from srckit import Cluster, Replay, SourceThread, sql

from binlake import errors
from binlake.source.mysql.source import MySQLSource
from binlake.sql import checksum
from binlake.stack.localdb import LocalMariaDB

pytestmark = pytest.mark.skipif(not LocalMariaDB.available(), reason="MariaDB not installed (apt-get install "
                                "mariadb-server); CI always has it")


_n = 0


def fresh_db(mdb: LocalMariaDB) -> str:
    global _n
    _n += 1
    name = f"app{_n}"
    sql(mdb, f"CREATE DATABASE {name}")
    return name


def source(mdb: LocalMariaDB, cluster: Cluster, data_dir: pathlib.Path, db: str, **kw: object) -> MySQLSource:
    return MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=1000 + _n, registry=cluster.registry.addr,
                       data_dir=str(data_dir), tables=f"{db}.*", **kw)  # type: ignore[arg-type]


def wait_caught_up(mdb: LocalMariaDB, src: MySQLSource, timeout: float = 60) -> None:
    from pumpkit import wait_until

    target = sql(mdb, "SHOW MASTER STATUS")[0]
    wait_until(lambda: (src.file, src.pos) >= (target[0], int(target[1])), timeout=timeout,
               what=f"source at {target[0]}:{target[1]}")


def check_equal(mdb: LocalMariaDB, cluster: Cluster, db: str) -> Replay:
    replay = Replay().apply(cluster.binlogs())
    up = checksum.checksum(mdb.url_for(db), schema=replay.schema())
    assert replay.checksums() == up
    return replay


ALL_TYPES = """CREATE TABLE alltypes (
  id INT NOT NULL PRIMARY KEY,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, b BOOL,
  d DECIMAL(65,30), d2 DECIMAL(10,2) UNSIGNED, f FLOAT, db DOUBLE,
  c CHAR(5), vc VARCHAR(300), tx TEXT, lt LONGTEXT, l1 VARCHAR(20) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(20), bl BLOB, mb MEDIUMBLOB,
  dt DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(2), yr YEAR,
  j JSON, e ENUM('red','green','blue'), st SET('a','b','c'), bt BIT(10), b1 BIT(1)
) CHARACTER SET utf8mb4"""

ALL_VALUES = [
    "(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808, "
    "18446744073709551615, 1, '-12345678901234567890123456789012345.123456789012345678901234567890', 99999999.99, "
    "1.5, 1.7976931348623157e308, 'ab', 'ünïcödé 🎉', 'text', REPEAT('x', 70000), 'café', x'0102', x'00ff00', "
    "x'deadbeef00', x'', '1000-01-01', '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07.999', '23:59:59.99', "
    "2155, '{\"a\": [1, 2.5, null, \"x\"], \"b\": {\"c\": true}}', 'green', 'a,c', b'1010101010', b'1')",
    "(2, " + ", ".join(["NULL"] * 34) + ")",
    "(3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.25, 0, '', '', '', '', '', x'00000000', x'', x'', x'', "
    "'1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:01', '00:00:00', 1901, '[]', 'red', '', b'0', b'0')",
]


def start_source(mdb: LocalMariaDB, cluster: Cluster, data_dir: pathlib.Path, db: str) -> SourceThread:
    src = SourceThread(source(mdb, cluster, data_dir, db)).start()
    assert src.source.ready.wait(60), "source did not start"
    return src


def test_every_column_type_round_trips(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    sql(mdb, ALL_TYPES, db=db)  # defined before the source starts: read from the server at start
    src = start_source(mdb, cluster, tmp_path / "src", db)
    try:
        sql(mdb, *[f"INSERT INTO alltypes VALUES {v}" for v in ALL_VALUES],
            "UPDATE alltypes SET f = 2.25, st = 'b', e = 'blue', j = '\"s\"', vc = 'changed' WHERE id = 3",
            "UPDATE alltypes SET id = 4 WHERE id = 1", "DELETE FROM alltypes WHERE id = 2",
            f"INSERT INTO alltypes VALUES {ALL_VALUES[1]}", db=db)
        wait_caught_up(mdb, src.source)
    finally:
        src.stop()
    replay = check_equal(mdb, cluster, db)
    info, rows = replay.table("alltypes")
    assert sorted(r["id"] for r in rows) == [2, 3, 4]
    assert replay.changes == 7
    row4 = next(r for r in rows if r["id"] == 4)
    assert row4["bu"] == 2**64 - 1 and row4["bn"] == b"\x01\x02\x00\x00" and row4["st"] == "a,c"
    assert row4["l1"] == "café" and row4["bt"] == (0b1010101010).to_bytes(2, "big") and row4["f"] == 1.5


@pytest.mark.parametrize("setting,value,message", [
    ("binlog_format", "STATEMENT", "set binlog_format=ROW"),
    ("binlog_format", "MIXED", "set binlog_format=ROW"),
    ("binlog_row_image", "MINIMAL", "set binlog_row_image=FULL"),
])
def test_unusable_binlog_settings_refused(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                                          setting: str, value: str, message: str) -> None:
    old = sql(mdb, f"SELECT @@GLOBAL.{setting}")[0][0]
    sql(mdb, f"SET GLOBAL {setting} = '{value}'")
    try:
        src = source(mdb, cluster, tmp_path / "src", "x")
        with pytest.raises(errors.FailedPrecondition, match=message):
            src.run()
    finally:
        sql(mdb, f"SET GLOBAL {setting} = '{old}'")


def test_ddl_in_the_middle_of_dml(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    sql(mdb, "CREATE TABLE t1 (id INT PRIMARY KEY, a VARCHAR(10), b INT)", db=db)
    src = start_source(mdb, cluster, tmp_path / "src", db)
    try:
        sql(mdb,
            "INSERT INTO t1 VALUES (1, 'x', 1)",
            "INSERT INTO t1 VALUES (2, 'y', 2), (3, 'z', 3)",
            "ALTER TABLE t1 ADD COLUMN c DECIMAL(12,3) AFTER a, ADD COLUMN d JSON",
            "UPDATE t1 SET c = 1.5, d = '{\"k\": 1}' WHERE id >= 2",
            "BEGIN", "INSERT INTO t1 (id, a, b, c) VALUES (4, 'w', 4, 2.25)", "SAVEPOINT s1",
            "INSERT INTO t1 (id, a) VALUES (10, 'undone')", "ROLLBACK TO SAVEPOINT s1", "DELETE FROM t1 WHERE id = 3",
            "COMMIT",
            "ALTER TABLE t1 CHANGE COLUMN a name VARCHAR(40) NOT NULL DEFAULT ''",
            "ALTER TABLE t1 DROP COLUMN b",
            "UPDATE t1 SET name = 'renamed' WHERE id = 2",
            "ALTER TABLE t1 ADD COLUMN b BIGINT UNSIGNED",  # a new column with a dropped column's name: new id
            "UPDATE t1 SET b = 18446744073709551615 WHERE id = 4",
            "CREATE TABLE t2 (k VARCHAR(16) NOT NULL, v BLOB, n INT, PRIMARY KEY (k), UNIQUE KEY uk_n (n))",
            "INSERT INTO t2 VALUES ('a', x'00', 1), ('b', NULL, 2)",
            "RENAME TABLE t2 TO t3",
            "UPDATE t3 SET v = x'ff' WHERE k = 'b'",
            "ALTER TABLE t3 MODIFY v MEDIUMBLOB, DROP INDEX uk_n",
            "CREATE UNIQUE INDEX uk_name ON t1 (name)",
            "CREATE TABLE gone (id INT PRIMARY KEY)", "INSERT INTO gone VALUES (1)", "DROP TABLE gone",
            "CREATE TABLE tr (id INT PRIMARY KEY, v INT)", "INSERT INTO tr VALUES (1, 1), (2, 2)",
            "TRUNCATE TABLE tr", "INSERT INTO tr VALUES (3, 3)",
            "CREATE TABLE other_db_style (id INT PRIMARY KEY)",
            f"INSERT INTO {db}.other_db_style VALUES (7)",
            db=db)
        wait_caught_up(mdb, src.source)
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    replay = Replay().apply(binlogs)
    up = checksum.checksum(mdb.url_for(db), schema=replay.schema())
    got = replay.checksums()
    assert got == up
    assert sorted(got) == ["other_db_style", "t1", "t3", "tr"]
    # One DDL binlog per table at start plus one per DDL on a tracked table; versions strictly increase.
    versions = [b.ddl_table.schema_version for b in binlogs if b.ddl_query]
    assert versions == sorted(versions) and len(set(versions)) == len(versions) == 14
    t1 = replay.table("t1")[0]
    ids = {c.name: c.id for c in t1.columns}
    assert ids["name"] == 2 and ids["b"] == 6 and ids["c"] == 4  # renamed keeps its id; re-added gets a new one
    assert [k.name for k in t1.unique_keys] == ["uk_name"]
    tr = [b.ddl_table for b in binlogs if b.ddl_query and b.ddl_table.name == "tr"]
    assert tr[-1].previous_table_id == tr[0].table_id != tr[-1].table_id  # TRUNCATE: a new table id


def test_dm_causality_case_as_plain_sql(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """DM's causality example: transactions whose primary and unique keys swap
    between rows must reach the Pump in commit order, each change in statement order."""
    db = fresh_db(mdb)
    sql(mdb, "CREATE TABLE t (id INT PRIMARY KEY, uk INT NOT NULL, v VARCHAR(10), UNIQUE KEY u (uk))",
        "INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b')", db=db)
    src = start_source(mdb, cluster, tmp_path / "src", db)
    try:
        sql(mdb,
            "BEGIN", "UPDATE t SET uk = 3 WHERE id = 1", "UPDATE t SET uk = 1 WHERE id = 2",
            "UPDATE t SET uk = 2 WHERE id = 1", "COMMIT",
            "BEGIN", "UPDATE t SET id = 3 WHERE id = 1", "INSERT INTO t VALUES (1, 4, 'c')",
            "DELETE FROM t WHERE id = 2", "UPDATE t SET id = 2, uk = 5 WHERE id = 3", "COMMIT",
            "INSERT INTO t VALUES (5, 6, 'd')", "UPDATE t SET uk = 7 WHERE id = 5", db=db)
        wait_caught_up(mdb, src.source)
    finally:
        src.stop()
    binlogs = [b for b in cluster.binlogs() if not b.ddl_query]
    from binlake.proto import binlog_pb2

    seqs = [list(binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations[0].sequence) for b in binlogs]
    assert seqs == [[1, 1, 1], [1, 0, 2, 1], [0], [1]]
    assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)
    # The two rows the source never saw inserted are not in the replay; compare what it did see.
    replay = Replay()
    replay.apply([b for b in cluster.binlogs() if b.ddl_query])
    info, _ = replay.table("t")
    tid = info.table_id
    replay.rows[tid] = {(1,): {"id": 1, "uk": 1, "v": "a"}, (2,): {"id": 2, "uk": 2, "v": "b"}}
    replay.apply(binlogs)
    assert replay.checksums() == checksum.checksum(mdb.url_for(db), schema=replay.schema())


@pytest.mark.slow
def test_large_transaction(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """100k row changes in one upstream transaction: one prewrite, one commit."""
    db = fresh_db(mdb)
    sql(mdb, "CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(32), n BIGINT)", db=db)
    src = start_source(mdb, cluster, tmp_path / "src", db)
    try:
        sql(mdb, "INSERT INTO big SELECT seq, CONCAT('row-', seq), seq * 7 FROM seq_1_to_100000", db=db)
        wait_caught_up(mdb, src.source, timeout=240)
    finally:
        src.stop()
    binlogs = [b for b in cluster.binlogs() if not b.ddl_query]
    assert len(binlogs) == 1
    replay = check_equal(mdb, cluster, db)
    assert replay.changes == 100_000


def test_start_at_a_gtid(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """--start gtid:SET (MariaDB's domain-server-seq): streams from just after that GTID and
    checkpoints file:pos from then on."""
    db = fresh_db(mdb)
    sql(mdb, "CREATE TABLE g (id INT PRIMARY KEY)", "INSERT INTO g VALUES (1)", db=db)  # before the GTID: not sent
    gtid = sql(mdb, "SELECT @@gtid_binlog_pos")[0][0]
    sql(mdb, "INSERT INTO g VALUES (2)", "INSERT INTO g VALUES (3)", db=db)
    src = SourceThread(source(mdb, cluster, tmp_path / "src", db, start=f"gtid:{gtid}")).start()
    assert src.source.ready.wait(60)
    try:
        sql(mdb, "INSERT INTO g VALUES (4)", db=db)
        wait_caught_up(mdb, src.source)
    finally:
        src.stop()
    replay = Replay().apply(cluster.binlogs())
    assert sorted(r["id"] for r in replay.table("g")[1]) == [2, 3, 4]
    assert src.source.file.startswith("binlog.")
