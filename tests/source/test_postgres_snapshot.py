"""``binlake source postgres --start snapshot`` against a real PostgreSQL
(wal_level=logical) and a real registry + Pump:

* rows written before the source starts arrive as the snapshot, changes made
  while the snapshot is being read (a transaction committed between every two
  batches) and after it arrive through the slot, none twice, none missed; the
  lake ingested from the Pump and applied to a PostgreSQL target equals the
  upstream (``binlake diff``);
* every supported column type: a snapshot row and the same row streamed by
  pgoutput are the same bytes;
* the publication's row filter holds for the snapshot as for the stream;
* kill -9 during the snapshot: the restart drops the unfinished slot and takes
  the snapshot again with a new one; a stop or a refusal during it drops the
  slot at once; a crash after the commit point: the restart re-sends the
  commits and streams from the consistent point, and a checkpoint whose slot
  was dropped is refused;
* an existing slot with ``--start snapshot``: one line, exit 2, slot untouched.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from pumpkit import Processes, wait_until
from srckit import Cluster, Replay, SourceThread, check_retaken, journal_prewrites

from binlake import cli, errors, failpoint
from binlake.proto import binlog_pb2
from binlake.source.journal import SourceState
from binlake.source.postgres import snapshot as snap
from binlake.source.postgres.source import SNAPSHOT_SLOT, PostgresSource
from binlake.sql import checksum
from binlake.stack.localdb import LocalPostgres

pytestmark = pytest.mark.skipif(not LocalPostgres.available(), reason="PostgreSQL not installed (apt-get install "
                                "postgresql); CI always has it")

ROWS = 240
BATCH = 20


_n = 0


def fresh_db(pg: LocalPostgres) -> tuple[str, str]:
    """A database whose tables hold rows before any source starts: (SQLAlchemy URL, libpq DSN)."""
    global _n
    _n += 1
    url = pg.create_database(f"snap{_n}")
    run_sql(url,
            "CREATE TABLE acc (id INT PRIMARY KEY, bal BIGINT, note VARCHAR(40), ok BOOLEAN, at TIMESTAMPTZ)",
            "CREATE TABLE empty (id INT PRIMARY KEY)",
            "ALTER TABLE acc REPLICA IDENTITY FULL", "ALTER TABLE empty REPLICA IDENTITY FULL",
            f"INSERT INTO acc SELECT i, i * 10, 'café ' || i, i % 2 = 0, '2024-05-01 10:00:00+02'::timestamptz "
            f"+ i * interval '1 second' FROM generate_series(1, {ROWS}) i")
    return url, dsn_of(url)


def dsn_of(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def run_sql(url: str, *stmts: str) -> list[Any]:
    out: list[Any] = []
    with psycopg.connect(dsn_of(url), autocommit=True) as conn:
        for s in stmts:
            cur = conn.execute(s)  # type: ignore[arg-type]
            out = cur.fetchall() if cur.description else []
    return out


def dml(url: str, i: int) -> None:
    """One upstream transaction touching rows of the snapshot and a new one."""
    with psycopg.connect(dsn_of(url)) as conn:
        conn.execute(f"UPDATE acc SET bal = bal + 1, ok = NOT ok WHERE id = {i}")  # type: ignore[arg-type]
        conn.execute(f"DELETE FROM acc WHERE id = {ROWS - i}")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO acc VALUES ({ROWS + i}, 1, NULL, true, now())")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO empty VALUES ({i})")  # type: ignore[arg-type]


def source(dsn: str, cluster: Cluster, data: pathlib.Path, **kw: Any) -> PostgresSource:
    return PostgresSource(dsn, slot=f"snap{_n}", publication=f"pub{_n}", registry=cluster.registry.addr,
                          data_dir=str(data), create=True, start="snapshot", snapshot_batch_rows=BATCH, **kw)


def row_txns(binlogs: list[binlog_pb2.Binlog]) -> list[binlog_pb2.Binlog]:
    """The row transactions of the tables a completed snapshot defined (an unfinished
    attempt's rows stay in the log under the ids its retake retired)."""
    live = {b.ddl_table.table_id for b in binlogs if b.ddl_query and not b.ddl_table.snapshot_pending}
    return [b for b in binlogs if not b.ddl_query and all(
        m.table_id in live for m in binlog_pb2.PrewriteValue.FromString(b.prewrite_value).mutations)]


def markers(binlogs: list[binlog_pb2.Binlog]) -> int:
    """The snapshot's "complete" markers (a DDL whose query is a comment saying so)."""
    return sum(1 for b in binlogs if b.ddl_query.startswith(b"-- binlake: initial snapshot"))


def verify(url: str, binlogs: list[binlog_pb2.Binlog]) -> Replay:
    """Each transaction once, in commit order, replaying to the upstream's rows."""
    rows = row_txns(binlogs)
    assert len({b.start_ts for b in rows}) == len(rows)
    assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)
    replay = Replay().apply(binlogs)  # asserts no insert of a key already there, before images equal
    assert replay.checksums() == checksum.checksum(url, schema=replay.schema())
    return replay


