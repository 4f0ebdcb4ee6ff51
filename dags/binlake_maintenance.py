"""
### binlake_maintenance: snapshots, history tables, OPTIMIZE/VACUUM, Pump GC report

Daily. Each task is idempotent (running a day again changes nothing new):

1. **snapshot** — a typed snapshot of every table at the end of the `windows`
   ledger's contiguous windows (T = that end - 1), unless one is there already;
   restores after it start from it.
2. **history** — the SCD2 history tables brought up to the same end.
3. **optimize_vacuum** — Delta OPTIMIZE and VACUUM of every lake table. VACUUM
   keeps every file of the current versions, which is all a restore reads, so
   no restore the ledger promises breaks; its retention
   (`binlake_vacuum_retention_hours`, default 168, at least 1) protects readers of older
   versions still running.
4. **gc_report** — each Pump's GC ts against the oldest ts the lake has not
   ingested; **fails** when a Pump already removed binlogs the lake never
   ingested, or will within `binlake_gc_margin_hours` (default 24) of the run's
   data interval end.

Settings as for `binlake_ingest` (`binlake_lake`, `binlake_registry`,
`binlake_spark_master`), read when tasks run. Every task is a client of the
always-on Spark Connect server when `binlake_spark_remote` /
`BINLAKE_SPARK_REMOTE` is set (as `binlake up` sets it), else runs a `local[*]`
session (or `binlake_spark_master`'s) in its own process.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import dag, task
from binlake_airflow import restore_tasks


@dag(
    dag_id="binlake_maintenance",
    doc_md=__doc__,
    schedule="@daily",
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    # Only today's state matters: a missed day is covered by the next run.
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": dt.timedelta(minutes=5)},
    tags=["binlake", "maintenance"],
)
def binlake_maintenance() -> None:
    @task
    def snapshot() -> dict[str, Any]:
        return restore_tasks.snapshot_latest()

    @task
    def history(snapped: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.history_update()

    @task
    def optimize_vacuum(updated: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.optimize_vacuum()

    @task
    def gc_report(data_interval_end: dt.datetime | None = None) -> dict[str, Any]:
        return restore_tasks.gc_report(data_interval_end)

    # TaskFlow: a task called in the DAG body takes XComArgs (and indexes them) where the
    # function takes values; Airflow resolves them at run time, its types cannot say so.
    optimize_vacuum(history(snapshot()))  # type: ignore[arg-type]
    gc_report()


binlake_maintenance()
