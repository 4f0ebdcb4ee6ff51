"""The bodies of the ``binlake_restore`` and ``binlake_maintenance`` tasks.

Like ``ingest_tasks``, everything heavy (pyspark, gRPC, the lake) is imported
inside the functions, so the DAG files parse in milliseconds and offline.
Mistakes no retry can fix (a bad param, a ts the ledger does not cover, an
unknown table, an occupied destination) fail at once (``AirflowFailException``);
anything else raises an ordinary error for the DAG's retries.

Restore runs write the rebuilt tables to ``out`` (or, for a ``target`` run, to
``LAKE/restores/<run_id>``) in ``rebuild``; ``load`` bulk-loads the target from
those Delta tables, so a retried load never rebuilds, and a retried rebuild
replaces its own output (both idempotent for a run).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from binlake import errors
from binlake.config import MaintenanceSettings
from binlake_airflow import config, sessions

log = logging.getLogger(__name__)


def _fail(exc: BaseException) -> Exception:
    from binlake import errors

    if isinstance(exc, errors.BinlakeError) and (errors.is_final(exc) or isinstance(
            exc, (errors.InvalidArgument, errors.NotFound, errors.AlreadyExists, errors.FailedPrecondition))):
        return AirflowFailException(str(exc))
    return AirflowException(str(exc))


_spark_or_connect = sessions.job_session


# ---------------------------------------------------------------- binlake_restore
_TABLE_NAME = re.compile(r"^[^.\s]+(\.[^.\s]+)?$")


def parse_tables(value: Any) -> list[str] | None:
    """The ``tables`` param: None or empty (every table), a string of names separated by
    commas or whitespace (what the trigger form sends), or a list of names (the REST API)."""
    if value is None:
        return None
    if isinstance(value, str):
        names = [t for t in re.split(r"[,\s]+", value) if t]
    elif isinstance(value, (list, tuple)):
        if not all(isinstance(t, str) for t in value):
            raise ValueError(f"tables: give table names (TABLE or DB.TABLE), got {value!r}")
        names = [t.strip() for t in value if t.strip()]
    else:
        raise ValueError(f"tables: give table names separated by commas (TABLE or DB.TABLE), got {value!r}")
    bad = [t for t in names if not _TABLE_NAME.match(t)]
    if bad:
        raise ValueError(f"tables: {', '.join(map(repr, bad))} is not TABLE or DB.TABLE; "
                         "separate names with commas, leave it empty for every table")
    return list(dict.fromkeys(names)) or None


def _text(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key}: give a string, got {value!r}")
    return value.strip() or None


def resolve(params: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """Check the run's params and turn them into the restore's settings (T, tables,
    destination). Every bad param or combination fails here, the run's first task,
    at once (no retries), naming the param and what to do."""
    from binlake import errors, tso
    from binlake.restore import naming
    from binlake.restore.restore import resolve_ts
    from binlake.sql import targets
    from binlake.sql.url import normalize_url

    try:
        commit_ts = params.get("commit_ts")
        if commit_ts in (None, ""):
            commit_ts = None
        elif isinstance(commit_ts, bool) or not isinstance(commit_ts, (int, str)) \
                or not str(commit_ts).strip().isdigit():
            raise ValueError(f"commit_ts: give a TSO (a positive integer), got {commit_ts!r}")
        when, tz = _text(params, "datetime"), _text(params, "tz")
        out, target, verify = _text(params, "out"), _text(params, "target"), _text(params, "verify")
        tables = parse_tables(params.get("tables"))
        if tz and commit_ts is not None:
            raise ValueError("tz applies to datetime only: clear tz, or give datetime instead of commit_ts")
        if tz and not when:
            raise ValueError("tz is set but datetime is empty: give datetime (or clear tz and give commit_ts)")
        ts = resolve_ts(int(commit_ts) if commit_ts is not None else None, when, tz)
        if (out is None) == (target is None):
            raise ValueError("give exactly one destination: the param out (a directory) or target (a URL)")
        if out is not None and "://" not in out and not out.startswith("/"):
            raise ValueError(f"out: give an absolute directory (or a URI such as s3a://bucket/dir), got {out!r}; "
                             "a relative one would land wherever the worker runs")
        if target is not None and "://" not in target:
            raise ValueError(f"target: give a SQLAlchemy URL such as sqlite:////abs/restored.db, got {target!r}")
        if verify and not target:
            raise ValueError("verify compares a target database: set target too (or clear verify)")
        if verify and target and verify == target:
            raise ValueError("verify and target are the same database: target must be a new database, "
                             "verify the source to compare it with")
        replace = params.get("replace", False)
        if not isinstance(replace, bool):
            raise ValueError(f"replace: give true or false, got {replace!r}")
        renames = naming.parse_renames(_text(params, "rename"), naming.PARAMS.rename)
        into_schema = naming.parse_schema(_text(params, "into_schema"), naming.PARAMS.into_schema)
        if verify and (renames or into_schema):
            raise ValueError("verify compares tables under their own names: clear verify, or rename and "
                             "into_schema (then run binlake diff on the restored tables)")
        if target is not None:
            naming.check_kind(targets.for_scheme(normalize_url(target).drivername), into_schema, naming.PARAMS)
        lake = config.lake_dir()
    except (errors.BinlakeError, ValueError) as exc:
        raise AirflowFailException(f"bad params: {exc}") from None
    staging = out or f"{lake.rstrip('/')}/restores/{_safe(run_id)}"
    # For out, replace is the user's; the staging dir of a target run is the run's own.
    return {"ts": ts, "datetime": tso.to_datetime(ts).isoformat(), "tables": tables, "lake": lake,
            "out": staging, "target": target, "verify": verify, "replace": replace or out is None,
            "replace_target": replace, "run_id": run_id, "rename": [list(r) for r in renames],
            "into_schema": into_schema}


def _safe(run_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)


def _naming(resolved: Mapping[str, Any], p: Any) -> Any:
    """Where each planned table goes (the params rename and into_schema)."""
    from binlake.restore import naming

    return naming.resolve(p, [(str(a), str(b)) for a, b in resolved.get("rename") or []],
                          resolved.get("into_schema"), naming.PARAMS)


def _out_naming(resolved: Mapping[str, Any], p: Any) -> Any:
    """The names of the Delta tables ``rebuild`` writes: the renamed ones for an ``out`` run,
    the tables' own in a target run's staging directory (``load`` renames)."""
    from binlake.restore import naming

    return naming.Naming() if resolved.get("target") else _naming(resolved, p)


def check_coverage(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Plan the restore: every table at T and its base, each checked against the ledger;
    every destination name checked (valid for the target, no two tables onto one); a
    target that holds any of the tables another run made is refused (unless replace)."""
    from binlake import errors
    from binlake.restore import naming, restore

    target = None
    if resolved.get("target"):
        try:  # an unreachable target is refused before any rebuild
            target = restore.open_target(str(resolved["target"]))
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    try:
        with _spark_or_connect(f"binlake-restore-check-{resolved['ts']}") as spark:
            try:
                p = restore.plan(spark, resolved["lake"], int(resolved["ts"]), resolved["tables"])
                names = _naming(resolved, p)
                restore.check_out(spark, resolved["out"], p, bool(resolved["replace"]), _out_naming(resolved, p),
                                  naming.PARAMS)
                if target is not None:
                    naming.check_target(target, p, names, str(resolved["run_id"]),
                                        bool(resolved.get("replace_target")), naming.PARAMS).close()
            except errors.BinlakeError as exc:
                raise _fail(exc) from None
    finally:
        if target is not None:
            target.close()
    tables = [{"table": t.name, "base": t.base.kind, "base_ts": t.base.ts, "into": names.shown(t)}
              for t in p.tables]
    log.info("restore to %s: %s", resolved["ts"], tables)
    for line in p.skipped:
        log.warning("restore to %s: not restored: %s", resolved["ts"], line)
    return {"tables": tables, "not_restored": list(p.skipped)}


