"""
### binlake_drill: a restore drill, proved, with its RTO and RPO

Daily (no catch-up: one drill proves today's lake). Tasks:

1. **check** — the run's params, checked (a bad one fails the run here, without
   retries, naming it). Every param may stay empty: the ts and tables are then
   drawn with a fresh seed, recorded so the drill can be replayed with
   `seed` and `until_ts`.
2. **drill** — `binlake drill` against the lake (`binlake_lake`): restores the
   tables at the ts into a scratch SQLite file (or `target`) and proves it:
   (a) every apply target of `binlake_apply_tasks` at its checkpoint, through
   its task's rules; (b) the lake's other restore paths; (c) the upstream, when
   `upstream` is given. Measures the RTO and the RPO against `rto_s`/`rpo_s`
   (params, else `binlake_drill_rto_s`/`binlake_drill_rpo_s`, else [drill]).
   Records the drill in `LAKE/drills` and publishes the Asset
   `binlake://lake/drills` with its figures. A difference, a restore error or a
   missed objective fails the task with one line naming the table and first
   differing key (or the objective); the tasks' failure callback logs it and
   POSTs it to `binlake_drill_webhook` when set. The default scratch file goes
   below `binlake_drill_scratch_dir` (default: the system's temporary directory).
3. **report** — the HTML report (`binlake_drill_report`, default
   `LAKE/drills.html`): RPO and RTO over time, the verdict history. Runs after
   a failed drill too.
4. **verdict** — the drill's figures again, as the run's last task: a failed
   drill fails the run.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from binlake_airflow import drill_tasks
from binlake_airflow.assets import LAKE_DRILLS


@dag(
    dag_id="binlake_drill",
    doc_md=__doc__,
    schedule="@daily",
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    # A failed drill fails at once (AirflowFailException); a retry is for a lost worker or Spark.
    # The callback is the tasks' (it runs with the failed task's exception: the drill's one line).
    default_args={"retries": 1, "retry_delay": dt.timedelta(minutes=5), "on_failure_callback": drill_tasks.on_failure},
    params={
        "ts": Param(None, type=["null", "integer"], minimum=1, description="commit_ts to restore; empty = drawn"),
        "tables": Param(None, type=["null", "string"], description="comma-separated tables; empty = drawn"),
        "count": Param(None, type=["null", "integer"], minimum=1, description="tables to draw; empty = [drill] tables"),
        "seed": Param(None, type=["null", "integer"], minimum=0, description="seed of the draw; empty = a fresh one"),
        "until_ts": Param(None, type=["null", "integer"], minimum=1,
                          description="draw from windows ending at or below this TSO; empty = the newest"),
        "target": Param(None, type=["null", "string"], description="scratch database URL; empty = a SQLite file"),
        "upstream": Param(None, type=["null", "string"], description="upstream database URL for proof (c)"),
        "rpo_s": Param(None, type=["null", "number"], description="RPO objective (s); empty = binlake_drill_rpo_s"),
        "rto_s": Param(None, type=["null", "number"], description="RTO objective (s); empty = binlake_drill_rto_s"),
    },
    tags=["binlake", "drill"],
)
def binlake_drill() -> None:
    @task
    def check() -> dict[str, Any]:
        return drill_tasks.check(get_current_context()["params"])

    @task(outlets=[LAKE_DRILLS])
    def drill(args: dict[str, Any]) -> dict[str, Any]:
        figures = drill_tasks.drill(args)
        get_current_context()["outlet_events"][LAKE_DRILLS].extra = figures
        return figures

    @task(trigger_rule="all_done")
    def report() -> dict[str, Any]:
        return drill_tasks.report()

    @task
    def verdict(figures: dict[str, Any]) -> dict[str, Any]:
        # The run's last task: it fails (upstream failed) with the drill, so the run does too.
        return figures

    # TaskFlow: XComArgs stand for the values at run time; Airflow's types cannot say so.
    drilled = drill(check())  # type: ignore[arg-type]
    drilled >> report() >> verdict(drilled)  # type: ignore[arg-type]


binlake_drill()
