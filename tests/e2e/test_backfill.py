"""``airflow backfill create`` fills historical windows of ``binlake_ingest`` on
the always-on stack, newest first, and the lake ends up holding exactly them.

The stack is a real ``binlake up`` child (registry, two Pumps, the always-on
Spark Connect server, Airflow with API server, scheduler, DAG processor and
triggerer over the stack's own PostgreSQL, or SQLite where PostgreSQL is not
installed) with a 10 s ingest schedule; the ingests run as the stack runs them
by default, as clients of its Connect server. While Spark and Airflow start, an
upstream application writes to a SQLite database through TxnWriter, one phase
per 10 s window over three windows: two CREATE TABLEs and an ADD COLUMN between
inserts, updates and deletes. Once the Pumps' safe ts has passed the last
window, the test runs the real CLI, as the banner tells a user to::

    . state/airflow/env.sh
    airflow backfill create --dag-id binlake_ingest --from-date A --to-date B \\
        --run-backwards --max-active-runs 1

and waits on the REST API until the backfill has completed. On PostgreSQL the
one ``backfill create`` of the three windows, while the scheduler runs, must work
at its first try (on SQLite a refused one is rerun, see
``_create_backfill_sqlite``). It proves:

- the backfill made exactly one run per window, each through plan, wait,
  the in-process ingest and publish, one at a time, newest window first;
- the lake's ``windows`` table holds exactly those windows, done, with their
  row and DDL counts, ingested in that reverse order (so the first ingest
  into the empty lake decoded rows whose CREATE TABLE was in a window not
  ingested yet, from the DDLs the Pumps still hold);
- ``changes`` holds exactly the workload's row changes: per table and op, and
  each change's key and after image (read back with ``image_values``) are
  what the upstream held after that statement; replaying them gives the
  upstream's final rows.

Determinism: the DAG's start date is far in the future, so the scheduler
creates no run of its own (no catchup run competes with the backfill or adds
a window to the lake), while Airflow 3.3 still runs backfill runs before the
start date (``DagRun.verify_integrity`` creates their task instances whatever
the tasks' start date). The DAG stays unpaused: the scheduler never starts
queued runs of a paused DAG, backfill runs included. With no earlier run of
these dates, ``--reprocess-behavior`` has nothing to decide (every date gets a
new run). ``--max-active-runs 1`` with ``--run-backwards`` fixes the order of
the runs.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import json
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from pumpkit import free_port, wait_until
from pyspark.sql import SparkSession
from upkit import PUMP_ARGS, binlake_up, clean_env, read_json

from binlake import tso
from binlake.lake.decoding.image import image_values
from binlake.lake.decoding.rows import OPS
from binlake.lake.store import location
from binlake.proto import binlog_pb2
from binlake.registry.client import RegistryClient
from binlake.sql.schema import ColumnDef as C
from binlake.stack.localdb import LocalPostgres
from binlake.writer.txn_writer import TxnWriter

# Short windows keep the workload (three of them) about as long as Spark's and
# Airflow's start, during which it runs.
INTERVAL = dt.timedelta(seconds=10)
# Far ahead of any test run: no scheduled (catchup) run exists while the test runs.
START_DATE = "2100-01-01T00:00:00+00:00"
STACK_ENV = {
    "BINLAKE_INGEST_SCHEDULE": f"{INTERVAL.seconds}s",
    "BINLAKE_INGEST_START_DATE": START_DATE,
    # The ingest inside the task, as a client of the stack's Connect server (what
    # `binlake up` does by default): a window costs its work, not a JVM start per task.
    "BINLAKE_INGEST_MODE": "connect",
}
# The tasks of every run and the state each must end in (the branch skips spark-submit).
TASK_STATES = {"plan": "success", "wait": "success", "choose_ingest": "success", "ingest": "skipped",
               "ingest_inprocess": "success", "publish": "success"}


@dataclasses.dataclass(frozen=True)
class Change:
    """A row change the lake must hold: what the upstream held after the statement."""

    commit_ts: int
    tbl: str
    op: str
    key: dict[str, Any]
    after: dict[str, Any] | None


class Upstream:
    """The application: TxnWriter over SQLite, and a model of every table's rows
    from which each change's expected after image is taken."""

    def __init__(self, writer: TxnWriter) -> None:
        self.writer = writer
        self.rows: dict[str, dict[int, dict[str, Any]]] = {}
        self.changes: list[Change] = []
        self.ddls = 0

    def create_table(self, name: str, columns: list[C]) -> None:
        self.writer.create_table(name, columns, ["id"])
        self.rows[name] = {}
        self.ddls += 1

    def add_column(self, table: str, column: C) -> None:
        self.writer.add_column(table, column)
        for row in self.rows[table].values():
            row[column.name] = None  # existing rows hold NULL in a new nullable column
        self.ddls += 1

    def txn(self, *ops: tuple[str, str, Any]) -> None:
        """One transaction of ("insert", table, row), ("update", table, (id, values))
        and ("delete", table, id)."""
        pending: list[tuple[str, str, dict[str, Any], dict[str, Any] | None]] = []
        with self.writer.transaction() as txn:
            for op, table, arg in ops:
                rows = self.rows[table]
                if op == "insert":
                    columns = [c.name for c in self.writer.table(table).columns]
                    txn.insert(table, arg)
                    rows[arg["id"]] = {c: arg.get(c) for c in columns}
                    key, after = arg["id"], dict(rows[arg["id"]])
                elif op == "update":
                    key, values = arg
                    assert txn.update(table, {"id": key}, values) == 1
                    rows[key].update(values)
                    after = dict(rows[key])
                else:
                    key, after = arg, None
                    assert txn.delete(table, {"id": key}) == 1
                    del rows[key]
                pending.append((table, op, {"id": key}, after))
        assert txn.info is not None
        self.changes += [Change(txn.info.commit_ts, t, o, k, a) for t, o, k, a in pending]


