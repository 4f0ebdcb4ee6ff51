"""The bodies of the ``binlake_drill`` tasks, kept out of the DAG file.

``check`` reads and checks the run's params (a bad one fails the run in its first
task, without retries, naming it); ``drill`` runs ``binlake.drill.run.run`` with the
lake, registry and apply task files of the other DAGs' settings (each task file's
target resolved as ``binlake_apply`` resolves it: a URL or an Airflow Connection id);
``report`` writes the HTML report. A failed drill fails its task at once with the
drill's one line (``AirflowFailException``: retrying a damaged lake proves nothing
new), after the drill's row is in ``LAKE/drills``. A lake with no window ingested yet
skips the drill (one line) instead of failing it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from binlake_airflow import apply_tasks, config, deadline, sessions

log = logging.getLogger(__name__)

PARAMS = ("ts", "tables", "count", "seed", "until_ts", "target", "upstream", "rpo_s", "rto_s")


def _bad(name: str, what: str, value: Any) -> AirflowFailException:
    return AirflowFailException(f"bad params: {name}: {what}, got {value!r}")


def _int(params: Mapping[str, Any], name: str, lo: int = 1) -> int | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit() or int(value) < lo:
        raise _bad(name, f"give an integer of at least {lo} or leave it empty", value)
    return int(value)


def _seconds(params: Mapping[str, Any], name: str) -> float | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise _bad(name, "give a number of seconds above 0 or leave it empty", value) from None
    if isinstance(value, bool) or not seconds > 0:
        raise _bad(name, "give a number of seconds above 0 or leave it empty", value)
    return seconds


def _url(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value in (None, ""):
        return None
    if not isinstance(value, str) or "://" not in value:
        raise _bad(name, "give a SQLAlchemy URL such as sqlite:////tmp/drill.db or leave it empty", value)
    return value.strip()


def check(params: Mapping[str, Any]) -> dict[str, Any]:
    """The run's params, checked; the drill's arguments."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise AirflowFailException(f"bad params: unknown {', '.join(unknown)} (params: {', '.join(PARAMS)})")
    tables = params.get("tables")
    names: list[str] | None = None
    if tables not in (None, ""):
        if not isinstance(tables, str):
            raise _bad("tables", "give comma-separated TABLE or DB.TABLE names", tables)
        names = [t.strip() for t in tables.split(",") if t.strip()]
        bad = [t for t in names if t.count(".") > 1]
        if bad or not names:
            raise _bad("tables", "give comma-separated TABLE or DB.TABLE names", tables)
    return {"ts": _int(params, "ts"), "tables": names, "count": _int(params, "count"),
            "seed": _int(params, "seed", 0), "until_ts": _int(params, "until_ts"),
            "target": _url(params, "target"), "upstream": _url(params, "upstream"),
            "rpo_s": _seconds(params, "rpo_s"), "rto_s": _seconds(params, "rto_s")}


def _tasks() -> tuple[list[Any], list[str]]:
    """The apply task files' (task, target URL) pairs; none configured: none."""
    from airflow.sdk.exceptions import AirflowSkipException

    from binlake.drill import run as drill_run

    try:
        files = apply_tasks.task_files()
    except AirflowSkipException:
        return [], ["no apply task file configured (binlake_apply_tasks)"]
    return drill_run.load_tasks(files, apply_tasks.resolve_target)


def drill(args: Mapping[str, Any]) -> dict[str, Any]:
    """One drill; its figures (the Asset event's extra)."""
    from binlake import config as settings
    from binlake import errors
    from binlake.drill import run as drill_run

    lake = config.lake_dir()
    try:
        s = config.load(settings.DrillSettings)
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    tasks, notes = _tasks()
    try:
        registry: str | None = config.registry_addr()
    except Exception:  # no registry set or reachable: the Pumps' lags are left out
        registry = None
    scratch_dir = _local(s.scratch_dir)
    if args.get("target") is None and scratch_dir is not None:
        from binlake.cli import argcheck

        try:
            argcheck.writable_dir("binlake_drill_scratch_dir", scratch_dir)
        except errors.BinlakeError as exc:
            raise AirflowFailException(str(exc)) from None
    config.use_lake_s3_connection()
    _skip_an_empty_lake(lake)
    try:
        with sessions.job_session("binlake-drill") as spark:
            d = drill_run.run(
                spark, lake, ts=args.get("ts"), tables=args.get("tables"), seed=args.get("seed"),
                until_ts=args.get("until_ts"), count=args.get("count") or s.tables, target=args.get("target"),
                tasks=tasks, task_notes=notes, upstream=args.get("upstream"), registry=registry,
                rpo_objective_s=args.get("rpo_s") or s.rpo_s, rto_objective_s=args.get("rto_s") or s.rto_s,
                progress=log.info, scratch_dir=scratch_dir)
    except drill_run.DrillFailed as exc:
        raise AirflowFailException(str(exc)) from None
    except errors.BinlakeError as exc:
        raise AirflowFailException(f"drill: {exc}") from None
    log.info("%s", d.summary())
    return extra(d.to_row())


