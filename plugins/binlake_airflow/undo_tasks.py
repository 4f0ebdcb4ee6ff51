"""The bodies of the ``binlake_undo`` tasks: check -> plan -> undo.

As in ``restore_tasks``, everything heavy is imported inside the functions (the
DAG file parses offline, in milliseconds). ``check`` turns the run's params into
the undo's selection and options, and refuses a bad one at once (no retries),
naming the param. ``plan`` folds the chosen changes in Spark and writes the
statements a revert would run to ``LAKE/undo/<run_id>.sql`` (nothing is written
to the target); its output is the plan, the conflicts and the first 64,000
characters of that SQL. ``undo`` reverts (skipped in a dry run, the default):
conflicts without ``skip_conflicts``/``force`` fail it without retries, and a
retry after any other failure is safe (the target's ``_binlake_undo`` record
makes a committed undo a no-op; an uncommitted one left nothing).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from binlake import errors
from binlake_airflow import config, sessions
from binlake_airflow.restore_tasks import _fail, _safe

if TYPE_CHECKING:  # the task bodies import binlake.undo (SQLAlchemy, Arrow) when they run, not at parse
    from binlake.undo import revert

log = logging.getLogger(__name__)

SQL_SHOWN = 64_000  # characters of the SQL kept in the plan's output
# The CLI's flags as the DAG's params (refusals from the shared checks name flags).
_PARAMS = {"--start": "start", "--end": "end", "--txn": "txn", "--tables": "tables", "--where": "where",
           "--target": "target", "--skip-conflicts": "skip_conflicts", "--force": "force", "--tz": "tz",
           "--max-conflicts": "max_conflicts", "--dry-run": "dry_run"}


def _as_params(message: str) -> str:
    for flag, param in sorted(_PARAMS.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(flag, param)
    return message


def _text(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and key in ("start", "end"):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{key}: give a string, got {value!r}")
    return value.strip() or None


def _flag(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: give true or false, got {value!r}")
    return value


def check(params: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """The run's selection and options, every param checked (the run's first task)."""
    from binlake.cli import argcheck
    from binlake.undo import revert, selection, steps

    try:
        target = _text(params, "target")
        if target is None:
            raise ValueError("target: give the URL of the database to revert (e.g. postgresql://app@db/shop)")
        sel = selection.choose(_text(params, "start"), _text(params, "end"), txns=_text(params, "txn"),
                               tables=_text(params, "tables"), where=_text(params, "where"), tz=_text(params, "tz"))
        limit = params.get("max_conflicts", 20)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"max_conflicts: give a number of conflicts to list (0 or more), got {limit!r}")
        dry_run = _flag(params, "dry_run", True)
        opts = revert.Options(skip_conflicts=_flag(params, "skip_conflicts", False),
                              force=_flag(params, "force", False), max_conflicts=limit)
        steps.check(sel, target, opts)
        lake = config.lake_dir()
        argcheck.reachable_db("target", target)
    except errors.Unavailable as exc:
        raise _fail(exc) from None  # a database down now may answer on a retry
    except (errors.BinlakeError, ValueError) as exc:
        raise AirflowFailException(f"bad params: {_as_params(str(exc))}") from None
    sql = None if "://" in lake else os.path.join(lake, "undo", f"{_safe(run_id)}.sql")
    return {"selection": sel.to_dict(), "describe": sel.describe(), "target": target, "lake": lake,
            "dry_run": dry_run, "skip_conflicts": opts.skip_conflicts, "force": opts.force, "max_conflicts": limit,
            "sql_file": sql, "run_id": run_id}


def _selection(resolved: Mapping[str, Any]) -> Any:
    from binlake.undo.selection import Selection

    s = resolved["selection"]
    return Selection(s["start_ts"], s["end_ts"], tuple(s["txns"]), tuple(s["tables"]) if s["tables"] else None,
                     s["where"])


def _steps(resolved: Mapping[str, Any], opts: revert.Options, what: str) -> revert.UndoResult:
    """``steps.run`` in the task's Spark session; refusals fail the task without retries."""
    from binlake.undo import steps

    with sessions.job_session(f"binlake-undo-{what}-{_safe(str(resolved['run_id']))}") as spark:
        try:
            _p, result = steps.run(spark, str(resolved["lake"]), _selection(resolved), str(resolved["target"]), opts,
                                   lambda m: log.info("undo %s: %s", what, m))
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    log.info("%s", result.summary())
    return result


def plan(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The plan (rows per table, conflicts) and the statements, written to the run's SQL file."""
    from binlake.undo import revert

    sql_file = resolved.get("sql_file")
    if sql_file:
        os.makedirs(os.path.dirname(sql_file), exist_ok=True)
    opts = revert.Options(sql_file=sql_file, dry_run=not sql_file, skip_conflicts=bool(resolved["skip_conflicts"]),
                          force=bool(resolved["force"]), max_conflicts=int(resolved["max_conflicts"]))
    result = _steps(resolved, opts, "plan")
    out = result.to_dict()
    out["summary"] = result.summary()
    out["sql"] = ""
    if sql_file and os.path.exists(sql_file):
        with open(sql_file, encoding="utf-8") as fh:
            out["sql"] = fh.read(SQL_SHOWN)
    return out


def undo(resolved: Mapping[str, Any], planned: Mapping[str, Any]) -> dict[str, Any]:
    """Revert (one target transaction); a dry run stops before this."""
    from binlake.undo import revert

    if resolved["dry_run"]:
        raise AirflowSkipException(f"dry run: nothing written. The plan and its SQL are the plan task's output"
                                   f"{' and ' + str(resolved['sql_file']) if resolved.get('sql_file') else ''}")
    opts = revert.Options(skip_conflicts=bool(resolved["skip_conflicts"]), force=bool(resolved["force"]),
                          max_conflicts=int(resolved["max_conflicts"]))
    result = _steps(resolved, opts, "undo")
    if result.mode == "conflicts":
        raise AirflowFailException(
            f"{result.conflict_count} key(s) changed since the changes to undo: nothing written; see the plan "
            "task's conflicts, then run again with skip_conflicts (revert the others) or force (overwrite them)")
    out = result.to_dict()
    out["summary"] = result.summary()
    return out
