"""
### binlake_ingest: Pump windows -> the Delta change table

Every run ingests one commit_ts window: its data interval `[start, end)` is
the window `[tso(start), tso(end))`.

1. **plan** — asks the registry which Pumps may hold the window (every Pump
   not offline before it). A window below a Pump's GC ts fails here, naming the
   Pump and its GC ts (its binlogs were removed after their retention).
2. **wait** — deferrable: until every planned Pump (and any that joined since)
   reports a safe ts >= the window end. The triggerer polls the registry; no
   worker slot is held.
3. **ingest_inprocess** — the job inside the task, as a client of the
   always-on Spark Connect server (`binlake_ingest_mode` `connect`, the
   default when `binlake_spark_remote` is set, as `binlake up` does) or in a
   `local[*]` session (`inprocess`) — or **ingest** — `spark-submit
   jobs/ingest.py` with `binlake_spark_master` as its master (a `spark://`
   standalone cluster) or else the `spark_default` connection's, one Spark
   application per window (`spark-submit`, the default without a Connect
   server). A window no retry can ingest (below a GC ts, overlapping an
   ingested window with other bounds) fails at once, anything else retries;
   a Connect server lost mid-job fails the try with a message naming it, and
   the retry re-ingests the whole window.
4. **publish** — emits an event of the Asset `binlake://lake/changes` whose
   extra holds the window, the Pumps and their safe ts.

Ingesting a window replaces exactly that window, so retries, re-runs and
backfills in any order give the same tables:
`airflow backfill create --dag-id binlake_ingest --from-date 2026-11-20T00:00 --to-date 2026-11-21T00:00`
(`--run-backwards` and `--max-active-runs` work too). The DAG must be
unpaused for the scheduler to start backfill runs. With a duration schedule
(`5m`) a backfill's windows start exactly at `--from-date`: give a date on
the schedule's grid (whole multiples of the interval after the start date),
or its windows overlap the scheduled ones with other bounds and fail at once.

Settings, read when tasks run (Airflow Variable, else environment, else default):
`binlake_registry` / `BINLAKE_REGISTRY` (127.0.0.1:8230; the Airflow Connection
`binlake_registry`, host `h1:8230,h2:8230`, wins over both), `binlake_lake` /
`BINLAKE_LAKE_DIR` (data/lake), `binlake_ingest_mode` / `BINLAKE_INGEST_MODE`
(connect | spark-submit | inprocess), `binlake_spark_remote` /
`BINLAKE_SPARK_REMOTE` (sc://HOST:PORT), `binlake_spark_python`, `binlake_spark_master`,
`binlake_safe_ts_poll_s`, `binlake_ingest_batch_windows` (1: off) and
`binlake_ingest_batch_max_rows` (100000): in mode `connect` a run also ingests
the closed, due windows after its own (the following runs' data intervals) in
the same Spark job, each recorded in the ledger with its own bounds; their
runs then find their window ingested and only publish. The schedule (`BINLAKE_INGEST_SCHEDULE`: `5m`, `1h`
or a cron expression; default every 5 minutes) and the start date
(`BINLAKE_INGEST_START_DATE`) and the runs at once (`BINLAKE_INGEST_MAX_ACTIVE_RUNS`,
default 4) are read from the environment when the file is parsed, because they shape the DAG itself.
Runs at once are safe on an S3 lake too, in every mode: their Delta commits take
turns through the lake's writer lease (`_binlake/writer.lease`, docs/how-to/hosts/s3-lake.md), whichever host or driver makes them.

Deadline: a window not ingested `BINLAKE_INGEST_DEADLINE` (default `15m`;
`off` disables it) after it closes runs a callback in the triggerer: a WARNING
line, a JSON POST to `BINLAKE_INGEST_DEADLINE_WEBHOOK` when set, or the
awaitable named by `BINLAKE_INGEST_DEADLINE_CALLBACK` (see
`plugins/binlake_airflow/deadline.py`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import dag, get_current_context, task
from binlake_airflow import config, deadline, ingest_tasks
from binlake_airflow.assets import LAKE_CHANGES
from binlake_airflow.operators import IngestSubmitOperator, WaitForSafeTsOperator


def _plan_value(key: str) -> str:
    # spark-submit takes strings on its command line, so these are rendered
    # templates rather than XComArgs (which would resolve to ints and lists).
    return "{{ ti.xcom_pull(task_ids='plan', key='" + key + "') }}"


_TIMETABLE = config.ingest_timetable()
_START = config.ingest_start_date()


@dag(
    dag_id="binlake_ingest",
    doc_md=__doc__,
    schedule=_TIMETABLE,
    start_date=_START,
    # A window still not ingested BINLAKE_INGEST_DEADLINE (15m) after it closed runs
    # a callback in the triggerer (a log line, a webhook, or the user's own).
    deadline=deadline.alert(_TIMETABLE, _START),
    # Every interval since the start date is a window to ingest, including the
    # ones missed while Airflow was down.
    catchup=True,
    # Windows are independent (each replaces only itself), so several may run at
    # once when catching up or backfilling (BINLAKE_INGEST_MAX_ACTIVE_RUNS).
    max_active_runs=config.ingest_max_active_runs(),
    default_args={
        "retries": 3,
        "retry_delay": dt.timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": dt.timedelta(minutes=10),
    },
    tags=["binlake", "ingest"],
)
def binlake_ingest() -> None:
    @task(multiple_outputs=True)
    def plan(data_interval_start: dt.datetime | None = None,
             data_interval_end: dt.datetime | None = None) -> dict[str, Any]:
        return ingest_tasks.plan(data_interval_start, data_interval_end, timetable=_TIMETABLE)

    # TaskFlow: a task called in the DAG body takes XComArgs (and indexes them) where the
    # function takes values; Airflow resolves them at run time, its types cannot say so.
    window = plan()

    wait = WaitForSafeTsOperator(
        task_id="wait",
        registry=window["registry"],  # type: ignore[index]
        start_ts=window["start_ts"],  # type: ignore[index]
        end_ts=window["end_ts"],  # type: ignore[index]
        pumps=window["pumps"],  # type: ignore[index]
    )

    @task.branch
    def choose_ingest(mode: str) -> str:
        return ingest_tasks.choose_ingest(mode)

    ingest = IngestSubmitOperator(
        task_id=ingest_tasks.SPARK_SUBMIT_TASK,
        conn_id="spark_default",
        application=str(config.ingest_job()),
        name="binlake-ingest-{{ ts_nodash }}",
        application_args=[
            "--start-ts", _plan_value("start_ts"),
            "--end-ts", _plan_value("end_ts"),
            "--lake", _plan_value("lake"),
            "--registry", _plan_value("registry"),
        ],
        # The Delta jars must be on the driver's classpath when its JVM starts,
        # which under spark-submit is before the job's Python runs.
        jars=_plan_value("jars"),
        # binlake_spark_master when set (a spark:// cluster), else spark_default's master.
        master=_plan_value("master"),
        conf={
            "spark.pyspark.python": _plan_value("python"),
            "spark.pyspark.driver.python": _plan_value("python"),
        },
        # Each ingest is a Spark application; on one machine two at a time is plenty.
        max_active_tis_per_dag=2,
    )

    # Against the always-on Spark a window costs its work: as many at once as runs.
    @task(task_id=ingest_tasks.INPROCESS_TASK, multiple_outputs=False,
          max_active_tis_per_dag=config.ingest_max_active_runs())
    def ingest_inprocess(planned: dict[str, Any]) -> dict[str, Any]:
        return ingest_tasks.ingest_inprocess(planned, run_started=get_current_context()["dag_run"].start_date)

    # One of the two ingest tasks is skipped by the branch; publish runs after the other.
    @task(outlets=[LAKE_CHANGES], trigger_rule="none_failed_min_one_success", multiple_outputs=False)
    def publish(planned: dict[str, Any], waited: dict[str, Any]) -> dict[str, Any]:
        context = get_current_context()
        ingested = context["ti"].xcom_pull(task_ids=ingest_tasks.INPROCESS_TASK)
        extra = ingest_tasks.asset_extra(planned, waited, ingested)
        context["outlet_events"][LAKE_CHANGES].extra = extra
        return extra

    chosen = choose_ingest(window["mode"])  # type: ignore[index]
    inprocess = ingest_inprocess(window)  # type: ignore[arg-type]
    wait >> chosen >> [ingest, inprocess]
    [ingest, inprocess] >> publish(window, wait.output)  # type: ignore[arg-type]


binlake_ingest()
