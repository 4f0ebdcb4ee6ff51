"""The bodies of the ``binlake_ingest`` tasks, kept out of the DAG file.

The DAG file only wires tasks together; what each task does lives here, where
it can be imported and tested without parsing a DAG. Everything heavy
(gRPC, pyspark, the lake) is imported inside the functions, so importing this
module at parse time costs nothing.

Errors are sorted by whether a retry can help: a window below a Pump's GC ts,
one overlapping an ingested window with other bounds, a bad setting or a
missing Delta jar fail the task at once (``AirflowFailException``;
``binlake.errors.is_final``); an unreachable registry or Pump raises an
ordinary error, which the DAG's retries with exponential backoff absorb.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from binlake_airflow import config

log = logging.getLogger(__name__)

# Task ids the DAG uses for the two ingest flavours (the branch returns one).
SPARK_SUBMIT_TASK = "ingest"
INPROCESS_TASK = "ingest_inprocess"


def window_ts(start: dt.datetime, end: dt.datetime) -> tuple[int, int]:
    """The commit_ts window ``[tso(start), tso(end))`` of a data interval."""
    from binlake import tso

    return tso.from_datetime(start), tso.from_datetime(end)


def following_windows(timetable: Any, start: dt.datetime, end: dt.datetime, count: int,
                      now: dt.datetime | None = None) -> list[list[int]]:
    """The ts windows of up to ``count`` data intervals after ``[start, end)`` that
    have closed by ``now``: the windows of the runs that follow this one, which a
    run may ingest with its own (``binlake_ingest_batch_windows``). Each is the
    data interval its own run has, so its ledger row is what that run would write.
    Only a duration schedule (``5m``) has intervals known here; a cron schedule
    gives none (each window is then ingested by its own run)."""
    if count < 1:
        return []
    delta = getattr(timetable, "delta", None)
    if not isinstance(delta, dt.timedelta) or delta != end - start:
        return []
    now = now or dt.datetime.now(dt.UTC)
    out: list[list[int]] = []
    lo = end
    while len(out) < count and lo + delta <= now:
        out.append(list(window_ts(lo, lo + delta)))
        lo += delta
    return out


def plan(data_interval_start: dt.datetime | None, data_interval_end: dt.datetime | None,
         timetable: Any = None) -> dict[str, Any]:
    """Map the data interval to a ts window and choose the Pumps to read.

    Returns the window, the Pumps, and the run's settings (registry, lake,
    mode, Spark jars and Python), so every later task and every retry of this
    run uses the same ones; with the DAG's ``timetable``, also the closed
    windows of the following runs a batch may take (``following``).
    """
    from binlake import errors, tso
    from binlake.lake.pumps import planner

    if data_interval_start is None or data_interval_end is None:
        raise AirflowFailException(
            "this run has no data interval, so there is no window to ingest; trigger it with a logical "
            "date or use `airflow backfill create`"
        )
    start_ts, end_ts = window_ts(data_interval_start, data_interval_end)
    interval = f"{data_interval_start.isoformat()} .. {data_interval_end.isoformat()}"
    try:
        registry = config.registry_addr()
        lake = config.lake_dir()
        mode = config.ingest_mode()
        config.poll_interval_s()  # the wait step's; checked here so a bad one fails the first task
        master = config.spark_master() or ""
        batch = config.ingest_batch_windows() if mode == config.CONNECT else 1
        batch_max_rows = config.ingest_batch_max_rows()
        config.ingest_max_active_runs()  # the DAG's; checked here so a bad one fails the first task
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    # Several runs at once are safe on an S3 lake too, in every mode (and however many
    # `airflow backfill create --max-active-runs` asks for): each run's Delta writes
    # take the lake's writer lease (binlake.lake.store.writelock), so drivers on any host
    # commit in turn; the reads and the Pumps' scans still overlap.
    try:
        wp = planner.plan_window(registry, start_ts, end_ts)
    except errors.BinlakeError as exc:
        # Below a Pump's GC ts the binlogs are gone, a bad window stays bad, a Pump
        # named but unknown stays unknown: no retry can help with those.
        if errors.is_final(exc) or isinstance(exc, errors.NotFound):
            raise AirflowFailException(f"cannot ingest {interval}: {exc}") from None
        raise AirflowException(f"cannot plan {interval} with registry {registry}: {exc}") from None
    if not wp.pumps:
        # Retryable: Pumps register when they start.
        raise AirflowException(
            f"no Pump is registered in registry {registry}, so no window can be read; "
            "start the Pumps (`binlake up`) or point binlake_registry at the right registry"
        )
    result: dict[str, Any] = {
        "start_ts": start_ts,
        "end_ts": end_ts,
        "start": data_interval_start.isoformat(),
        "end": data_interval_end.isoformat(),
        "pumps": [p.node_id for p in wp.pumps],
        "registry": registry,
        "lake": lake,
        "mode": mode,
        "jars": "",
        "python": "",
        "master": "",
        "following": following_windows(timetable, data_interval_start, data_interval_end, batch - 1),
        # The ingest task reads these here rather than as Variables again (an API
        # round trip each in a task process), as it reads the lake and registry.
        "batch_windows": batch,
        "batch_max_rows": batch_max_rows,
    }
    if mode == config.SPARK_SUBMIT:
        from binlake.lake.sparkenv.session import delta_jars

        try:
            result["jars"] = ",".join(str(p) for p in delta_jars())
        except RuntimeError as exc:
            raise AirflowFailException(str(exc)) from None
        result["python"] = config.spark_python()
        result["master"] = master
    waiting = [p.node_id for p in wp.waiting_for()]
    log.info(
        "window [%s, %s) = %s; pumps %s%s; lake %s; ingest by %s",
        tso.format_ts(start_ts), tso.format_ts(end_ts), interval, ", ".join(result["pumps"]),
        f" (waiting for {', '.join(waiting)})" if waiting else "", lake, mode,
    )
    return result


def choose_ingest(mode: str) -> str:
    """The task id of the ingest flavour this run uses."""
    return SPARK_SUBMIT_TASK if mode == config.SPARK_SUBMIT else INPROCESS_TASK


def ingest_inprocess(window: Mapping[str, Any], run_started: dt.datetime | None = None) -> dict[str, Any]:
    """Run the ingest of the planned window inside this task (``inprocess`` or ``connect``)."""
    return ingest_window_task(window, run_started=run_started)


def _session(window: Mapping[str, Any]) -> tuple[Any, bool, str | None]:
    """(session, whether this task owns it, the Connect URL if any) for the run's mode."""
    from pyspark.sql import SparkSession

    from binlake import errors
    from binlake.lake.sparkenv import connect
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark

    name = f"binlake-ingest-{window['start_ts']}-{window['end_ts']}"
    if window.get("mode") == config.CONNECT:
        try:
            remote = config.spark_remote() or connect.DEFAULT_REMOTE
        except errors.ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        try:
            return connect.connect(remote, name), True, remote
        except ConnectionError as exc:
            # The server is down or restarting: the DAG's retries absorb it.
            raise AirflowException(f"ingest failed, will retry: {exc}") from None
    # A session that already runs here (dag.test in a test process) is reused
    # and left running; one this task starts is stopped with it.
    owned = SparkSession.getActiveSession() is None
    return build_spark(name, master=config.spark_master(), extra_conf=LAKE_CONF), owned, None


