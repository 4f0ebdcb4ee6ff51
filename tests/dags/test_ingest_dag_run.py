"""Real runs of ``binlake_ingest``: ``dag.test`` against a migrated SQLite metadata
database, a registry and two Pumps as processes, and an upstream written by
TxnWriter. The runs go through every task (plan, the deferrable wait with its
trigger run inline, the ingest, publish) and the test reads the Delta change
table back with Spark.

- in-process ingest of a window whose end a Pump's safe ts has not passed when
  the run starts (a pending transaction holds it back until the wait step has
  deferred, so the wait really defers until the Pumps' safe ts passes it);
- the same window again through spark-submit (the SparkSubmitOperator with a
  ``spark_default`` connection at ``local[2]``): the table is unchanged;
- the same window through spark-submit on a Spark standalone cluster into a
  fresh lake: the same change and window rows as the local run;
- a Pump killed (kill -9) while the in-process ingest reads the window: the
  try fails naming the Pump, Airflow retries it once the Pump is back, and the
  window holds exactly what it held;
- a window overlapping the ingested one with other bounds fails at once
  through spark-submit (the job's EXIT_FINAL), without spending retries;
- a window below a Pump's GC ts fails in plan, naming the Pump and its GC ts,
  without retrying.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import pathlib
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pumpkit import dag_cluster, now_ts, prewrite, rollback, status, write_one
from pyspark.sql import SparkSession

from binlake import tso
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.registry.server import RegistryServer
from binlake.sql.schema import ColumnDef as C
from binlake.testing.devcluster import DevCluster
from binlake.writer.txn_writer import TxnWriter

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"
VENV_BIN = str(pathlib.Path(sys.executable).parent)


@dataclasses.dataclass
class Written:
    """The upstream transactions of the test and the change rows they must give."""

    expected: list[tuple[int, int, str, str, dict[str, Any]]]  # commit_ts, seq, tbl, op, key
    after: dict[tuple[int, int], dict[str, Any] | None]  # (commit_ts, seq) -> after image
    last_commit_ts: int
    # The end of the 5-minute window the runs ingest (set by the first run).
    logical_date: dt.datetime | None = None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    yield from dag_cluster(tmp_path_factory.mktemp("cluster"), pumps=2)


@pytest.fixture(scope="module")
def written(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Written:
    url = f"sqlite:///{tmp_path_factory.mktemp('upstream') / 'app.db'}"
    expected: list[tuple[int, int, str, str, dict[str, Any]]] = []
    after: dict[tuple[int, int], dict[str, Any] | None] = {}
    with TxnWriter(url, registry=cluster.registry_addr, sync_commit_binlog=True) as w:
        w.create_table("items", [C("id", "int", nullable=False), C("name", "string", length=32), C("qty", "int")],
                       ["id"])
        txns: list[list[tuple[str, dict[str, Any], dict[str, Any] | None]]] = [
            [("insert", {"id": i}, {"id": i, "name": f"item{i}", "qty": i * 10}) for i in (1, 2, 3)],
            [("update", {"id": 2}, {"id": 2, "name": "item2", "qty": 25})],
            [("delete", {"id": 3}, None), ("insert", {"id": 4}, {"id": 4, "name": None, "qty": 0})],
            [("update", {"id": 1}, {"id": 1, "name": "first", "qty": 10})],
        ]
        for changes in txns:
            with w.transaction() as txn:
                for op, key, row in changes:
                    if op == "insert":
                        txn.insert("items", row)
                    elif op == "update":
                        txn.update("items", key, {k: v for k, v in row.items() if k != "id"})
                    else:
                        txn.delete("items", key)
            info = txn.info
            assert info is not None
            for seq, (op, key, row) in enumerate(changes):
                expected.append((info.commit_ts, seq, "items", op, key))
                after[(info.commit_ts, seq)] = row
        w.flush()
    return Written(expected=expected, after=after, last_commit_ts=max(c[0] for c in expected))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture
def ingest_dag(airflow_db: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    # dag.test() in Airflow 3.3 fails a run that declares a DeadlineAlert when it
    # succeeds (it looks the alert up by its serialized form instead of the id the
    # scheduler's DAG sync gives it). The deadline is parsed from the environment, so
    # these dag.test() runs parse the DAG without it; tests/e2e/test_dag_journeys.py
    # runs it with the deadline under the real scheduler.
    monkeypatch.setenv("BINLAKE_INGEST_DEADLINE", "off")
    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["binlake_ingest"]


@dataclasses.dataclass
class Run:
    state: str
    tasks: dict[str, str]  # task id -> state
    xcoms: dict[str, Any]  # task id -> return value
    seconds: float
    run_id: str = ""


def _run(dag: Any, logical_date: dt.datetime) -> Run:
    """dag.test for one logical date, and what it left in the metadata DB."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    started = time.monotonic()
    dr = dag.test(logical_date=logical_date)
    took = time.monotonic() - started
    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag.dag_id,
                                                         TaskInstance.run_id == dr.run_id)).all()
        states = {ti.task_id: str(ti.state) if ti.state else "none" for ti in tis}
        xcoms = {x.task_id: x.value for x in session.scalars(
            select(XComModel).where(XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id,
                                    XComModel.key == "return_value"))}
    xcoms = {k: json.loads(v) if isinstance(v, str) else v for k, v in xcoms.items()}
    return Run(str(dr.state), states, xcoms, took, dr.run_id)


