"""The MariaDB row-binlog source against a real MariaDB (log-bin, ROW, FULL
images) and a real registry + Pump on loopback: what the Pump serves, replayed
from the binlogs alone, equals the upstream tables (binlake.oracle checksums)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from srckit import Cluster, Replay, SourceThread, sql, start_cluster

from binlake import errors, oracle
from binlake.devdb import LocalMariaDB
from binlake.source.mysql.source import MySQLSource

pytestmark = pytest.mark.skipif(not LocalMariaDB.available(), reason="MariaDB not installed (apt-get install "
                                "mariadb-server); CI always has it")


@pytest.fixture(scope="module")
def mdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    server = LocalMariaDB(tmp_path_factory.mktemp("mdb-binlog"), binlog=True, server_id=1).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    reg, pump = start_cluster(tmp_path)
    try:
        yield Cluster(reg, pump)
    finally:
        pump.stop(grace=0.5)
        reg.stop(grace=0.5)


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
    up = oracle.checksum(mdb.url_for(db), schema=replay.schema())
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


def test_statement_format_refused(tmp_path: pathlib.Path, cluster: Cluster) -> None:
    server = LocalMariaDB(tmp_path / "stmt", binlog=True, binlog_format="STATEMENT").start()
    try:
        src = MySQLSource(f"mysql://root@127.0.0.1:{server.port}", server_id=77, registry=cluster.registry.addr,
                          data_dir=str(tmp_path / "src"))
        with pytest.raises(errors.FailedPrecondition, match="binlog_format=ROW"):
            src.run()
    finally:
        server.stop()