def ingest_window_task(window: Mapping[str, Any], progress: Any = None,
                       run_started: dt.datetime | None = None) -> dict[str, Any]:
    """The ingest of the planned window, run in this task: over the always-on Spark
    Connect server (mode ``connect``) or a ``local[*]`` session (``inprocess``).

    A window the ledger shows ingested since this run started (``run_started``:
    by an earlier run's batch) is not ingested again. Otherwise the window is
    ingested with the closed windows after it that are due and not ingested
    yet (``window["following"]``, see ``batch_windows``), in one Spark job.

    A Connect server that goes away mid-job fails the task with a message naming
    it; the retry re-ingests the whole window, which replaces whatever the lost
    attempt committed (rows before the ledger row: see ``binlake.lake.ingest``),
    so the window ends up ingested exactly once.
    """
    from binlake import errors
    from binlake.lake.ingest import ingest_windows
    from binlake.lake.sparkenv import connect
    from binlake.lake.store.ledger import read_windows

    start_ts, end_ts = int(window["start_ts"]), int(window["end_ts"])
    # The plan task's settings (a run planned before they were passed reads them now).
    batch = int(window["batch_windows"]) if "batch_windows" in window else config.ingest_batch_windows()
    max_rows = int(window["batch_max_rows"]) if "batch_max_rows" in window else config.ingest_batch_max_rows()
    if window.get("mode") != config.CONNECT or batch == 1:
        # No run batches windows (only the Connect mode does, when asked), so none can have taken this one: a window already in
        # the ledger is re-ingested (a rerun replaces it), whenever it was written.
        run_started = None
    spark, owned, remote = _session(window)
    say = progress or (lambda msg: log.info("ingest: %s", msg))
    try:
        # The ledger's windows this run's and the following due ones can meet, whole
        # (a window found ingested is summarised from its row).
        reach = max([end_ts] + [int(b) for _a, b in window.get("following") or []])
        ledger = read_windows(spark, window["lake"], overlapping=(start_ts, reach))
        done = _ingested_since(ledger, start_ts, end_ts, run_started)
        if done is not None:
            log.info("window [%s, %s) was ingested at %s, after this run started (by an earlier run's batch): "
                     "not ingested again", start_ts, end_ts, done.get("ingested_at"))
            return summarize({**done, "batched_by_another_run": True})
        bounds = [(start_ts, end_ts)] + batch_windows(window, ledger)
        if len(bounds) > 1:
            say(f"{len(bounds) - 1} closed window(s) after this one are due and not ingested: "
                "ingesting them in the same Spark job")
        # No pump list: the ingest asks the registry again, so a Pump that joined
        # during the wait is read too (the wait step waited for it).
        since = _naive_utc(run_started)
        try:
            results = ingest_windows(spark, window["lake"], window["registry"], bounds, progress=say,
                                     max_rows=max_rows, done_since=since)
        except errors.BinlakeError as exc:
            if len(bounds) == 1 or errors.is_final(exc):
                raise
            # A window of the batch not readable yet (a Pump's readiness, a replica down):
            # this run's own window does not wait for it.
            say(f"the batch failed ({exc}); ingesting this run's window alone")
            results = ingest_windows(spark, window["lake"], window["registry"], bounds[:1], progress=say,
                                     done_since=since)
        if not results:  # another run's batch took this window while this one waited to write
            done = _ingested_since(read_windows(spark, window["lake"], overlapping=(start_ts, end_ts)), start_ts,
                                   end_ts, run_started)
            return summarize({**(done or {}), "batched_by_another_run": True})
        result = results[0]
        if len(results) > 1:
            log.info("also ingested %s", ", ".join(f"[{r.start_ts}, {r.end_ts}) ({r.rows} rows)" for r in results[1:]))
    except errors.BinlakeError as exc:
        if errors.is_final(exc):  # below a GC ts, overlapping another window: no retry can help
            raise AirflowFailException(str(exc)) from None
        # A Pump down or restarting, a safe ts not there yet: the DAG's retries absorb it.
        raise AirflowException(f"ingest failed, will retry: {exc}") from None
    except Exception as exc:
        if remote is not None and connect.is_connection_loss(exc):
            raise AirflowException(
                f"ingest of [{window['start_ts']}, {window['end_ts']}) failed, will retry: "
                f"{connect.unreachable(remote, exc)}; the retry re-ingests the whole window") from None
        raise
    finally:
        if owned:
            with contextlib.suppress(Exception):  # a lost Connect server cannot be told
                spark.stop()
    summary = summarize(result)
    if len(results) > 1:
        summary["batch"] = [[r.start_ts, r.end_ts] for r in results[1:]]
    log.info("ingested window [%s, %s): %s", window["start_ts"], window["end_ts"], summary)
    return summary