def rebuild(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild every table at T into typed Delta tables (``out`` or the run's staging dir)."""
    from binlake import errors
    from binlake.restore import restore

    with _spark_or_connect(f"binlake-restore-{resolved['ts']}") as spark:
        try:
            p = restore.plan(spark, resolved["lake"], int(resolved["ts"]), resolved["tables"])
            # A retry replaces what an earlier try of this run wrote.
            result = restore.write_out(spark, p, resolved["out"], True, lambda m: log.info("restore: %s", m),
                                       config.restore_parallelism(), _out_naming(resolved, p))
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    log.info("%s", result.summary())
    return result.to_dict()


def load(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """Create the tables in the target from the definitions at T and bulk-load them.
    Each table is claimed for this run (``binlake.restore.claims``): a retry replaces
    what this run created, never a table another run or a person made (unless replace).
    Renamed tables (rename, into_schema) are read from the staging tables under their own
    names and created under the new ones."""
    from binlake import errors
    from binlake.restore import naming, restore, stream

    if not resolved.get("target"):
        raise AirflowSkipException("no target: the restore is the Delta tables in out")
    run_id, replace = str(resolved["run_id"]), bool(resolved.get("replace_target"))
    with _spark_or_connect(f"binlake-restore-load-{resolved['ts']}") as spark:
        try:
            p = restore.plan(spark, resolved["lake"], int(resolved["ts"]), resolved["tables"])
            names = _naming(resolved, p)
            target = restore.open_target(str(resolved["target"]))
            placement = None
            try:
                # Every table checked before the first is created: a refusal writes nothing.
                placement = naming.check_target(target, p, names, run_id, replace, naming.PARAMS)
                placement.prepare(p, lambda m: log.info("restore: %s", m))
                claim = restore.Claim(run_id, int(resolved["ts"]), replace)
                loaded = []
                for t in p.tables:
                    df = spark.read.format("delta").load(restore.out_path(resolved["out"], t.info))
                    n = restore.load_table(placement.target_for(t), names.info(t), stream.python_rows(df, t.info),
                                           claim=claim)
                    loaded.append({"table": t.name, "rows": int(n), "into": names.shown(t)})
            finally:
                if placement is not None:
                    placement.close()
                target.close()
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    return {"loaded": loaded}


def verify(resolved: Mapping[str, Any], loaded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``binlake diff`` of the restored tables in the target against the ``verify`` source;
    the summary is the task's XCom."""
    from binlake import errors
    from binlake.restore import restore

    if not (resolved.get("verify") and resolved.get("target")):
        raise AirflowSkipException("no verify source given")
    # The tables this run loaded (as named in the target); every table when none was.
    names = [str(t["table"]).rpartition(".")[2] for t in (loaded or {}).get("loaded") or []]
    try:
        ok, text = restore.verify(str(resolved["verify"]), str(resolved["target"]), names or None)
    except errors.BinlakeError as exc:
        raise _fail(exc) from None
    log.info("%s", text)
    if not ok:
        raise AirflowFailException(f"the restored target differs from {resolved['verify']}: {text}")
    return {"ok": True, "tables": names, "summary": text}


# ---------------------------------------------------------------- binlake_maintenance
def _nothing_ingested(lake: str) -> bool:
    """Whether nothing was ingested into ``lake`` yet, known without Spark (delta-rs
    reads the ``windows`` ledger). A maintenance run then has nothing to snapshot and
    no window to weigh the Pumps' GC against, and a Spark session for it is a JVM or,
    on a standalone cluster, an application holding the worker's cores while the
    stack's first ingests queue behind it. False when delta-rs cannot tell (a lake on
    another file system, a ledger it cannot read): Spark reads it, and says what is wrong."""
    from binlake import errors
    from binlake.lake import freshness

    try:
        return not freshness.ledger(lake)
    except errors.BinlakeError:
        return False


def snapshot_latest() -> dict[str, Any]:
    """A snapshot at the end of the ledger's contiguous windows (T = end - 1)."""
    from binlake import errors
    from binlake.lake.store.ledger import BOUNDS, read_windows
    from binlake.restore import coverage, snapshot

    lake = maintenance_settings()["lake"]
    if _nothing_ingested(lake):
        raise AirflowSkipException(f"nothing was ingested into {lake} yet: no snapshot to take")
    with _spark_or_connect("binlake-maintenance-snapshot") as spark:
        try:
            ts = coverage.last_restorable(read_windows(spark, lake, BOUNDS))
            if any(e.snapshot_ts == ts for e in snapshot.catalog(spark, lake)):
                return {"snapshot_ts": ts, "taken": False}
            result = snapshot.take(spark, lake, ts, progress=lambda m: log.info("snapshot: %s", m),
                                   parallelism=config.restore_parallelism())
        except errors.NotFound as exc:
            raise AirflowSkipException(str(exc)) from None
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    log.info("%s", result.summary())
    return {"snapshot_ts": ts, "taken": True, "rows": result.rows}


def history_update() -> dict[str, Any]:
    from binlake import errors
    from binlake.restore import history

    with _spark_or_connect("binlake-maintenance-history") as spark:
        try:
            result = history.update(spark, config.lake_dir(), progress=lambda m: log.info("history: %s", m),
                                    parallelism=config.restore_parallelism())
        except errors.NotFound as exc:
            raise AirflowSkipException(str(exc)) from None
        except errors.BinlakeError as exc:
            raise _fail(exc) from None
    log.info("%s", result.summary())
    return {"applied_end_ts": result.applied_end_ts, "tables": len(result.tables)}


def gc_margin_hours() -> float:
    return _maintenance().gc_margin_hours


def maintenance_settings() -> dict[str, Any]:
    """Every setting of the maintenance DAG, checked by each of its first tasks (snapshot,
    gc_report), so a bad one fails the run at its start, without retries, naming it."""
    try:
        lake, registry = config.lake_dir(), config.registry_addr()
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    return {"lake": lake, "registry": registry, "vacuum_retention_hours": vacuum_retention_hours(),
            "gc_margin_hours": gc_margin_hours()}


def vacuum_retention_hours() -> float:
    return _maintenance().vacuum_retention_hours


def _maintenance() -> MaintenanceSettings:
    """The maintenance DAG's settings; a bad one fails the task without retries, naming it."""
    try:
        return config.maintenance()
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None


def optimize_vacuum() -> dict[str, Any]:
    """OPTIMIZE (compact small files) and VACUUM every lake table, snapshot and history table."""
    from binlake.restore import maintenance

    hours = vacuum_retention_hours()
    with _spark_or_connect("binlake-maintenance-optimize") as spark:
        done = maintenance.optimize_vacuum(spark, config.lake_dir(), hours, lambda m: log.info("%s", m))
    return {"tables": done, "retention_hours": hours}


def gc_report(at: dt.datetime | None) -> dict[str, Any]:
    """Each Pump's GC ts against the oldest window the lake has not ingested, as of
    ``at`` (the run's data interval end; now for a run triggered without one); fails when binlogs of it are gone, or will
    be within the margin."""
    from binlake import errors
    from binlake.restore import maintenance

    margin = maintenance_settings()["gc_margin_hours"]
    if at is None:  # triggered by hand without a logical date: as of now
        at = dt.datetime.now(dt.UTC)
    lake, registry = config.lake_dir(), config.registry_addr()
    try:
        if _nothing_ingested(lake):  # every Pump's GC ts against ts 0, as Spark would find it
            report = maintenance.gc_report(None, lake, registry, margin, now=at, windows=[])
        else:
            with _spark_or_connect("binlake-maintenance-gc-report") as spark:
                report = maintenance.gc_report(spark, lake, registry, margin, now=at)
    except errors.BinlakeError as exc:
        raise _fail(exc) from None
    for line in report.lines():
        log.info("%s", line)
    if not report.ok:
        raise AirflowFailException("Pump GC report: " + "; ".join(report.problems))
    return {"pumps": len(report.rows), "oldest_uningested_ts": report.oldest_uningested_ts}