# The workload, one phase per window: DDLs first, then transactions that touch
# rows written in earlier windows (under an older table definition) too.
def _phase_1(up: Upstream) -> None:
    up.create_table("items", [C("id", "int", nullable=False), C("name", "string", length=32), C("qty", "int")])
    up.txn(*[("insert", "items", {"id": i, "name": f"item{i}", "qty": 10 * i}) for i in (1, 2, 3, 4)])
    up.txn(("update", "items", (2, {"qty": 25})), ("insert", "items", {"id": 5, "name": None, "qty": 0}))


def _phase_2(up: Upstream) -> None:
    up.add_column("items", C("note", "string", length=64))
    up.create_table("events", [C("id", "int", nullable=False), C("kind", "string", length=16), C("item", "int")])
    up.txn(("update", "items", (1, {"qty": 12, "note": "restocked"})),
           ("insert", "events", {"id": 1, "kind": "restock", "item": 1}))
    up.txn(("delete", "items", 3), ("insert", "events", {"id": 2, "kind": "drop", "item": 3}))


def _phase_3(up: Upstream) -> None:
    up.txn(("update", "items", (4, {"name": "fourth", "note": "renamed"})), ("update", "items", (5, {"qty": 7})))
    up.txn(("delete", "events", 1), ("insert", "items", {"id": 6, "name": "item6", "qty": 60, "note": "new"}),
           ("insert", "events", {"id": 3, "kind": "add", "item": 6}))
    up.txn(("delete", "items", 2))


PHASES: list[Callable[[Upstream], None]] = [_phase_1, _phase_2, _phase_3]
DDLS_PER_PHASE = [1, 2, 0]


def _write_workload(registry: str, url: str) -> tuple[dt.datetime, Upstream, list[int]]:
    """Run the phases, phase k inside window k = [origin + k*INTERVAL, +INTERVAL); the
    origin, the upstream, and how many row changes each phase made."""
    origin = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)
    with TxnWriter(url, registry=registry, sync_commit_binlog=True) as writer:
        up = Upstream(writer)
        sizes: list[int] = []
        for k, phase in enumerate(PHASES):
            # Half a second into the window, so even a DDL's start_ts is inside it.
            start = origin + k * INTERVAL + dt.timedelta(seconds=0.5)
            time.sleep(max(0.0, (start - dt.datetime.now(dt.UTC)).total_seconds()))
            before = len(up.changes)
            phase(up)
            sizes.append(len(up.changes) - before)
            # A phase is a few transactions (well under a second), but the machine is shared:
            # if one ever ran past its window, the expectations below would be wrong.
            assert dt.datetime.now(dt.UTC) < origin + (k + 1) * INTERVAL, f"phase {k + 1} overran its window"
        writer.flush()
    return origin, up, sizes


