"""``--start snapshot`` on a real MariaDB: the rows present before the source
starts arrive as insert transactions, DML during and after the snapshot
streams from the snapshot's position, and what the Pump serves replays to the
upstream's checksums; a kill -9 mid-snapshot, or a crash right after its
commit point, then a restart gives the same result with no row twice."""

from __future__ import annotations

import json
import pathlib
import threading

import pytest
from pumpkit import Processes, wait_until
from srckit import Cluster, Replay, SourceThread, journal_prewrites, sql

from binlake import failpoint
from binlake.proto import binlog_pb2
from binlake.source.journal import SourceState
from binlake.source.mysql.source import MySQLSource
from binlake.sql import checksum
from binlake.stack.localdb import LocalMariaDB

pytestmark = pytest.mark.skipif(not LocalMariaDB.available(), reason="MariaDB not installed (apt-get install "
                                "mariadb-server); CI always has it")

ROWS = 600


_n = 0


def fresh_db(mdb: LocalMariaDB) -> str:
    """A database whose tables hold rows before any source starts."""
    global _n
    _n += 1
    db = f"snap{_n}"
    sql(mdb, f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.acc (id INT PRIMARY KEY, bal BIGINT, note VARCHAR(40) CHARACTER SET latin1, "
        "e ENUM('a','b'), s SET('x','y'), bt BIT(5), ts TIMESTAMP(3) NULL)",
        f"CREATE TABLE {db}.empty (id INT PRIMARY KEY)",
        f"INSERT INTO {db}.acc VALUES " + ", ".join(
            f"({i}, {i * 10}, 'café {i}', 'b', 'x,y', b'101', '2024-05-01 10:00:0{i % 10}.5')" for i in range(1, ROWS + 1)))
    return db


def source(mdb: LocalMariaDB, cluster: Cluster, data: pathlib.Path, db: str) -> MySQLSource:
    return MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=3000 + _n, registry=cluster.registry.addr,
                       data_dir=str(data), tables=f"{db}.*", start="snapshot", snapshot_batch_rows=50)


def dml(mdb: LocalMariaDB, db: str, i: int) -> None:
    sql(mdb, "BEGIN", f"UPDATE acc SET bal = bal + 1 WHERE id = {i}", f"DELETE FROM acc WHERE id = {ROWS - i}",
        f"INSERT INTO acc VALUES ({ROWS + i}, 1, 'new', 'a', '', b'0', NULL)", "COMMIT", db=db)


def checkpoint(data: pathlib.Path) -> tuple[str, int]:
    try:
        pos = json.loads((data / "state.json").read_text()).get("position") or ["", 0]
    except (OSError, ValueError):
        return "", 0
    return str(pos[0]), int(pos[1])


def at_end(mdb: LocalMariaDB, data: pathlib.Path) -> bool:
    end = sql(mdb, "SHOW MASTER STATUS")[0]
    return checkpoint(data) >= (end[0], int(end[1]))


