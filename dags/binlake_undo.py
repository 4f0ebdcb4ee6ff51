"""
### binlake_undo: put back the rows a bad change touched

Triggered by hand (no schedule). For every key the chosen changes touched, the
target gets back the image it had before the first of them, if it still holds
the image the last of them left; any other row is a conflict.

Params (checked by **check**, the first task, which fails without retries
naming the param):
- `start`, `end` — the changes with commit_ts in `[start, end)`: TSOs or
  datetimes (ISO-8601, in `tz`, else the worker's local time); **or**
- `txn` — start_ts values of exact transactions, comma-separated;
- `tables` — TABLE or DB.TABLE names as named today; empty = every table touched;
- `where` — a Spark SQL predicate over the change rows (`op`, `db`, `table`,
  `commit_ts`, `start_ts`, `before.COL`, `after.COL`);
- `target` — the database to revert (a SQLAlchemy URL);
- `dry_run` — **true by default**: plan only, nothing written;
- `skip_conflicts` — revert every key but the conflicting ones; `force` —
  overwrite them too; `max_conflicts` — how many conflicts the plan lists.

Tasks: **check** -> **plan** (the plan, the conflicts and the first 64,000
characters of the SQL as its output; the whole SQL in `LAKE/undo/<run_id>.sql`;
nothing written to the target) -> **undo** (skipped in a dry run; one target
transaction, recorded in `_binlake_undo`: a retry or a second run is a no-op).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from binlake_airflow import undo_tasks

_TIME = r"^$|^\d+$|^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?([+-]\d{2}:\d{2}|Z)?$"


@dag(
    dag_id="binlake_undo",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    tags=["binlake", "undo"],
    params={
        "start": Param(None, type=["null", "string"], pattern=_TIME,
                       description="first commit_ts to undo (inclusive): a TSO or an ISO-8601 datetime"),
        "end": Param(None, type=["null", "string"], pattern=_TIME,
                     description="end of the range (exclusive): a TSO or an ISO-8601 datetime"),
        "tz": Param(None, type=["null", "string"], description="zone of the datetimes, e.g. Europe/Paris"),
        "txn": Param(None, type=["null", "string"], pattern=r"^[\d,\s]*$",
                     description="instead of start/end: start_ts values of transactions, comma-separated"),
        "tables": Param(None, type=["null", "string"], description="TABLE or DB.TABLE, comma-separated; empty = all"),
        "where": Param(None, type=["null", "string"],
                       description="Spark SQL predicate over op, db, table, commit_ts, start_ts, before, after"),
        "target": Param(None, type=["null", "string"], pattern=r"^$|^[A-Za-z0-9+_.-]+://",
                        description="SQLAlchemy URL of the database to revert"),
        "dry_run": Param(True, type="boolean", description="plan only (the default): nothing written"),
        "skip_conflicts": Param(False, type="boolean", description="revert every key but the conflicting ones"),
        "force": Param(False, type="boolean", description="overwrite conflicting keys too"),
        "max_conflicts": Param(20, type="integer", minimum=0, description="conflicts listed in the plan"),
    },
)
def binlake_undo() -> None:
    @task
    def check() -> dict[str, Any]:
        context = get_current_context()
        return undo_tasks.check(context["params"], str(context["run_id"]))

    @task
    def plan(resolved: dict[str, Any]) -> dict[str, Any]:
        return undo_tasks.plan(resolved)

    @task
    def undo(resolved: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
        return undo_tasks.undo(resolved, planned)

    # TaskFlow: a task called in the DAG body takes XComArgs where the function takes values.
    r = check()
    planned = plan(r)  # type: ignore[arg-type]
    undo(r, planned)  # type: ignore[arg-type]


binlake_undo()
