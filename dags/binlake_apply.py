"""
### binlake_apply: the Delta change table -> target databases

Runs whenever `binlake_ingest` publishes the Asset `binlake://lake/changes`
(and when triggered by hand).

1. **task_files** — the replication task files (setting `binlake_apply_tasks` /
   `BINLAKE_APPLY_TASKS`: a directory of `*.toml` or a comma-separated list;
   default `config/tasks`), each loaded and checked (a bad file, two files with
   one target, a path set but missing: the run fails here, without retries).
   No task file configured: the run is skipped, its log saying where they go.
   **until** — the param `until_ts` (a TSO), else the newest window end the
   triggering Asset events announce.
2. **apply** — one mapped task per task file: every ingested window after the
   target's checkpoint, strictly in commit_ts order, up to that window end,
   exactly once (the checkpoint lives in the target, written with the data).
   The lake is read through the always-on Spark Connect server when
   `binlake_spark_remote` / `BINLAKE_SPARK_REMOTE` is set, else a `local[*]`
   session in the task; the target is written from the task (parallel mode:
   its worker threads, one target connection each).
   A gap in the windows ledger stops it naming the missing window (retried: a
   backfill may fill it). Errors no retry can fix fail at once.
3. **diff** — per task file that names a `diff_source`: `binlake diff` of the
   target against it; a difference fails the task.

One run at a time (`max_active_runs=1`), so windows are never applied out of
order by two runs; a run picks up every window ingested since the last one.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from binlake_airflow import apply_tasks
from binlake_airflow.assets import LAKE_CHANGES


@dag(
    dag_id="binlake_apply",
    doc_md=__doc__,
    schedule=[LAKE_CHANGES],
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 3,
        "retry_delay": dt.timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": dt.timedelta(minutes=10),
    },
    params={"until_ts": Param(None, type=["null", "integer"], minimum=1,
                              description="apply windows up to this commit_ts; empty = every ingested window")},
    tags=["binlake", "apply"],
)
def binlake_apply() -> None:
    @task
    def task_files() -> list[str]:
        return apply_tasks.task_files()

    @task
    def until() -> int | None:
        context = get_current_context()
        events = [e.extra or {} for evs in context["triggering_asset_events"].values() for e in evs]
        return apply_tasks.until_param(context["params"].get("until_ts")) or apply_tasks.until_ts(events)

    @task(max_active_tis_per_dagrun=2)
    def apply(task_file: str, until_ts: int | None) -> dict[str, Any]:
        return apply_tasks.apply(task_file, until_ts)

    @task
    def diff(result: dict[str, Any]) -> dict[str, Any]:
        return apply_tasks.diff(result)

    applied = apply.partial(until_ts=until()).expand(task_file=task_files())
    diff.expand(result=applied)


binlake_apply()
