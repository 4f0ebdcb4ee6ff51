"""
### binlake_restore: every table as of a commit_ts

Triggered by hand (no schedule). Semantics are Reparo's stop-tso: every
transaction with commit_ts <= T is in, none after.

Params (checked in the trigger form, then again by **resolve**):
- `commit_ts` — T as a TSO, **or** `datetime` (ISO-8601) with `tz` (an IANA
  zone; empty = the worker's local time, as Reparo reads its stop datetime);
- `tables` — names (`TABLE` or `DB.TABLE`, as named at T), comma-separated;
  empty = every table;
- `out` — an absolute directory (or URI) for typed Delta tables, **or** `target`
  — a SQLAlchemy URL to create and load the tables in (staged under
  `LAKE/restores/<run_id>`);
- `verify` — with `target`: a source database URL to compare with (`binlake diff`);
  its summary is the verify task's XCom;
- `replace` — overwrite tables already in `out`; with `target`, replace tables
  another run (or a person) made there. Without it such a target is refused; a
  retry of the same run always replaces what that run created (each table a
  restore creates is claimed in the target's `_binlake_restore_claims`).
- `rename` — `OLD=NEW` pairs, comma-separated (e.g. `shop.orders=shop.orders_0903`):
  OLD one of the restored tables, NEW `TABLE` or `DB.TABLE` (a DB equal to OLD's
  keeps the table where the others go; another DB is a PostgreSQL schema / MariaDB
  database). With `out`, the directory `OUT/<db>.<table>` takes the new name.
- `into_schema` — every table into this PostgreSQL schema / MariaDB database
  (created if missing; refused for SQLite and DuckDB targets); a `rename` may then
  give `TABLE` or `into_schema.TABLE` only. With `out`: directories `OUT/S.<table>`.
  Neither goes with `verify` (it compares tables under their own names).

Tasks: **resolve** (params -> T) -> **check_coverage** (every table's base and
the `windows` ledger: a T above the newest window, in a gap or before the
lake's data fails here, naming the window to ingest; an unreachable target too)
-> **rebuild** (typed Delta tables) -> **load** (target only) -> **verify**
(with `verify` only). Bad params (resolve) and uncovered ts or an occupied
destination (check_coverage) fail at once, without retries, naming the param.
check_coverage also checks every destination name (an OLD not among the tables,
two tables onto one name, a name the target cannot take, a table already there)
before anything is written; the new names are in its XCom (`into`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from binlake_airflow import restore_tasks


@dag(
    dag_id="binlake_restore",
    doc_md=__doc__,
    schedule=None,
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=30)},
    tags=["binlake", "restore"],
    params={
        "commit_ts": Param(None, type=["null", "integer"], minimum=1,
                           description="T: every transaction with commit_ts <= T (or give datetime)"),
        "datetime": Param(None, type=["null", "string"],
                          pattern=r"^$|^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?([+-]\d{2}:\d{2}|Z)?$",
                          description="instead of commit_ts: ISO-8601, e.g. 2026-11-21T08:00:00"),
        "tz": Param(None, type=["null", "string"], description="zone of datetime, e.g. Europe/Paris; empty = local"),
        # A string, not an array: optional in the form (no asterisk), empty = every table.
        "tables": Param(None, type=["null", "string"], pattern=r"^[,\s]*([^.\s,]+(\.[^.\s,]+)?([,\s]+|$))*$",
                        description="TABLE or DB.TABLE, comma-separated; empty = every table"),
        "out": Param(None, type=["null", "string"], description="directory for typed Delta tables (or target)"),
        "target": Param(None, type=["null", "string"], pattern=r"^$|^[A-Za-z0-9+_.-]+://",
                        description="SQLAlchemy URL to create and load the tables in (or out)"),
        "verify": Param(None, type=["null", "string"], pattern=r"^$|^[A-Za-z0-9+_.-]+://",
                        description="with target: a source database URL to compare with"),
        "rename": Param(None, type=["null", "string"], pattern=r"^[,\s]*([^=,\s]+=[^=,\s]+([,\s]+|$))*$",
                        description="OLD=NEW table names, comma-separated, e.g. shop.orders=shop.orders_0903"),
        "into_schema": Param(None, type=["null", "string"], pattern=r"^$|^[^.,\s]+$",
                             description="PostgreSQL schema / MariaDB database for every restored table"),
        "replace": Param(False, type="boolean",
                         description="overwrite tables already in out, or in target made by another run"),
    },
)
def binlake_restore() -> None:
    @task
    def resolve() -> dict[str, Any]:
        context = get_current_context()
        return restore_tasks.resolve(context["params"], str(context["run_id"]))

    @task
    def check_coverage(resolved: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.check_coverage(resolved)

    @task
    def rebuild(resolved: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.rebuild(resolved)

    @task
    def load(resolved: dict[str, Any], rebuilt: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.load(resolved)

    @task
    def verify(resolved: dict[str, Any], loaded: dict[str, Any]) -> dict[str, Any]:
        return restore_tasks.verify(resolved, loaded)

    # TaskFlow: a task called in the DAG body takes XComArgs (and indexes them) where the
    # function takes values; Airflow resolves them at run time, its types cannot say so.
    r = resolve()
    checked = check_coverage(r)  # type: ignore[arg-type]
    rebuilt = rebuild(r, checked)  # type: ignore[arg-type]
    loaded = load(r, rebuilt)  # type: ignore[arg-type]
    verify(r, loaded)  # type: ignore[arg-type]


binlake_restore()