def _asset_events(lake: pathlib.Path) -> list[dict[str, Any]]:
    """The lake-changes events of runs into ``lake`` (other modules' runs share the
    session's metadata database)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == "binlake://lake/changes").order_by(AssetEvent.id)
        ).all()
        return [dict(e.extra) for e in rows if (e.extra or {}).get("lake") == str(lake)]


def _changes(spark: SparkSession, lake: pathlib.Path, start_ts: int, end_ts: int) -> list[tuple]:
    df = spark.read.format("delta").load(str(lake / "changes"))
    rows = df.where(f"commit_ts >= {start_ts} AND commit_ts < {end_ts}").collect()
    return sorted((r.commit_ts, r.seq, r.tbl, r.op, r.keys, r.after, r.pump) for r in rows)


def _window_rows(spark: SparkSession, lake: pathlib.Path) -> list[tuple[int, int, int, str]]:
    rows = spark.read.format("delta").load(str(lake / "windows")).collect()
    return sorted((r.start_ts, r.end_ts, r.rows, r.status) for r in rows)


def _settings(mp: pytest.MonkeyPatch, cluster: DevCluster, lake: pathlib.Path, mode: str) -> None:
    mp.setenv("BINLAKE_REGISTRY", cluster.registry_addr)
    mp.setenv("BINLAKE_LAKE_DIR", str(lake))
    mp.setenv("BINLAKE_INGEST_MODE", mode)
    mp.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    mp.setenv("BINLAKE_SAFE_TS_POLL_S", "0.2")


def _ingested_window(mp: pytest.MonkeyPatch, cluster: DevCluster, lake: pathlib.Path, written: Written,
                     spark: SparkSession, mode: str) -> tuple[int, int, list[tuple]]:
    """Settings for a run of ``mode`` over the window the in-process test ingested:
    (start_ts, end_ts, the change rows it holds)."""
    assert written.logical_date is not None, "runs after the in-process test"
    _settings(mp, cluster, lake, mode)
    if mode == "spark-submit":
        # spark_default as `binlake up` creates it (local master), and spark-submit from the venv.
        mp.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
        mp.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    end_ts = tso.from_datetime(written.logical_date)
    start_ts = tso.from_datetime(written.logical_date - dt.timedelta(minutes=5))
    before = _changes(spark, lake, start_ts, end_ts)
    assert before, "runs after the in-process test"
    return start_ts, end_ts, before


class _HoldSafeTsUntilDeferred:
    """Holds a Pump's safe ts below ``end`` until the run's wait step has deferred,
    then lets it go: a prewrite of a transaction no writer will resolve (the Pump
    asks the upstream only after its 10-minute txn timeout) keeps the safe ts at
    or below the ts the Pump had seen when it arrived (binlake.pump.sorter), and
    its rollback releases it. The wait step has deferred once its trigger is in
    the metadata database (dag.test then runs it inline, in this process).

    However long dag.test takes to reach the wait step, the window is still open
    then, and the run needs no wall-clock margin (a window ending a minute ahead
    cost that minute)."""

    def __init__(self, pump_addr: str, start_ts: int) -> None:
        self.pump_addr, self.start_ts = pump_addr, start_ts
        self.since = dt.datetime.now(dt.UTC)
        write_one(pump_addr, prewrite(start_ts, writer=b"hold"))
        self.deferred = threading.Event()
        self._released = threading.Lock()
        self._done = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _HoldSafeTsUntilDeferred:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.release()  # whatever happened: the module's later runs need the safe ts to move

    def release(self) -> None:
        with self._released:
            if not self._done:
                write_one(self.pump_addr, rollback(self.start_ts))
                self._done = True

    def _watch(self) -> None:
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session
        from sqlalchemy import select

        while not self._stop.wait(0.2):
            with create_session() as session:
                found = session.scalars(select(Trigger.classpath).where(Trigger.created_date >= self.since)).all()
            if any(path.endswith("SafeTsTrigger") for path in found):
                self.deferred.set()
                self.release()
                return


def test_dag_run_ingests_the_window_in_process(
    spark: SparkSession, ingest_dag: Any, cluster: DevCluster, written: Written, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from binlake.registry.client import RegistryClient

    _settings(monkeypatch, cluster, lake, "inprocess")
    # The window [end - 5 min, end) holds every commit and ends after pump1 took the
    # holding prewrite: its safe ts stays below the end until the wait step deferred.
    with RegistryClient(cluster.registry_addr) as reg:
        hold_ts = reg.get_ts()
    with _HoldSafeTsUntilDeferred(cluster.pump_addrs["pump1"], hold_ts) as hold:
        now = dt.datetime.now(dt.UTC)
        written.logical_date = now.replace(microsecond=0) + dt.timedelta(seconds=2)
        end_ts = tso.from_datetime(written.logical_date)
        start_ts = tso.from_datetime(written.logical_date - dt.timedelta(minutes=5))
        assert start_ts < written.expected[0][0] and written.last_commit_ts < hold_ts < now_ts() < end_ts
        assert status(cluster.pump_addrs["pump1"]).safe_ts < end_ts

        run = _run(ingest_dag, written.logical_date)
    assert hold.deferred.is_set(), "the wait step never deferred"
    assert run.state == "success", run.tasks
    assert run.tasks == {"plan": "success", "wait": "success", "choose_ingest": "success",
                         "ingest": "skipped", "ingest_inprocess": "success", "publish": "success"}
    # The wait went through the triggerer (run inline by dag.test) and resumed.
    assert run.xcoms["wait"]["deferred"] is True
    assert min(run.xcoms["wait"]["safe_ts"].values()) >= end_ts

    rows = _changes(spark, lake, start_ts, end_ts)
    assert [(c, s, t, o, json.loads(k)) for c, s, t, o, k, _a, _p in rows] == written.expected
    for c, s, _t, _o, _k, after, pump in rows:
        assert (json.loads(after) if after is not None else None) == written.after[(c, s)]
        assert pump in ("pump1", "pump2")
    assert _window_rows(spark, lake) == [(start_ts, end_ts, len(written.expected), "done")]

    (event,) = _asset_events(lake)
    assert (event["start_ts"], event["end_ts"]) == (start_ts, end_ts)
    assert event["start"].startswith((written.logical_date - dt.timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S"))
    assert event["pumps"] == ["pump1", "pump2"]
    assert set(event["safe_ts"]) == {"pump1", "pump2"} and min(event["safe_ts"].values()) >= end_ts
    assert event["mode"] == "inprocess" and event["lake"] == str(lake)
    assert event["ingest"]["rows"] == len(written.expected)


def test_dag_run_through_spark_submit_replaces_the_window(
    ingest_dag: Any, cluster: DevCluster, written: Written, spark: SparkSession, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_ts, end_ts, before = _ingested_window(monkeypatch, cluster, lake, written, spark, "spark-submit")

    run = _run(ingest_dag, written.logical_date)
    assert run.state == "success", run.tasks
    assert run.tasks["ingest"] == "success" and run.tasks["ingest_inprocess"] == "skipped"
    # A past window: the wait finds it closed at once, without deferring.
    assert run.xcoms["wait"]["deferred"] is False
    # The same window again: replaced, not appended.
    assert _changes(spark, lake, start_ts, end_ts) == before
    assert _window_rows(spark, lake) == [(start_ts, end_ts, len(written.expected), "done")]
    event = _asset_events(lake)[-1]
    assert (event["start_ts"], event["end_ts"], event["mode"]) == (start_ts, end_ts, "spark-submit")
    assert "ingest" not in event


def test_dag_run_on_a_standalone_cluster_equals_the_local_run(
    ingest_dag: Any, cluster: DevCluster, written: Written, spark: SparkSession, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path,
) -> None:
    """The same window through spark-submit on a Spark standalone cluster (a master and a
    worker on loopback, started from the pyspark wheel), into a fresh lake: the change
    and window rows equal the local run's. binlake_spark_master names the cluster, over a
    spark_default connection that still says local[2]. The data source runs on the
    executors, which must import the binlake the driver ships them: the worker's own
    Python path holds a binlake that refuses to import, so the run fails unless they do."""
    from binlake.stack.sparkcluster import SparkCluster

    start_ts, end_ts, before = _ingested_window(monkeypatch, cluster, lake, written, spark, "spark-submit")
    cluster_lake = tmp_path / "cluster-lake"
    decoy = tmp_path / "worker-site" / "binlake"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text(
        'raise ImportError("an executor imported the worker\'s binlake, not the one the driver ships")\n')
    worker_env = {**os.environ, "PYTHONPATH": str(decoy.parent)}
    with SparkCluster(tmp_path / "spark", workers=1, cores=1, memory="1g", env=worker_env) as sc:
        monkeypatch.setenv("BINLAKE_LAKE_DIR", str(cluster_lake))
        monkeypatch.setenv("BINLAKE_SPARK_MASTER", sc.master_url)
        run = _run(ingest_dag, written.logical_date)
        apps = (sc._status() or {}).get("completedapps", []) + (sc._status() or {}).get("activeapps", [])
    assert run.state == "success", run.tasks
    assert run.tasks["ingest"] == "success" and run.tasks["ingest_inprocess"] == "skipped"
    # The job ran on the cluster: its master saw the one ingest application (the job names it).
    assert [a["name"] for a in apps] == ["binlake-ingest"], apps
    assert _changes(spark, cluster_lake, start_ts, end_ts) == before
    assert _window_rows(spark, cluster_lake) == _window_rows(spark, lake)


class _KillPumpWhenReading(logging.Handler):
    """Kills a Pump (kill -9) the moment the ingest task logs that it starts reading
    the window, and starts it again, from another thread, once that try has failed
    (the task instance is up for retry): however slowly Spark starts its tasks, the
    Pump is down while they read."""

    def __init__(self, cluster: DevCluster, pump: str) -> None:
        super().__init__()
        self.cluster, self.pump = cluster, pump
        self.killed = threading.Event()
        self.back = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        # A window's rows are read from the Pumps right after either line: in
        # the task's process (small windows) or by Spark's tasks.
        message = record.getMessage()
        if self.killed.is_set() or not message.startswith(("ingest: reading and writing", "ingest: decoding")):
            return
        self.cluster.kill9(self.pump)
        self.killed.set()
        threading.Thread(target=self._restart_after_the_failed_try, daemon=True).start()

    def _restart_after_the_failed_try(self) -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with create_session() as session:
                waiting = session.scalars(select(TaskInstance.state).where(
                    TaskInstance.dag_id == "binlake_ingest", TaskInstance.task_id == "ingest_inprocess",
                    TaskInstance.state == "up_for_retry")).first()
            if waiting is not None:
                break
            time.sleep(0.2)
        self.cluster.restart(self.pump)
        self.back.set()


def test_pump_killed_during_ingest_fails_the_try_and_the_retry_succeeds(
    ingest_dag: Any, cluster: DevCluster, written: Written, spark: SparkSession, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    start_ts, end_ts, before = _ingested_window(monkeypatch, cluster, lake, written, spark, "inprocess")
    # The DAG's first retry comes 15-30 s after a failure (30 s, exponential
    # backoff); a fixed 15 s keeps the test shorter and leaves pump2 time to restart.
    task = ingest_dag.task_dict["ingest_inprocess"]
    monkeypatch.setattr(task, "retry_delay", dt.timedelta(seconds=15))
    monkeypatch.setattr(task, "retry_exponential_backoff", 0)
    # pump2 stays down until the try has failed; it is back well before the retry.
    killer = _KillPumpWhenReading(cluster, "pump2")
    logger = logging.getLogger("binlake_airflow.ingest_tasks")
    logger.addHandler(killer)
    try:
        with caplog.at_level(logging.INFO):
            run = _run(ingest_dag, written.logical_date)
    finally:
        logger.removeHandler(killer)
        assert killer.back.wait(60), "pump2 did not come back"
    assert killer.killed.is_set()
    assert run.state == "success", run.tasks
    assert run.tasks["ingest_inprocess"] == "success"
    with create_session() as session:
        tries = session.scalars(select(TaskInstanceHistory).where(
            TaskInstanceHistory.dag_id == "binlake_ingest", TaskInstanceHistory.task_id == "ingest_inprocess",
            TaskInstanceHistory.run_id == run.run_id)).all()
        failed_tries = [str(t.state) for t in tries]
    # The first try failed (and was retried), naming the Pump it could not read.
    assert failed_tries and all(s in ("up_for_retry", "failed") for s in failed_tries), failed_tries
    # (the task's failure is logged through Airflow's structlog, to stdout)
    messages = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(r"ingest failed, will retry: .*pump pump2 at 127\.0\.0\.1:\d+ is unreachable", messages), \
        messages[-3000:]
    # Nothing lost, nothing twice: the window holds what it held.
    assert _changes(spark, lake, start_ts, end_ts) == before
    assert _window_rows(spark, lake) == [(start_ts, end_ts, len(written.expected), "done")]


def test_overlapping_window_fails_without_retrying(
    ingest_dag: Any, cluster: DevCluster, written: Written, spark: SparkSession, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_ts, end_ts, before = _ingested_window(monkeypatch, cluster, lake, written, spark, "spark-submit")
    # A manual run a minute earlier: its window overlaps the ingested one with other bounds.
    run = _run(ingest_dag, written.logical_date - dt.timedelta(minutes=1))
    assert run.state == "failed"
    # spark-submit exited with EXIT_FINAL: failed at the first try, no retries spent.
    assert run.tasks["ingest"] == "failed" and run.tasks["publish"] == "upstream_failed"
    assert _changes(spark, lake, start_ts, end_ts) == before
    assert _window_rows(spark, lake) == [(start_ts, end_ts, len(written.expected), "done")]


def test_window_below_a_pumps_gc_ts_fails_with_its_message(
    ingest_dag: Any, registry: RegistryServer, reg: RegistryClient, lake: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from binlake_airflow import ingest_tasks

    # A registry whose Pump has collected everything before a minute ago.
    gc_ts = now_ts(-60_000)
    stored = reg.register(NodeRecord(node_id="pump7", kind="pump", addr="127.0.0.1:9"))
    reg.heartbeat(dataclasses.replace(stored, safe_ts=now_ts(), gc_ts=gc_ts))
    monkeypatch.setenv("BINLAKE_REGISTRY", registry.addr)
    monkeypatch.setenv("BINLAKE_LAKE_DIR", str(lake))
    monkeypatch.setenv("BINLAKE_INGEST_MODE", "inprocess")
    end = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)

    run = _run(ingest_dag, end)
    assert run.state == "failed"
    # Failed for good at the first try: no retry can bring collected binlogs back.
    assert run.tasks["plan"] == "failed"
    assert {run.tasks[t] for t in ("wait", "choose_ingest", "ingest", "ingest_inprocess", "publish")} == {
        "upstream_failed"}
    assert run.seconds < 60

    with pytest.raises(AirflowFailException) as failed:
        ingest_tasks.plan(end - dt.timedelta(minutes=5), end)
    message = str(failed.value)
    assert "pump pump7's GC ts" in message and tso.format_ts(gc_ts) in message
    assert "removed after their retention" in message