def verify(mdb: LocalMariaDB, cluster: Cluster, db: str, txns: int | None, batch: int = 50) -> None:
    """TXNS: the row transactions expected (snapshot batches + streamed), when known."""
    binlogs = cluster.binlogs()
    ddls = [b for b in binlogs if b.ddl_query]
    markers = [b for b in ddls if not b.ddl_table.snapshot_pending]
    assert len(markers) == 2, "one 'snapshot complete' marker per table"
    live = {b.ddl_table.table_id for b in markers}
    first = {b.ddl_table.table_id: b.commit_ts for b in ddls if b.ddl_table.snapshot_pending}
    assert set(first) >= live, "each table defined pending first"
    # The rows of the completed attempt's tables (an unfinished attempt's are under retired ids).
    dml_binlogs = [b for b in binlogs if not b.ddl_query and all(
        m.table_id in live for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations)]
    done_ts = max(b.commit_ts for b in markers)
    assert all(first[m.table_id] < b.commit_ts for b in dml_binlogs
               for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations), "rows after their definition"
    assert len({b.start_ts for b in dml_binlogs}) == len(dml_binlogs)
    if txns is not None:
        assert len(dml_binlogs) == txns, "each transaction exactly once"
    else:  # DML raced the snapshot: some in it, the rest streamed
        assert len(dml_binlogs) >= -(-ROWS // batch)
    assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)
    assert len([b for b in dml_binlogs if b.commit_ts < done_ts]) == -(-ROWS // batch), "the snapshot's parts"
    replay = Replay().apply(binlogs)  # asserts no insert of an existing key
    assert replay.checksums() == checksum.checksum(mdb.url_for(db), schema=replay.schema())


def test_snapshot_then_stream(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    data = tmp_path / "src"
    src = SourceThread(source(mdb, cluster, data, db))
    done = threading.Event()
    count = [0]

    def writer() -> None:  # DML while the snapshot is read, and after it
        for i in range(1, 40):
            dml(mdb, db, i)
            count[0] = i
        done.set()

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    src.start()
    try:
        assert src.source.ready.wait(60)
        th.join(60)
        wait_until(lambda: at_end(mdb, data), timeout=60, what="source caught up")
    finally:
        src.stop()
    assert done.is_set()
    verify(mdb, cluster, db, None)
    assert "snapshot" not in json.loads((data / "state.json").read_text())


def test_every_column_type_from_the_snapshot(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """Snapshot rows (read by SELECT) encode exactly as binlog rows do: the same checksums."""
    from test_mysql_source import ALL_TYPES, ALL_VALUES

    global _n
    _n += 1
    db = f"snap{_n}"
    sql(mdb, f"CREATE DATABASE {db}")
    sql(mdb, ALL_TYPES, *[f"INSERT INTO alltypes VALUES {v}" for v in ALL_VALUES], db=db)
    src = SourceThread(source(mdb, cluster, tmp_path / "src", db)).start()
    try:
        assert src.source.ready.wait(60)
        sql(mdb, "UPDATE alltypes SET st = '', vc = 'changed' WHERE id = 1", db=db)  # before image from the binlog
        wait_until(lambda: at_end(mdb, tmp_path / "src"), timeout=60, what="source caught up")
    finally:
        src.stop()
    replay = Replay().apply(cluster.binlogs())
    assert replay.checksums() == checksum.checksum(mdb.url_for(db), schema=replay.schema())
    info, rows = replay.table("alltypes")
    row1 = next(r for r in rows if r["id"] == 1)
    assert row1["bu"] == 2**64 - 1 and row1["bn"] == b"\x01\x02\x00\x00" and row1["st"] == ""
    assert row1["l1"] == "café" and row1["bt"] == (0b1010101010).to_bytes(2, "big") and row1["f"] == 1.5


def test_kill9_during_snapshot_then_restart(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    data = tmp_path / "src"
    procs = Processes(tmp_path / "procs")
    args = ["source", "mysql", "--dsn", f"mysql://root@127.0.0.1:{mdb.port}", "--server-id", str(3500 + _n),
            "--registry", cluster.registry.addr, "--data-dir", str(data), "--tables", f"{db}.*",
            "--start", "snapshot", "--snapshot-batch-rows", "5"]
    try:
        svc = procs._spawn("source", args, None)

        wait_until(lambda: journal_prewrites(svc, data) >= 8, timeout=60, interval=0.02, what="snapshot half way")
        svc.kill()
        assert checkpoint(data) == ("", 0), "killed before the snapshot's commit point"
        for i in range(1, 6):
            dml(mdb, db, i)
        svc = procs._spawn("source", args, None)
        wait_until(lambda: at_end(mdb, data), timeout=90, what="restarted source caught up")
        # The killed run's prewrites without a commit were rolled back on the Pump by
        # the restarted source as it started (not left for the Pump to ask the source
        # about after its txn timeout, which a stopped source cannot answer).
        assert cluster.pump.storage.pending_count == 0
        assert svc.terminate() == 0
    finally:
        procs.cleanup()
    # The DML between the kill and the restart is in the second snapshot (the first one was rolled back).
    verify(mdb, cluster, db, -(-ROWS // 5), batch=5)


def test_crash_after_the_commit_point_resumes(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    db = fresh_db(mdb)
    data = tmp_path / "src"
    # The markers' group commit: after the 2 definitions' and the row parts' own commits.
    monkeypatch.setenv(failpoint.ENV, f"source-before-commit:raise:{2 + -(-ROWS // 50) + 1}")
    src = SourceThread(source(mdb, cluster, data, db)).start()
    src.thread.join(60)
    assert isinstance(src.error, failpoint.FailpointError)
    monkeypatch.delenv(failpoint.ENV)
    st = SourceState(data)  # decided in the journal, marker present, no position yet
    marker = st.state["snapshot"]
    assert "position" not in st.state and all(st.decision(k) is not None for k, _s, _p in marker["keys"])
    st.close()
    for i in range(1, 4):
        dml(mdb, db, i)
    src = SourceThread(source(mdb, cluster, data, db)).start()
    try:
        wait_until(lambda: at_end(mdb, data), timeout=60, what="source caught up")
    finally:
        src.stop()
    verify(mdb, cluster, db, -(-ROWS // 50) + 3)
