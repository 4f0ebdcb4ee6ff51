"""Crash safety of the MariaDB source: kill -9 mid-stream, a crash at each step
of the two-phase send (failpoints), a server restart, ``FLUSH BINARY LOGS``,
and a purged start position. After each restart the Pump must serve every
upstream transaction exactly once (after the reader's duplicate rule) and the
replayed rows must equal the upstream's."""

from __future__ import annotations

import json
import pathlib
import random
import threading
import time
from collections.abc import Iterator

import pytest
from pumpkit import Processes, ServiceProcess, wait_until
from srckit import Cluster, Replay, SourceThread, sql

from binlake import errors, failpoint
from binlake.net import free_port
from binlake.source.mysql.source import MySQLSource
from binlake.sql import checksum
from binlake.stack.localdb import LocalMariaDB

pytestmark = pytest.mark.skipif(not LocalMariaDB.available(), reason="MariaDB not installed (apt-get install "
                                "mariadb-server); CI always has it")


@pytest.fixture(scope="module")
def mdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMariaDB]:
    # A fixed port: the server-restart test restarts it and the source reconnects to the same address.
    server = LocalMariaDB(tmp_path_factory.mktemp("mdb-crash"), binlog=True, server_id=1, port=free_port()).start()
    try:
        yield server
    finally:
        server.stop()


_n = 0


def fresh_db(mdb: LocalMariaDB) -> str:
    global _n
    _n += 1
    db = f"crash{_n}"
    sql(mdb, f"CREATE DATABASE {db}", f"CREATE TABLE {db}.acc (id INT PRIMARY KEY, bal BIGINT, note VARCHAR(40))")
    return db


def source_proc(procs: Processes, mdb: LocalMariaDB, cluster: Cluster, data_dir: pathlib.Path, db: str,
                env: dict[str, str] | None = None) -> ServiceProcess:
    return procs._spawn("source", [
        "source", "mysql", "--dsn", f"mysql://root@127.0.0.1:{mdb.port}", "--server-id", str(2000 + _n),
        "--registry", cluster.registry.addr, "--data-dir", str(data_dir), "--tables", f"{db}.*",
    ], env)


def checkpoint(data_dir: pathlib.Path) -> tuple[str, int]:
    try:
        pos = json.loads((data_dir / "state.json").read_text()).get("position") or ["", 0]
    except (OSError, ValueError):
        return "", 0
    return str(pos[0]), int(pos[1])


def wait_checkpoint_at_end(mdb: LocalMariaDB, data_dir: pathlib.Path, svc: ServiceProcess) -> None:
    end = sql(mdb, "SHOW MASTER STATUS")[0]

    def there() -> bool:
        svc.check_alive()
        return checkpoint(data_dir) >= (end[0], int(end[1]))

    wait_until(there, timeout=90, what=f"checkpoint at {end[0]}:{end[1]}")


def upstream_txn(mdb: LocalMariaDB, db: str, i: int) -> None:
    # Each transaction: insert a row, move balance between two rows, sometimes delete one.
    stmts = ["BEGIN", f"INSERT INTO acc VALUES ({i}, {i * 10}, 'n{i}')"]
    if i > 2:
        a, b = random.sample(range(1, i), 2)
        stmts += [f"UPDATE acc SET bal = bal - 1 WHERE id = {a}", f"UPDATE acc SET bal = bal + 1 WHERE id = {b}"]
    if i % 7 == 0:
        stmts.append(f"DELETE FROM acc WHERE id = {i - 3}")
    stmts.append("COMMIT")
    sql(mdb, *stmts, db=db)


def verify(mdb: LocalMariaDB, cluster: Cluster, db: str, upstream_txns: int) -> None:
    binlogs = cluster.binlogs()
    dml = [b for b in binlogs if not b.ddl_query]
    assert len(dml) == upstream_txns, "every upstream transaction exactly once after the duplicate rule"
    assert [b.commit_ts for b in binlogs] == sorted(b.commit_ts for b in binlogs)
    replay = Replay().apply(binlogs)  # asserts no insert of an existing key, matching before images
    assert replay.checksums() == checksum.checksum(mdb.url_for(db), schema=replay.schema())


