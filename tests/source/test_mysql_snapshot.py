"""``--start snapshot`` on a real MariaDB: the rows present before the source
starts arrive as insert transactions, DML during and after the snapshot
streams from the snapshot's position, and what the Pump serves replays to the
upstream's checksums; a kill -9 mid-snapshot, or a crash right after its
commit point, then a restart gives the same result with no row twice."""

from __future__ import annotations

import json
import pathlib
import threading
import time
from typing import Any

import pytest
from pumpkit import Processes, wait_until
from srckit import Cluster, Replay, SourceThread, check_retaken, journal_prewrites, sql

from binlake import cli, errors, failpoint
from binlake.proto import binlog_pb2
from binlake.source.journal import SourceState
from binlake.source.mysql.source import MySQLSource
from binlake.sql import checksum
from binlake.sql import schema as sc
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


def test_snapshot_then_stream(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
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
    st = json.loads((data / "state.json").read_text())
    assert "snapshot" not in st and "snapshot_attempt" not in st
    # The progress the source left in its data dir, as `binlake ctl` shows it.
    capsys.readouterr()
    assert cli.main(["ctl", "snapshot-progress", "--data-dir", str(data), "--json"]) == 0
    progress = json.loads(capsys.readouterr().out)
    assert progress["state"] == "done" and progress["tables_done"] == progress["tables"] == 2
    # rows_estimate: InnoDB's sampled count, which may lag a table just filled.
    assert progress["rows"] == ROWS and progress["bytes"] > 0 and isinstance(progress["rows_estimate"], int)
    assert cli.main(["ctl", "snapshot-progress", "--data-dir", str(data)]) == 0
    assert f"2/2 tables, {ROWS} of ~" in capsys.readouterr().out
    assert cli.main(["ctl", "snapshot-progress", "--data-dir", str(tmp_path / "nothing")]) == 2
    assert "no snapshot progress" in capsys.readouterr().err


def test_a_paced_snapshot_keeps_to_its_rate_and_equals_the_upstream(
        mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--snapshot-max-rows-per-s: the snapshot's rows go out at most that fast on average
    (the progress a DBA reads says so), and the result is the same snapshot."""
    db = fresh_db(mdb)
    data = tmp_path / "src"
    rate = 1_000.0
    src = SourceThread(MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=3000 + _n,
                                   registry=cluster.registry.addr, data_dir=str(data), tables=f"{db}.*",
                                   start="snapshot", snapshot_batch_rows=50, snapshot_max_rows_per_s=rate)).start()
    try:
        assert src.source.ready.wait(60)
        wait_until(lambda: at_end(mdb, data), timeout=60, what="source caught up")
    finally:
        src.stop()
    verify(mdb, cluster, db, -(-ROWS // 50))
    capsys.readouterr()
    assert cli.main(["ctl", "snapshot-progress", "--data-dir", str(data), "--json"]) == 0
    progress = json.loads(capsys.readouterr().out)
    assert progress["rows"] == ROWS and progress["elapsed_s"] >= ROWS / rate - 0.1
    assert progress["rows_per_s"] <= rate * 1.02 and progress["max_rows_per_s"] == rate
    assert cli.main(["ctl", "snapshot-progress", "--data-dir", str(data)]) == 0
    assert "rows/s, paced at 1000 rows/s" in capsys.readouterr().out


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
            "--start", "snapshot", "--snapshot-batch-rows", "10"]
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
    # The DML between the kill and the restart is in the second snapshot (the first one never completed).
    verify(mdb, cluster, db, -(-ROWS // 10), batch=10)
    check_retaken(cluster.binlogs(), 2)


def test_crash_after_the_commit_point_resumes(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    db = fresh_db(mdb)
    data = tmp_path / "src"
    # The markers' group commit: after the 2 definitions' and the row parts' own commits.
    monkeypatch.setattr(failpoint, "_hits", {})  # this test counts its own hits
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


# ---------------------------------------------------------------------------- the lake flows during a snapshot

FLOW_ROWS, FLOW_BATCH = 2000, 200  # 10 row parts


@pytest.mark.slow  # the Spark ingests and restore: about 30 s with a warm JVM
def test_other_writers_windows_are_ingested_while_the_snapshot_runs(
        mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path, spark: Any) -> None:
    """A snapshot of more parts than the Pump holds pending at once, slowed down, while a
    TxnWriter writes to its own table: a window ending during the snapshot can be ingested
    while it runs (the Pump's safe ts passes the writer's commits before the markers, and
    the Pump serves them: what an ingest checks and reads), the snapshot's table is refused
    at that ts in one line, and after the end a restore equals the upstream value by value."""
    import sqlalchemy as sa
    from pumpkit import wait_cluster_safe

    from binlake.lake import ingest
    from binlake.registry.client import RegistryClient
    from binlake.restore import restore
    from binlake.sql import diff
    from binlake.writer.txn_writer import META_TABLE, TxnWriter

    global _n
    _n += 1
    db = f"snap{_n}"
    sql(mdb, f"CREATE DATABASE {db}",
        f"CREATE TABLE {db}.big (id INT PRIMARY KEY, v BIGINT, note VARCHAR(40))")
    sql(mdb, f"INSERT INTO big SELECT seq, seq * 3, CONCAT('row ', seq) FROM seq_1_to_{FLOW_ROWS}", db=db)
    up = f"sqlite:///{tmp_path / 'other.db'}"
    mid, go = threading.Event(), threading.Event()
    at: dict[str, int] = {}
    src_obj = MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=3000 + _n, registry=cluster.registry.addr,
                          data_dir=str(tmp_path / "src"), tables=f"{db}.*", start="snapshot",
                          snapshot_batch_rows=FLOW_BATCH)
    parts = [0]

    def part(_rows: int) -> None:  # the source's thread, after each row part committed
        parts[0] += 1
        time.sleep(0.05)
        if parts[0] == 4:
            with RegistryClient(cluster.registry.addr) as reg:
                at["w"] = reg.get_ts()
            mid.set()
            assert go.wait(240), "the test never let the snapshot go on"

    src_obj.on_snapshot_part = part
    src = SourceThread(src_obj)
    stop_writing = threading.Event()
    commits: list[int] = []
    with TxnWriter(up, registry=cluster.registry.addr, sync_commit_binlog=True) as w:
        # Table ids apart from the source's (two writers of one lake share its id space).
        with sa.create_engine(up).begin() as conn:
            conn.execute(sa.text(f"INSERT OR REPLACE INTO {META_TABLE} (k, v) VALUES ('next_table_id', '9000')"))
        with RegistryClient(cluster.registry.addr) as reg:
            t0 = reg.get_ts()
        w.create_table("other", [sc.ColumnDef("id", "int", False), sc.ColumnDef("n", "int")], ["id"])

        def writer() -> None:
            i = 0
            while not stop_writing.is_set():
                i += 1
                info = w.run(lambda t, i=i: t.insert("other", {"id": i, "n": i * 2}))
                assert info is not None
                commits.append(info.commit_ts)
                time.sleep(0.05)

        th = threading.Thread(target=writer, daemon=True)
        th.start()
        src.start()
        try:
            assert mid.wait(60), "the snapshot reached its fourth part"
            w_ts = at["w"]
            # While the snapshot is held half way: the window up to w_ts is ready (what an
            # ingest checks), and the Pump serves the other writer's transactions in it.
            wait_cluster_safe(cluster.registry.addr, w_ts, 20)
            held = cluster.binlogs(t0)
            st = json.loads((tmp_path / "src" / "state.json").read_text())
            assert "snapshot_attempt" in st and "position" not in st, "the snapshot was still running"
            window = [b for b in held if b.commit_ts < w_ts]
            other = [b for b in window if not b.ddl_query and all(
                m.table_id >= 9000 for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations)]
            assert len(other) == len([c for c in commits if c < w_ts]) > 0, "the other writer's transactions"
            assert len(window) == 1 + len(other) + 1 + 4, "its DDL, the pending definition, four row parts"
            assert not any(b.ddl_query.startswith(b"-- binlake: initial") for b in held), "no marker yet"
            go.set()
            assert src.source.ready.wait(60)
            stop_writing.set()
            sql(mdb, f"UPDATE {db}.big SET v = -1 WHERE id = 7", f"DELETE FROM {db}.big WHERE id = 8")  # streamed
            wait_until(lambda: at_end(mdb, tmp_path / "src"), timeout=60, what="source caught up")
        finally:
            go.set()
            stop_writing.set()
            th.join(30)
            src.stop()
        with RegistryClient(cluster.registry.addr) as reg:
            end = reg.get_ts()
    wait_cluster_safe(cluster.registry.addr, end, 20)
    lake = str(tmp_path / "lake")
    ingest.ingest_window(spark, lake, cluster.registry.addr, t0, end, partitions=1)
    # At w_ts the table's snapshot was in progress: refused in one line saying from when.
    with pytest.raises(errors.FailedPrecondition, match="initial snapshot .* was in progress then; it is "
                       "restorable from commit_ts") as exc:
        restore.plan(spark, lake, w_ts - 1, tables=[f"{db}.big"])
    assert "\n" not in str(exc.value)
    # A restore of every table at that ts leaves it out, and its plan says which and until when.
    every = restore.plan(spark, lake, w_ts - 1)
    assert f"{db}.big" not in {t.name for t in every.tables}
    assert [line.split(" ")[0] for line in every.skipped] == [f"{db}.big"], every.skipped
    assert "restorable from commit_ts" in every.skipped[0]
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    restore.run(spark, lake, end - 1, tables=[f"{db}.big"], target=target)
    report = diff.diff_databases(mdb.url_for(db), target, tables=["big"], chunk_size=500)
    assert report.ok and len(report.tables) == 1, report.summary()


def test_kill9_of_a_pump_during_the_snapshot(mdb: LocalMariaDB, tmp_path: pathlib.Path) -> None:
    """A Pump killed -9 between two row parts: the next parts go to the other Pump, the
    snapshot completes, and once the killed Pump is back what both serve replays to the
    upstream, each part once."""
    from pumpkit import free_port

    from binlake.client.reader import pull_pump, pull_window
    from binlake.registry.client import RegistryClient

    db = fresh_db(mdb)
    procs = Processes(tmp_path / "procs")
    try:
        _reg, reg_addr = procs.registry(tmp_path / "registry")
        port = free_port()
        pumps = {n: procs.pump(reg_addr, tmp_path / n, n, port if n == "p1" else None) for n in ("p1", "p2")}
        src_obj = MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=3000 + _n, registry=reg_addr,
                              data_dir=str(tmp_path / "src"), tables=f"{db}.*", start="snapshot",
                              snapshot_batch_rows=50)
        parts = [0]

        def part(_rows: int) -> None:
            parts[0] += 1
            if parts[0] == 3:
                pumps["p1"][0].kill()

        src_obj.on_snapshot_part = part
        src = SourceThread(src_obj).start()
        try:
            assert src.source.ready.wait(90), "the snapshot completed without the killed Pump"
            dml(mdb, db, 1)
            wait_until(lambda: at_end(mdb, tmp_path / "src"), timeout=60, what="source caught up")
        finally:
            src.stop()
        assert parts[0] == -(-ROWS // 50)
        procs.pump(reg_addr, tmp_path / "p1", "p1", port)  # back, with what it held
        with RegistryClient(reg_addr) as reg:
            end = reg.get_ts()
        binlogs = list(pull_window({n: a for n, (_s, a) in pumps.items()}, 0, end, wait=True, wait_timeout_s=60))
        on_p2 = [b for b in pull_pump(pumps["p2"][1], 0, end, wait=True, wait_timeout_s=60) if not b.ddl_query]
        assert len(on_p2) >= -(-ROWS // 50) - 3, "the parts after the kill went to the other Pump"
    finally:
        procs.cleanup()
    rows = [b for b in binlogs if not b.ddl_query]
    assert len(rows) == len({b.start_ts for b in rows}) == -(-ROWS // 50) + 1
    replay = Replay().apply(binlogs)
    assert replay.checksums() == checksum.checksum(mdb.url_for(db), schema=replay.schema())