def _ingested_since(ledger: list[dict[str, Any]], start_ts: int, end_ts: int,
                    run_started: dt.datetime | None) -> dict[str, Any] | None:
    """The ledger row of exactly this window if it was written after the run
    started, else None. A run cleared to re-ingest its window starts again (a new
    start date), so it re-ingests; a run whose window an earlier run's batch
    took meanwhile does not."""
    since = _naive_utc(run_started)
    if since is None:
        return None
    for row in ledger:
        if (int(row["start_ts"]), int(row["end_ts"])) == (start_ts, end_ts) and row.get("status") == "done":
            at = row.get("ingested_at")
            if isinstance(at, dt.datetime) and at.replace(tzinfo=None) >= since:
                return row
    return None


def _naive_utc(moment: dt.datetime | None) -> dt.datetime | None:
    """``moment`` as the ledger's ``ingested_at`` is: naive UTC."""
    if moment is None or moment.tzinfo is None:
        return moment
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def batch_windows(window: Mapping[str, Any], ledger: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The closed windows after this one (``window["following"]``) to ingest with
    it: consecutive from its end, none overlapping the ledger, each at or below
    every Pump's safe ts (asked now; none when a Pump does not answer)."""
    from binlake import errors
    from binlake.lake.pumps.planner import plan_window
    from binlake.lake.pumps.pump_check import pump_statuses

    following = [(int(a), int(b)) for a, b in window.get("following") or []]
    if not following:
        return []
    taken = [(int(r["start_ts"]), int(r["end_ts"])) for r in ledger]
    out: list[tuple[int, int]] = []
    cursor = int(window["end_ts"])
    for a, b in following:
        if a != cursor or any(s < b and a < e for s, e in taken):
            break
        out.append((a, b))
        cursor = b
    if not out:
        return []
    try:
        plan = plan_window(window["registry"], out[0][0], out[-1][1])
        down: dict[str, str] = {}
        statuses = pump_statuses(plan, unreachable=down)
    except errors.BinlakeError as exc:
        log.info("no batch: the Pumps' safe ts could not be read (%s)", exc)
        return []
    if down or not statuses:
        return []
    safe = min(st.safe_ts for st in statuses.values())
    return [(a, b) for a, b in out if b <= safe]


def summarize(result: Any) -> dict[str, Any]:
    """An ingest result as plain JSON (for XCom and the asset event's extra)."""
    if result is None:
        return {}
    if hasattr(result, "to_dict"):
        data: Any = result.to_dict()
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        data = dataclasses.asdict(result)
    elif isinstance(result, Mapping):
        data = dict(result)
    else:
        data = {"result": str(result)}
    # A JSON round trip turns tuples, datetimes and the like into plain values.
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return plain


def asset_extra(window: Mapping[str, Any], waited: Mapping[str, Any] | None,
                ingested: Mapping[str, Any] | None) -> dict[str, Any]:
    """The extra of the change table's asset event for one ingested window."""
    extra: dict[str, Any] = {
        "start_ts": int(window["start_ts"]),
        "end_ts": int(window["end_ts"]),
        "start": window["start"],
        "end": window["end"],
        "pumps": list(window["pumps"]),
        "lake": window["lake"],
        "table": f"{str(window['lake']).rstrip('/')}/changes",
        "mode": window["mode"],
    }
    if waited:
        extra["safe_ts"] = dict(waited.get("safe_ts") or {})
        # Pumps that joined during the wait were read too.
        extra["pumps"] = sorted(set(extra["pumps"]) | set(waited.get("pumps") or []))
    if ingested:
        extra["ingest"] = dict(ingested)
    return extra