def _skip_an_empty_lake(lake: str) -> None:
    """A lake with no window ingested yet (a cluster just brought up) has nothing to restore:
    the drill is skipped with one line, not failed (the first scheduled run comes at once)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from binlake import errors
    from binlake.lake import freshness

    try:
        windows = freshness.ledger(lake)
    except errors.BinlakeError:
        return  # the drill itself says what is wrong with the lake
    if not windows:
        raise AirflowSkipException(f"nothing to drill yet: no window is ingested in {lake} (binlake_ingest fills it)")


def extra(row: Mapping[str, Any]) -> dict[str, Any]:
    """A drill's figures as JSON-able values (no details blob)."""
    keep = ("drill_id", "verdict", "failure", "ts", "seed", "until_ts", "tables", "rows", "bytes", "restore_s",
            "drill_s", "proving_share", "rows_per_s", "gb_per_h", "drill_rows_per_s", "drill_gb_per_h", "rpo_s",
            "rpo_objective_s", "rto_objective_s", "proof_apply", "proof_paths", "proof_upstream")
    out = {k: row.get(k) for k in keep}
    # Each Pump's safe-ts lag (the other half of the RPO): a JSON text in the table, a mapping here.
    lags = row.get("pump_lag_s")
    out["pump_lag_s"] = json.loads(lags) if isinstance(lags, str) else lags
    return out


def _local(path: str | None) -> str | None:
    """A local path setting, relative ones against the project root (as the lake's)."""
    import os

    if not path:
        return None
    return path if os.path.isabs(path) else str(config.PROJECT_ROOT / path)


def report_path() -> str:
    """Where the report goes: ``binlake_drill_report``, else LAKE/drills.html."""
    import os

    from binlake import config as settings

    chosen = _local(config.load(settings.DrillSettings).report)
    if chosen:
        return chosen
    lake = config.lake_dir()
    if "://" in lake:
        raise AirflowFailException("binlake_drill_report: the lake is not a local directory; set the Variable "
                                   "binlake_drill_report to a local file for the report")
    return os.path.join(lake, "drills.html")


def report() -> dict[str, Any]:
    """Write the HTML report of every drill so far (the failed ones too)."""
    from binlake.drill import report as page
    from binlake.lake.store import drills

    lake = config.lake_dir()
    path = report_path()
    rows = drills.read(lake)
    page.write(path, rows, lake)
    log.info("wrote the drills report %s (%d drill(s))", path, len(rows))
    return {"report": path, "drills": len(rows)}


def on_failure(context: Mapping[str, Any]) -> None:
    """The drill tasks' failure callback: the failed task's one line in the log and, when
    ``binlake_drill_webhook`` is set, POSTed there as JSON (``text``, as Slack and
    Mattermost incoming webhooks show it, with the run, the task and the report's path).
    A webhook that does not answer is logged; the task has failed either way."""
    from binlake import config as settings

    exc = context.get("exception")
    ti = context.get("task_instance") or context.get("ti")
    task_id = getattr(ti, "task_id", "?")
    run_id = getattr(ti, "run_id", None) or getattr(context.get("dag_run"), "run_id", None)
    line = str(exc).splitlines()[0] if exc and str(exc) else "(no message)"
    log.error("binlake_drill %s failed: %s", task_id, line)
    try:
        webhook = config.load(settings.DrillSettings).webhook
        where = report_path()
    except Exception as err:  # a bad setting here must not hide the drill's own failure
        log.error("binlake_drill: the failure alert was not sent: %s", err)
        return
    if not webhook:
        return
    payload = {"text": f"binlake: restore drill failed ({task_id}, run {run_id}): {line}; report {where}",
               "dag_id": "binlake_drill", "run_id": run_id, "task_id": task_id, "failure": line, "report": where}
    try:
        status = deadline.post(webhook, payload)
    except Exception as err:
        log.error("binlake_drill: the failure alert to %s was not delivered: %s", webhook, err)
        return
    log.info("binlake_drill: failure alert sent to %s (answered %d)", webhook, status)