def started(src: SourceThread) -> None:
    """The snapshot sent and the slot streaming (or the source failed: raised by stop())."""
    wait_until(lambda: src.source.ready.is_set() or not src.thread.is_alive(), timeout=60, what="source ready")
    if not src.source.ready.is_set():
        src.stop()


def slot_exists(url: str, slot: str) -> bool:
    return bool(run_sql(url, f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}'"))


# ---------------------------------------------------------------------------- snapshot + stream -> lake -> target


@pytest.mark.slow  # the Spark ingest and apply: about 30 s with a warm JVM
def test_snapshot_with_concurrent_writes_ingested_and_applied_equals_upstream(
        pg: LocalPostgres, cluster: Cluster, tmp_path: pathlib.Path, spark: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake.lake import ingest
    from binlake.lake.pumps import datasource as lake_source
    from binlake.lake.pumps.planner import plan_window
    from binlake.registry.client import RegistryClient
    from binlake.replicate import runner, task
    from binlake.sql import diff

    url, dsn = fresh_db(pg)
    during = [0]

    def write_after(_batch: Any) -> None:
        # An upstream transaction commits between every two batches, while the snapshot is open:
        # it is not in the rows read, so it must come through the slot.
        during[0] += 1
        dml(url, during[0])

    around_reads(monkeypatch, after=write_after)
    with RegistryClient(cluster.registry.addr) as reg:
        t0 = reg.get_ts()
    src = SourceThread(source(dsn, cluster, tmp_path / "src")).start()
    try:
        started(src)
        assert src.source.snapshot_rows == ROWS, "the snapshot holds the rows as of its slot's creation only"
        parts = 2 + ROWS // BATCH  # the definitions, then the row batches
        assert during[0] == ROWS // BATCH
        for i in range(during[0] + 1, during[0] + 6):  # and after the snapshot
            dml(url, i)
        run_sql(url, "ALTER TABLE acc ADD COLUMN extra INT", "UPDATE acc SET extra = 7 WHERE id = 1")
        wait_until(lambda: src.source.transactions >= parts + during[0] + 5 + 1, timeout=60, what="source caught up")
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    # Two tables pending, their markers, then the added column.
    assert sum(1 for b in binlogs if b.ddl_query) == 5 and markers(binlogs) == 2
    assert len(row_txns(binlogs)) == ROWS // BATCH + during[0] + 5 + 1
    verify(url, binlogs)
    assert slot_exists(url, f"snap{_n}")
    st = json.loads((tmp_path / "src" / "state.json").read_text())
    assert "snapshot" not in st and SNAPSHOT_SLOT not in st and st["lsn"] > 0

    # The lake, then a PostgreSQL target: equal to the upstream, table by table.
    with RegistryClient(cluster.registry.addr) as reg:
        end = reg.get_ts()

    def passed() -> bool:
        try:
            lake_source.check_pumps(plan_window(cluster.registry.addr, 0, end))
        except errors.FailedPrecondition:
            return False
        return True

    wait_until(passed, 30, 0.1, "the Pump's safe ts to pass the end")
    lake = str(tmp_path / "lake")
    ingest.ingest_window(spark, lake, cluster.registry.addr, t0, end, partitions=1)
    target = pg.create_database(f"target{_n}")
    summary = runner.Applier(spark, task.Task(name="pgsnap", lake=lake, target=target, mode="consistent")).run()
    assert summary.windows == 1
    report = diff.diff_databases(url, target, chunk_size=50)
    assert report.ok, report.summary()


# ---------------------------------------------------------------------------- every type, both paths

TYPES = ("id INT PRIMARY KEY, s SMALLINT, b BIGINT, ok BOOLEAN, r REAL, d DOUBLE PRECISION, n NUMERIC(30,10), "
         "nn NUMERIC, tx TEXT, vc VARCHAR(20), ch CHAR(4), nm NAME, o OID, by BYTEA, dt DATE, ts TIMESTAMP(6), "
         "tz TIMESTAMPTZ, tm TIME, j JSON, jb JSONB, u UUID")
VALUES = [
    "(1, -32768, 9223372036854775807, true, 1.5, 1e300, '-12345678901234567890.0123456789', 0.1, 'ünïcödé', "
    "'vc', 'ab', 'name', 4294967295, '\\x00ff', '2024-02-29', '2024-01-01 12:34:56.789012', "
    "'2024-01-01 12:00:00+02', '23:59:59.5', '{\"b\": 1,  \"a\": [1, null]}', '{\"a\": [1, null]}', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
    "(2, 32767, -9223372036854775808, false, -2.25, 0.1, 0, 1e-20, '', '', '', '', 0, '', '0001-01-01', "
    "'1970-01-01 00:00:00', '1999-12-31 23:59:59.999999-11:30', '00:00:00', '[]', '\"x\"', "
    "'00000000-0000-0000-0000-000000000000')",
    "(3, NULL, NULL, NULL, 3.5, '-0', NULL, '123456789012345678901234567890.123456789', 'unchanged', 'x''y\\z', ' a ', NULL, NULL, '\\x', NULL, "
    "NULL, NULL, NULL, 'null', 'null', NULL)",
    "(4" + ", NULL" * 20 + ")",
]


def test_every_type_snapshot_rows_equal_streamed_rows(pg: LocalPostgres, cluster: Cluster,
                                                      tmp_path: pathlib.Path) -> None:
    global _n
    _n += 1
    url = pg.create_database(f"snap{_n}")
    run_sql(url, f"CREATE TABLE a ({TYPES})", f"CREATE TABLE b ({TYPES})", "ALTER TABLE a REPLICA IDENTITY FULL",
            "ALTER TABLE b REPLICA IDENTITY FULL", *[f"INSERT INTO a VALUES {v}" for v in VALUES])
    src = SourceThread(source(dsn_of(url), cluster, tmp_path / "src")).start()
    try:
        started(src)
        # The same stored values through pgoutput: into b, and as a's before images.
        run_sql(url, "INSERT INTO b SELECT * FROM a", "UPDATE a SET s = 0")
        wait_until(lambda: src.source.transactions >= 2 + 1 + 2, timeout=60, what="source caught up")
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    verify(url, binlogs)  # the update's before images equal the snapshot's rows (Replay checks)
    defs = {b.ddl_table.name: b.ddl_table for b in binlogs if b.ddl_query}
    a, b = defs["a"], defs["b"]
    assert [(c.id, c.name, c.type) for c in a.columns] == [(c.id, c.name, c.type) for c in b.columns]
    muts = [m for x in row_txns(binlogs) for m in binlog_pb2.PrewriteValue.FromString(x.prewrite_value).mutations]
    from_snapshot = sorted(r for m in muts if m.table_id == a.table_id for r in m.inserted_rows)
    streamed = sorted(r for m in muts if m.table_id == b.table_id for r in m.inserted_rows)
    assert len(from_snapshot) == len(VALUES)
    assert from_snapshot == streamed, "a snapshot row and the same row streamed are the same bytes"
    before = sorted(binlog_pb2.UpdatedRow.FromString(u).old.SerializeToString()
                    for m in muts if m.table_id == a.table_id for u in m.updated_rows)
    assert before == from_snapshot


def test_row_filter_of_the_publication_applies_to_the_snapshot(pg: LocalPostgres, cluster: Cluster,
                                                                tmp_path: pathlib.Path) -> None:
    url, dsn = fresh_db(pg)
    run_sql(url, f"CREATE PUBLICATION pub{_n} FOR TABLE acc WHERE (id % 2 = 0)")
    src = SourceThread(source(dsn, cluster, tmp_path / "src")).start()
    try:
        started(src)
        assert src.source.snapshot_rows == ROWS // 2
        run_sql(url, "INSERT INTO acc VALUES (1000, 1, 'kept', true, NULL), (1001, 1, 'left out', true, NULL)")
        wait_until(lambda: src.source.transactions >= 1 + ROWS // 2 // BATCH + 1, timeout=60, what="caught up")
    finally:
        src.stop()
    replay = Replay().apply(cluster.binlogs())
    info, rows = replay.table("acc")
    upstream = run_sql(url, "SELECT id, note FROM acc WHERE id % 2 = 0 ORDER BY id")
    assert sorted((r["id"], r["note"]) for r in rows) == [tuple(r) for r in upstream]


def around_reads(monkeypatch: pytest.MonkeyPatch, before: Callable[[Any], None] | None = None,
                 after: Callable[[Any], None] | None = None) -> None:
    """Calls ``before(batch)`` / ``after(batch)`` around each batch the snapshot reads, on
    both of its read paths (COPY chunks for the native encoder, rows for the Python one)."""
    for name in ("batches", "copy_chunks"):
        read = getattr(snap.Snapshot, name)

        def wrapped(self: snap.Snapshot, t: snap.PublishedTable, rows: int, read: Any = read) -> Iterator[Any]:
            for batch in read(self, t, rows):
                if before is not None:
                    before(batch)
                yield batch
                if after is not None:
                    after(batch)

        monkeypatch.setattr(snap.Snapshot, name, wrapped)


# ---------------------------------------------------------------------------- crashes

def test_stop_or_refusal_during_the_snapshot_drops_its_slot(pg: LocalPostgres, cluster: Cluster,
                                                            tmp_path: pathlib.Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url, dsn = fresh_db(pg)
    slot, data = f"snap{_n}", tmp_path / "src"
    src = SourceThread(source(dsn, cluster, data))

    def stop(_batch: Any) -> None:
        assert slot_exists(url, slot)
        src.source.stop()

    around_reads(monkeypatch, before=stop)
    src.start().stop()  # returns without error: nothing of the snapshot was served
    assert not slot_exists(url, slot), "a stopped snapshot holds no WAL"
    assert SNAPSHOT_SLOT not in json.loads((data / "state.json").read_text())
    monkeypatch.undo()
    # A type binlake cannot carry: refused naming the column, the new slot dropped too.
    run_sql(url, "CREATE TABLE odd (id INT PRIMARY KEY, p POINT)", "ALTER TABLE odd REPLICA IDENTITY FULL")
    with pytest.raises(errors.FailedPrecondition, match=r"column public\.odd\.p has a type"):
        source(dsn, cluster, data).run()
    assert not slot_exists(url, slot)
    run_sql(url, "DROP TABLE odd")
    src = SourceThread(source(dsn, cluster, data)).start()  # and the next start takes the snapshot
    try:
        started(src)
        dml(url, 1)
        wait_until(lambda: src.source.transactions >= 2 + ROWS // BATCH + 1, timeout=60, what="caught up")
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    assert len(row_txns(binlogs)) == ROWS // BATCH + 1
    verify(url, binlogs)


def test_kill9_during_snapshot_restarts_with_a_new_slot(pg: LocalPostgres, cluster: Cluster,
                                                        tmp_path: pathlib.Path) -> None:
    url, dsn = fresh_db(pg)
    data = tmp_path / "src"
    slot = f"snap{_n}"
    procs = Processes(tmp_path / "procs")
    args = ["source", "postgres", "--dsn", dsn, "--slot", slot, "--publication", f"pub{_n}", "--create",
            "--registry", cluster.registry.addr, "--data-dir", str(data), "--start", "snapshot",
            "--snapshot-batch-rows", "2"]  # 125 prewrites: long enough to be killed part way
    try:
        svc = procs._spawn("source", args, None)

        wait_until(lambda: journal_prewrites(svc, data) >= 12, timeout=60, interval=0.02, what="snapshot half way")
        svc.kill()
        first = run_sql(url, f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'")
        st = json.loads((data / "state.json").read_text())
        assert "lsn" not in st and st[SNAPSHOT_SLOT] == slot, "killed before the snapshot's commit point"
        for i in range(1, 6):
            dml(url, i)  # after the dead snapshot's instant: in the next snapshot
        svc = procs._spawn("source", args, None)
        wait_until(lambda: json.loads((data / "state.json").read_text()).get("lsn", 0) > 0, timeout=90,
                   what="snapshot taken again")
        second = run_sql(url, f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'")
        assert snap.parse_lsn(second[0][0]) > snap.parse_lsn(first[0][0]), "a new slot"
        dml(url, 6)  # streamed
        expected = ROWS // 2 + 3 + 1  # acc's and empty's batches, then one streamed
        wait_until(lambda: len(row_txns(cluster.binlogs())) >= expected, timeout=60, what="restarted source caught up")
        assert svc.terminate() == 0
    finally:
        procs.cleanup()
    binlogs = cluster.binlogs()
    assert len(row_txns(binlogs)) == expected and markers(binlogs) == 2
    verify(url, binlogs)
    check_retaken(binlogs, 2)


def test_crash_after_the_commit_point_resumes(pg: LocalPostgres, cluster: Cluster, tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    url, dsn = fresh_db(pg)
    data = tmp_path / "src"
    # The markers' group commit: after the 2 definitions' and the row parts' own commits.
    monkeypatch.setattr(failpoint, "_hits", {})  # this test counts its own hits
    monkeypatch.setenv(failpoint.ENV, f"source-before-commit:raise:{2 + ROWS // BATCH + 1}")
    src = SourceThread(source(dsn, cluster, data)).start()
    src.thread.join(60)
    assert isinstance(src.error, failpoint.FailpointError)
    monkeypatch.delenv(failpoint.ENV)
    st = SourceState(data)  # decided in the journal, marker present, no checkpoint yet
    marker = st.state["snapshot"]
    assert "lsn" not in st.state and all(st.decision(k) is not None for k, _s, _p in marker["keys"])
    st.close()
    for i in range(1, 4):
        dml(url, i)  # after the snapshot's instant: streamed after the restart
    src = SourceThread(source(dsn, cluster, data)).start()
    try:
        started(src)
        wait_until(lambda: src.source.transactions >= 3, timeout=60, what="source caught up")
    finally:
        src.stop()
    binlogs = cluster.binlogs()
    assert len(row_txns(binlogs)) == ROWS // BATCH + 3
    verify(url, binlogs)
    # The slot dropped behind the source's back: the checkpoint cannot continue, said in one line.
    run_sql(url, f"SELECT pg_drop_replication_slot('snap{_n}')")
    with pytest.raises(errors.FailedPrecondition, match=f"replication slot snap{_n} is gone, but the checkpoint"):
        source(dsn, cluster, data).run()


# ---------------------------------------------------------------------------- user mistakes

def test_existing_slot_with_start_snapshot_is_one_line_exit_2(pg: LocalPostgres, cluster: Cluster,
                                                              tmp_path: pathlib.Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url, dsn = fresh_db(pg)
    slot = f"snap{_n}"
    run_sql(url, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    base = ["source", "postgres", "--dsn", dsn, "--slot", slot, "--publication", f"pub{_n}", "--create",
            "--registry", cluster.registry.addr, "--data-dir", str(tmp_path / "src")]
    assert cli.main([*base, "--start", "snapshot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"replication slot {slot} already exists" in err[0]
    assert "pg_drop_replication_slot" in err[0] and "Traceback" not in err[0]
    assert slot_exists(url, slot)  # not someone else's to drop
    state = tmp_path / "src" / "state.json"
    assert not state.exists() or SNAPSHOT_SLOT not in json.loads(state.read_text())
    assert not run_sql(url, f"SELECT 1 FROM pg_publication WHERE pubname = 'pub{_n}'"), "refused before any change"

    assert cli.main([*base, "--start", "yesterday"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--start 'yesterday': expected now" in err[0]
