"""The ingest DAG through a Pump host lost for good, with replicated Pumps.

R = W = 2 (the writers' and readers' configuration), three Pumps as processes and a
real TxnWriter workload going on all along. Once the workload has written, one
Pump is killed (kill -9) and its data directory deleted. ``dag.test`` runs of
``binlake_ingest`` over the next consecutive windows (a 10 s schedule) then
succeed through every task - plan, the deferrable wait with its trigger, the
in-process ingest, publish - reading each window from the two Pumps left: the
wait never waits for the dead one (the longest time from a window's end to its
wait step finishing is measured), and each window holds every transaction the
two live Pumps serve for it.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import shutil
import threading
from typing import Any

import pytest
from pumpkit import Processes, three_pumps, wait_until
from pyspark.sql import SparkSession

from binlake import tso
from binlake.client.reader import pull_window
from binlake.workload import plan as wplan
from binlake.workload import run as wrun
from binlake.writer.txn_writer import TxnWriter

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"
WINDOW_S = 10
VICTIM = "p2"


def _window_wait_s(dag_id: str, run_id: str, window_end: dt.datetime) -> float:
    """Seconds the run's wait step spent after the window closed: from the later of
    the window's end and the step's start, to the step's end."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        began, ended = session.execute(select(TaskInstance.start_date, TaskInstance.end_date).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == "wait")).one()
    assert began is not None and ended is not None
    return (ended - max(began, window_end)).total_seconds()


def _xcoms(dag_id: str, run_id: str) -> dict[str, Any]:
    import json

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run_id,
                                                       XComModel.key == "return_value")).all()
        return {x.task_id: json.loads(x.value) if isinstance(x.value, str) else x.value for x in rows}


def test_ingest_dag_keeps_producing_windows_without_a_dead_pump(
    procs: Processes, tmp_path: pathlib.Path, spark: SparkSession, airflow_db: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("BINLAKE_CLIENT_REPLICAS", "2")
    monkeypatch.setenv("BINLAKE_CLIENT_MIN_ACKS", "2")
    reg_addr, _ports, pumps = three_pumps(procs, tmp_path)
    lake = tmp_path / "lake"
    for key, value in {"BINLAKE_REGISTRY": reg_addr, "BINLAKE_LAKE_DIR": str(lake),
                       "BINLAKE_INGEST_MODE": "inprocess", "BINLAKE_SPARK_MASTER": "local[2]",
                       "BINLAKE_SAFE_TS_POLL_S": "0.2", "BINLAKE_INGEST_SCHEDULE": f"{WINDOW_S}s",
                       # Airflow 3.3's dag.test fails a succeeded run that declares a DeadlineAlert
                       # (see tests/dags/test_ingest_dag_run.py): parse the DAG without it.
                       "BINLAKE_INGEST_DEADLINE": "off"}.items():
        monkeypatch.setenv(key, value)
    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["binlake_ingest"]

    # The upstream writes (R = W = 2) in slices until the last window is ingested.
    upstream = f"sqlite:///{tmp_path / 'upstream.db'}"
    stop = threading.Event()
    slices: list[wrun.Summary] = []
    failure: list[BaseException] = []

    def write() -> None:
        try:
            plan = wplan.plan("mixed", 2, 3000, 5, large_txn_every=0, table_rows=20, accounts=10)
            with TxnWriter(upstream, registry=reg_addr) as tw:
                for i in range(0, len(plan), 30):
                    if stop.is_set():
                        break
                    slices.append(wrun.run(tw, plan[i:i + 30], clients=2, rate=10, progress=False))
        except BaseException as exc:  # reported below
            failure.append(exc)

    writer = threading.Thread(target=write, name="upstream", daemon=True)
    writer.start()
    try:
        wait_until(lambda: len(slices) >= 1 or failure, timeout=120, what="the first slice")
        pumps[VICTIM][0].kill()  # kill -9 ...
        shutil.rmtree(tmp_path / VICTIM)  # ... and its disk is gone for good
        killed = dt.datetime.now(dt.UTC)
        # The next two windows of the schedule's grid (the start date is on a whole minute).
        first_end = killed.replace(microsecond=0) + dt.timedelta(seconds=WINDOW_S - killed.second % WINDOW_S)
        waited: list[float] = []
        for end in (first_end, first_end + dt.timedelta(seconds=WINDOW_S)):
            dr = dag.test(logical_date=end)
            xcoms = _xcoms(dag.dag_id, dr.run_id)
            assert str(dr.state) == "success", xcoms
            # The wait was ready without the dead Pump; the ingest read the two others only.
            assert xcoms["wait"]["pumps"] == ["p1", "p3"], xcoms["wait"]
            result = xcoms["ingest_inprocess"]
            assert result["pumps"] == ["p1", "p3"], result
            start_ts, end_ts = tso.from_datetime(end - dt.timedelta(seconds=WINDOW_S)), tso.from_datetime(end)
            assert (result["start_ts"], result["end_ts"]) == (start_ts, end_ts)
            # Every transaction the live Pumps hold for the window is in it, once.
            live = {n: addr for n, (_svc, addr) in pumps.items() if n != VICTIM}
            served = {b.start_ts for b in pull_window(live, start_ts, end_ts)}
            assert result["txns"] == len(served) > 0, (result, len(served))
            waited.append(_window_wait_s(dag.dag_id, dr.run_id, end))
    finally:
        stop.set()
        writer.join(timeout=120)
    assert failure == [], failure
    assert all(s.errors == 0 and not s.gave_up for s in slices), [s.error_messages[:2] for s in slices]
    longest = max(waited)
    print(f"windows after the loss: {len(waited)}; longest wait of a closed window in its wait step: "
          f"{longest:.1f}s ({', '.join(f'{w:.1f}' for w in waited)})")
    # Waiting for the dead Pump would never end. The trigger skips it as soon as its Status
    # call fails (window.pump_views, as the read plan); the margin is the trigger's polls
    # (0.2 s) and dag.test's handling of the deferral on a loaded machine.
    assert longest < 30, waited