def _wait_safe_ts(registry: str, ts: int, timeout: float) -> None:
    def passed() -> bool:
        with RegistryClient(registry) as reg:
            nodes, _ = reg.list_nodes("pump")
        return len(nodes) == 2 and all(n.state == "online" and n.safe_ts >= ts for n in nodes)

    wait_until(passed, timeout, 0.5, f"both Pumps' safe ts to pass {tso.format_ts(ts)}")


class Api:
    """Airflow's REST API (/api/v2) of the stack; the stack's UI needs no login."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v2"

    def get(self, path: str) -> Any:
        return read_json(f"{self.base}{path}", timeout=20)

    def runs(self) -> list[dict[str, Any]]:
        return self.get("/dags/binlake_ingest/dagRuns?limit=100")["dag_runs"]

    def task_states(self, run_id: str) -> dict[str, str | None]:
        tis = self.get(f"/dags/binlake_ingest/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in tis}


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _backfill(env_sh: pathlib.Path, cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`airflow backfill create ...` in a shell that sourced the stack's env.sh, and
    nothing else of this test session's Airflow or binlake settings."""
    return subprocess.run(["bash", "-c", '. "$0" && exec airflow backfill create "$@"', str(env_sh), *args],
                          cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=300)


def _create_backfill_sqlite(api: Api, env_sh: pathlib.Path, cwd: pathlib.Path, *args: str) -> None:
    """`airflow backfill create` on SQLite metadata, rerun when SQLite refused it half way
    (the fallback of a machine without PostgreSQL; on PostgreSQL it must work at once).

    Airflow commits the backfill row, then creates each run inside a savepoint
    that reads before it writes; on SQLite a scheduler commit in between makes
    that write fail at once with "database is locked" (a stale snapshot, which
    no lock timeout waits out). The command then leaves a backfill with no runs,
    which the scheduler marks completed; the user's remedy, and this test's, is
    to run the command again once it has. A refusal after a run was created
    is not retried: that would be a different backfill than the one asked for."""
    for _attempt in range(3):
        done = _backfill(env_sh, cwd, *args)
        if done.returncode == 0:
            return
        output = done.stdout + done.stderr
        assert "database is locked" in output and api.runs() == [], output
        wait_until(lambda: all(b["completed_at"] is not None
                               for b in api.get("/backfills?dag_id=binlake_ingest")["backfills"]),
                   120, 1, "the scheduler to close the backfill that SQLite refused")
    raise AssertionError(f"`airflow backfill create` was refused three times: {output}")


def _wait_backfill_done(api: Api, timeout: float) -> dict[str, Any]:
    """The backfill (the last one created), once the scheduler marked it completed;
    fails at once if a run failed."""
    deadline = time.monotonic() + timeout
    while True:
        backfill = max(api.get("/backfills?dag_id=binlake_ingest")["backfills"], key=lambda b: b["id"])
        failed = [r for r in api.runs() if r["state"] == "failed"]
        if failed:
            raise AssertionError(f"backfill runs failed: {[(r['dag_run_id'], api.task_states(r['dag_run_id'])) for r in failed]}")
        if backfill["completed_at"] is not None:
            return backfill
        if time.monotonic() > deadline:
            states = {r["dag_run_id"]: (r["state"], api.task_states(r["dag_run_id"])) for r in api.runs()}
            raise AssertionError(f"the backfill did not complete in {timeout:g}s: {states}")
        time.sleep(0.5)


@contextlib.contextmanager
def _spark() -> Iterator[SparkSession]:
    from binlake.lake.sparkenv.session import build_spark

    # A session another test module left running is reused and left running.
    owned = SparkSession.getActiveSession() is None
    session = build_spark("binlake-backfill-test", "local[2]", shuffle_partitions=2,
                          extra_conf={"spark.databricks.delta.snapshotPartitions": "2"})
    try:
        yield session
    finally:
        if owned:
            session.stop()


def _upstream_rows(url: str, table: str) -> dict[int, dict[str, Any]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(sa.text(f"SELECT * FROM {table}")).mappings()}
    finally:
        engine.dispose()