@pytest.mark.slow
def test_kill9_mid_stream_and_restart(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    procs = Processes(tmp_path / "procs")
    data = tmp_path / "src"
    try:
        svc = source_proc(procs, mdb, cluster, data, db)
        wait_until(lambda: checkpoint(data)[0] != "", timeout=60, what="source started")
        done = threading.Event()
        count = [0]

        def writer() -> None:
            for i in range(1, 10_000):
                if done.is_set():
                    break
                upstream_txn(mdb, db, i)
                count[0] = i

        th = threading.Thread(target=writer, daemon=True)
        th.start()
        for _round in range(2):
            # Kill while transactions flow: wait until the Pump took some, then -9.
            seen = len(cluster.raw())
            wait_until(lambda seen=seen: len(cluster.raw()) >= seen + 10, timeout=60, what="source progress")
            svc.kill()
            time.sleep(0.3)
            svc = source_proc(procs, mdb, cluster, data, db)
        wait_until(lambda: count[0] >= 80, timeout=120, what="80 upstream transactions")
        done.set()
        th.join(30)
        wait_checkpoint_at_end(mdb, data, svc)
        assert svc.terminate() == 0
        verify(mdb, cluster, db, count[0])
    finally:
        procs.cleanup()


@pytest.mark.parametrize("point", ["source-after-prewrite", "source-before-commit", "source-after-commit"])
def test_crash_at_each_step_of_the_send(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path,
                                        point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the failpoint raises out of run() as a crash would end it there (the
    journal is fsync'ed at each step and no checkpoint is taken on the way out)."""
    assert point in failpoint.NAMES
    db = fresh_db(mdb)
    data = tmp_path / "src"

    def new_source() -> SourceThread:
        src = SourceThread(MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=2500 + _n,
                                       registry=cluster.registry.addr, data_dir=str(data), tables=f"{db}.*"))
        return src.start()

    src = new_source()
    assert src.source.ready.wait(60)
    src.stop()
    for i in range(1, 6):
        upstream_txn(mdb, db, i)
    monkeypatch.setenv(failpoint.ENV, f"{point}:raise")
    src = new_source()
    src.thread.join(60)
    assert isinstance(src.error, failpoint.FailpointError)
    monkeypatch.delenv(failpoint.ENV)
    src = new_source()
    end = sql(mdb, "SHOW MASTER STATUS")[0]
    wait_until(lambda: (src.source.file, src.source.pos) >= (end[0], int(end[1])), timeout=60, what="caught up")
    src.stop()
    verify(mdb, cluster, db, 5)
    copies = [b for b in cluster.raw() if not b.ddl_query]
    assert len({(b.commit_ts, b.start_ts) for b in copies}) == 5
    if point == "source-after-prewrite":
        # The abandoned start_ts was answered "rolled back" through TxnStatus, never served.
        assert len(copies) == 5


@pytest.mark.parametrize("point", ["source-after-group-prewrite", "source-before-group-commit"])
def test_kill9_inside_a_group(mdb: LocalMariaDB, cluster: Cluster, tmp_path: pathlib.Path, point: str) -> None:
    """A source process dies (exit 137, no cleanup) in the middle of a group of several
    upstream transactions: after its begin line and prewrites, before its decision line
    (the whole group is rolled back and sent afresh), or after the decision line, before
    its commits (the restart re-sends every commit with the journaled TSOs)."""
    db = fresh_db(mdb)
    procs = Processes(tmp_path / "procs")
    data = tmp_path / "src"
    txns = 40
    try:
        svc = source_proc(procs, mdb, cluster, data, db)
        wait_checkpoint_at_end(mdb, data, svc)  # started, the table's definition sent
        assert svc.terminate() == 0
        for i in range(1, txns + 1):  # a backlog: groups of several, however the reader and sender interleave
            upstream_txn(mdb, db, i)
        # The first step that prewrites (or decides) a group of several transactions.
        svc = source_proc(procs, mdb, cluster, data, db, env={failpoint.ENV: f"{point}:exit:1"})
        wait_until(lambda: not svc.alive, timeout=60, what="the source to die at the failpoint")
        assert svc.proc is not None and svc.proc.returncode == 137, svc.log_text()
        # The last journal line is the step the process died in: it began a group of
        # several (after-prewrite: their prewrites out, no decision yet) or decided one.
        lines = [json.loads(x) for x in (data / "journal.log").read_text().splitlines()]
        last = lines[-1]
        started = {k: int(s) for r in lines for k, s in r.get("b", ())}
        if point == "source-after-group-prewrite":
            assert len(last.get("b", ())) > 1, "the crash is inside a group of several transactions"
            crashed = {int(s) for _k, s in last["b"]}
        else:
            assert len(last.get("m", ())) > 1, "the crash is inside a group of several transactions"
            kept = {(int(c), started[k]) for k, c, _p in last["m"]}
        svc = source_proc(procs, mdb, cluster, data, db)
        wait_checkpoint_at_end(mdb, data, svc)
        assert svc.terminate() == 0
        verify(mdb, cluster, db, txns)
        copies = [b for b in cluster.raw() if not b.ddl_query]
        assert len({(b.commit_ts, b.start_ts) for b in copies}) == txns
        if point == "source-after-group-prewrite":
            # The crashed group's start_ts were rolled back (TxnStatus): none of them is served.
            assert not crashed & {b.start_ts for b in copies} and len(copies) == txns
        else:
            # Decided before the crash: the restart sent the same (commit_ts, start_ts).
            assert kept <= {(b.commit_ts, b.start_ts) for b in copies}
    finally:
        procs.cleanup()


def test_server_restart_rotation_and_purged_position(mdb: LocalMariaDB, cluster: Cluster,
                                                     tmp_path: pathlib.Path) -> None:
    db = fresh_db(mdb)
    data = tmp_path / "src"

    def new_source() -> MySQLSource:
        return MySQLSource(f"mysql://root@127.0.0.1:{mdb.port}", server_id=2500 + _n, registry=cluster.registry.addr,
                           data_dir=str(data), tables=f"{db}.*")

    src = SourceThread(new_source()).start()
    assert src.source.ready.wait(60)
    try:
        for i in range(1, 4):
            upstream_txn(mdb, db, i)
        sql(mdb, "FLUSH BINARY LOGS")
        for i in range(4, 7):
            upstream_txn(mdb, db, i)
        mdb.stop()  # the source loses its connection and retries with backoff
        time.sleep(1.0)
        mdb.start()
        for i in range(7, 10):
            upstream_txn(mdb, db, i)
        end = sql(mdb, "SHOW MASTER STATUS")[0]
        wait_until(lambda: (src.source.file, src.source.pos) >= (end[0], int(end[1])), timeout=90,
                   what="source caught up after the restart")
    finally:
        src.stop()
    verify(mdb, cluster, db, 9)
    # Changes while the source is down, then the binlogs holding them are purged.
    upstream_txn(mdb, db, 10)
    at = json.loads((data / "state.json").read_text())["position"][0]

    def purged() -> bool:
        # MariaDB keeps a binlog until its crash-recovery checkpoint moved on: retry.
        sql(mdb, "FLUSH BINARY LOGS")
        sql(mdb, f"PURGE BINARY LOGS TO '{sql(mdb, 'SHOW MASTER STATUS')[0][0]}'")
        return at not in [r[0] for r in sql(mdb, "SHOW BINARY LOGS")]

    wait_until(purged, timeout=30, interval=0.5, what=f"{at} purged")
    src = SourceThread(new_source()).start()
    with pytest.raises(errors.FailedPrecondition, match="was purged"):
        src.stop(timeout=60)