@pytest.fixture
def stack_dir() -> Iterator[pathlib.Path]:
    """The stack's directory, under one every user may enter: Airflow's PostgreSQL
    runs as the ``postgres`` user when the tests run as root (pytest's tmp_path is 0700)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="binlake-backfill-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_backfill_fills_historical_windows_newest_first(stack_dir: pathlib.Path) -> None:
    tmp_path = stack_dir
    port, registry = free_port(), f"127.0.0.1:{free_port()}"
    url = f"sqlite:///{tmp_path / 'app.db'}"
    api = Api(port)
    # The stack's Spark Connect server, sized for windows of a few rows as the test
    # session's own (tests/conftest.py): Spark's defaults (200 shuffle and 50
    # Delta snapshot partitions) make each tiny ingest take minutes on two cores
    # (C1 only and the serial GC shorten the JVM's start). spark-submit, which
    # starts the server's JVM, reads SPARK_CONF_DIR.
    spark_conf = tmp_path / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text(
        "spark.sql.shuffle.partitions 2\n"
        "spark.databricks.delta.snapshotPartitions 2\n"
        "spark.driver.extraJavaOptions -XX:+UseSerialGC -XX:TieredStopAtLevel=1\n")
    env = {**STACK_ENV, "SPARK_CONF_DIR": str(spark_conf)}
    with binlake_up(["--data-dir", "state", "--registry-addr", registry, "--pumps", "2", "--pump-port-base", "0",
                     "--airflow-port", str(port), "--spark-connect-port", str(free_port()), PUMP_ARGS],
                    tmp_path, env=env) as up:
        # The stack says where each Pump is once both are online: the workload runs
        # while the Connect server and Airflow start.
        up.wait_for("binlake up: pump2 on", timeout=120)
        origin, upstream, phase_sizes = _write_workload(registry, url)
        up.wait_for("binlake up: preparing Airflow metadata", timeout=300)
        # PostgreSQL wherever its server is installed (SQLite only as the fallback).
        on_postgres = "preparing Airflow metadata in PostgreSQL" in up.output
        assert on_postgres or not LocalPostgres.available(), up.output
        windows = [(origin + k * INTERVAL, origin + (k + 1) * INTERVAL) for k in range(len(PHASES))]
        window_ts = [(tso.from_datetime(a), tso.from_datetime(b)) for a, b in windows]
        up.wait_for("Press Ctrl-C", timeout=300)
        _wait_safe_ts(registry, window_ts[-1][1], timeout=60)
        wait_until(lambda: any(d["dag_id"] == "binlake_ingest" for d in api.get("/dags")["dags"]), 120, 1,
                   "the DAG processor to parse binlake_ingest")
        dag = api.get("/dags/binlake_ingest")
        # Unpaused (a paused DAG's backfill runs would never start), and no run of its own.
        assert dag["is_paused"] is False and api.runs() == []

        started = time.monotonic()
        env_sh = tmp_path / "state" / "airflow" / "env.sh"
        if on_postgres:
            # One backfill of the three windows while the scheduler runs: `airflow backfill
            # create` works at the first try.
            done = _backfill(env_sh, tmp_path, "--dag-id", "binlake_ingest",
                             "--from-date", windows[0][0].isoformat(), "--to-date", windows[-1][0].isoformat(),
                             "--run-backwards", "--max-active-runs", "1")
            assert done.returncode == 0, done.stdout + done.stderr
            backfill = _wait_backfill_done(api, timeout=600)
            assert len(api.get("/backfills?dag_id=binlake_ingest")["backfills"]) == 1
        else:
            _create_backfill_sqlite(api, env_sh, tmp_path, "--dag-id", "binlake_ingest",
                                    "--from-date", windows[0][0].isoformat(), "--to-date", windows[-1][0].isoformat(),
                                    "--run-backwards", "--max-active-runs", "1")
            backfill = _wait_backfill_done(api, timeout=600)
        print(f"backfill of {len(windows)} windows took {time.monotonic() - started:.0f}s")
        assert (backfill["max_active_runs"], backfill["is_paused"]) == (1, False)

        # One run per window, every task as expected, and nothing else ran.
        runs = sorted(api.runs(), key=lambda r: r["logical_date"])
        assert [(r["run_type"], r["state"]) for r in runs] == [("backfill", "success")] * len(windows)
        assert [(_when(r["data_interval_start"]), _when(r["data_interval_end"])) for r in runs] == windows
        for run in runs:
            assert api.task_states(run["dag_run_id"]) == TASK_STATES, run["dag_run_id"]
        # Newest window first, one run at a time.
        by_start = sorted(runs, key=lambda r: r["start_date"])
        assert by_start == runs[::-1]
        assert all(_when(a["end_date"]) <= _when(b["start_date"]) for a, b in zip(by_start, by_start[1:], strict=False))

        # Stop the stack now, as Ctrl-C does, while Spark reads the lake: Airflow takes
        # a while to stop, and the lake needs nothing of the stack.
        up.proc.send_signal(signal.SIGINT)
        with _spark() as spark:
            def load(name: str) -> list[Any]:
                return spark.read.format("delta").load(location.table_path(str(tmp_path / "state" / "lake"), name)).collect()

            lake_windows = sorted(load("windows"), key=lambda w: w.start_ts)
            lake_changes = sorted(load("changes"), key=lambda r: (r.commit_ts, r.seq))
            ddl_rows = load("ddl_history")
        assert up.proc.wait(120) == 0, up.output

    expected = upstream.changes
    # The workload really spans the windows: phase k committed inside window k.
    per_window = [[c for c in expected if a <= c.commit_ts < b] for a, b in window_ts]
    assert [len(p) for p in per_window] == phase_sizes

    # windows: exactly the backfilled intervals, done, each with its own changes and DDLs.
    assert [(w.start_ts, w.end_ts, w.status, list(w.pumps)) for w in lake_windows] == [
        (a, b, "done", ["pump1", "pump2"]) for a, b in window_ts]
    assert [w.rows for w in lake_windows] == [len(p) for p in per_window]
    assert [w.ddls for w in lake_windows] == DDLS_PER_PHASE
    assert [dict(w.rows_per_table_op) for w in lake_windows] == [
        dict(collections.Counter(f"main.{c.tbl}:{c.op}" for c in p)) for p in per_window]
    # Ingested newest first, as the runs ran.
    assert [w.ingested_at for w in lake_windows] == sorted((w.ingested_at for w in lake_windows), reverse=True)

    # ddl_history: the workload's DDLs, each once, with the definitions the changes are decoded by.
    assert len(ddl_rows) == upstream.ddls
    assert all(window_ts[0][0] <= d.commit_ts < window_ts[-1][1] for d in ddl_rows)
    tables = {(d.table_id, d.schema_version): binlog_pb2.TableInfo.FromString(bytes(d.table_info)) for d in ddl_rows}

    # changes: per table and op, then change by change (key and after image).
    counts = collections.Counter((r.tbl, r.op) for r in lake_changes)
    assert counts == collections.Counter((c.tbl, c.op) for c in expected)
    assert {(r.tbl, r.op) for r in lake_changes} == {
        (t, o) for t in ("items", "events") for o in OPS} - {("events", "update")}
    got = [Change(r.commit_ts, r.tbl, r.op, json.loads(r.keys),
                  image_values(r.after, tables[(r.table_id, r.schema_version)])) for r in lake_changes]

    def order(c: Change) -> tuple[int, str, str, int]:
        return c.commit_ts, c.tbl, c.op, c.key["id"]

    assert sorted(got, key=order) == sorted(expected, key=order)
    # Inside a transaction, seq numbers its changes 0..n-1.
    seqs: dict[int, list[int]] = collections.defaultdict(list)
    for r in lake_changes:
        seqs[r.commit_ts].append(r.seq)
    assert all(s == list(range(len(s))) for s in seqs.values())

    # Replaying the changes gives the upstream's final rows (columns added later are NULL
    # in rows last written before them), and so does the test's own model.
    replayed: dict[str, dict[int, dict[str, Any]]] = {"items": {}, "events": {}}
    for c in got:
        if c.after is None:
            del replayed[c.tbl][c.key["id"]]
        else:
            replayed[c.tbl][c.key["id"]] = c.after
    for table, rows in replayed.items():
        upstream_rows = _upstream_rows(url, table)
        columns = [col.name for col in upstream.writer.table(table).columns]
        assert {k: {col: row.get(col) for col in columns} for k, row in rows.items()} == upstream_rows, table
        assert upstream.rows[table] == upstream_rows, table
