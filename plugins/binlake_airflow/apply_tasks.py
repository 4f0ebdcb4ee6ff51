"""The bodies of the ``binlake_apply`` tasks, kept out of the DAG file.

Task files come from the setting ``binlake_apply_tasks`` (Airflow Variable, else
env ``BINLAKE_APPLY_TASKS``, else ``config/tasks``): a directory (every
``*.toml`` in it) or a comma-separated list of files. None there (a new stack
with no replication configured) skips the run; a path set but missing fails. A task file's ``target``
is a SQLAlchemy URL or the id of an Airflow Connection (resolved here, when the
task runs). Each run applies every ingested window up to the newest one the
triggering Asset events announce (all ingested windows when run by hand), in
order from the target's checkpoint.

Errors no retry can fix (a bad task file, a target changed by hand:
``binlake.errors.is_final``) fail the task at once (``AirflowFailException``);
anything else (an unreachable target, a window not ingested yet) is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from binlake_airflow import config, sessions

log = logging.getLogger(__name__)

DEFAULT_TASK_DIR = "config/tasks"


def _configured() -> tuple[str, bool]:
    """The setting's text and whether someone set it (False: the default directory)."""
    from binlake import errors

    try:
        text = config.apply_tasks()
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    return (text, True) if text is not None else (DEFAULT_TASK_DIR, False)


def where_task_files_go() -> str:
    """One line saying where the apply DAG looks for task files (``binlake up`` prints it)."""
    return (f"put replication task files (*.toml, see config/task.sample.toml) in "
            f"{config.PROJECT_ROOT / DEFAULT_TASK_DIR}, or set the Airflow Variable binlake_apply_tasks "
            "(env BINLAKE_APPLY_TASKS) to a directory or comma-separated files")


def task_files(setting: str | None = None) -> list[str]:
    """The task files to run, absolute paths, sorted; each one loaded, so a bad file fails
    here (the run's first task) naming the file and its key, without retries.

    Nothing configured (the default directory missing, or a directory without
    ``*.toml``) skips the run (``AirflowSkipException``) with one line saying where task
    files go; a path that is set but does not exist fails.
    """
    from binlake import errors
    from binlake.replicate import task

    text, explicit = (setting, True) if setting is not None else _configured()
    files: list[Path] = []
    dirs: list[Path] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        path = Path(part).expanduser()
        path = path if path.is_absolute() else config.PROJECT_ROOT / path
        if path.is_dir():
            dirs.append(path)
            files.extend(sorted(path.glob("*.toml")))
        elif path.is_file():
            files.append(path)
        elif explicit:
            raise AirflowFailException(
                f"binlake_apply_tasks: {path} is neither a task file nor a directory; "
                "fix the Variable binlake_apply_tasks (or env BINLAKE_APPLY_TASKS)")
    if not files:
        where = ", ".join(str(d) for d in dirs) or str(config.PROJECT_ROOT / DEFAULT_TASK_DIR)
        message = f"no replication task configured (no *.toml in {where}): " + where_task_files_go()
        # Airflow logs only "Skipping task.": the reason goes in the log first.
        log.warning("%s", message)
        raise AirflowSkipException(message)
    targets: dict[str, Path] = {}
    for f in files:
        try:
            t = task.load(f)
        except errors.BinlakeError as exc:
            raise AirflowFailException(f"binlake_apply_tasks: {exc}") from None
        if t.target in targets:
            raise AirflowFailException(
                f"binlake_apply_tasks: task files {targets[t.target]} and {f} write the same target "
                f"{t.target!r}; give each task its own target")
        targets[t.target] = f
    return [str(f) for f in files]


def until_ts(events: Iterable[Mapping[str, Any]]) -> int | None:
    """The newest window end the triggering Asset events announce (None: no events)."""
    ends = [int(e["end_ts"]) for e in events if e and e.get("end_ts") is not None]
    return max(ends) if ends else None


def until_param(value: Any) -> int | None:
    """The run's ``until_ts`` param: None (every ingested window) or a positive TSO."""
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < 1:
        raise AirflowFailException(f"bad params: until_ts must be a TSO (a positive integer) or empty, got {value!r}")
    return int(value)


def resolve_target(target: str) -> str:
    """A task file's target as a SQLAlchemy URL (an Airflow Connection id is looked up)."""
    if "://" in target:
        return target
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(target)
    except Exception as exc:
        raise AirflowFailException(f"target {target!r} is no URL and no Airflow Connection: {exc}") from None
    uri = conn.get_uri()
    # Airflow spells PostgreSQL "postgres://"; binlake.sql.url maps both spellings.
    return uri


def apply(task_file: str, until: int | None) -> dict[str, Any]:
    """Apply one task file's windows up to ``until``; the summary."""
    from binlake import errors
    from binlake.replicate import report, runner, task

    try:
        t = task.load(task_file)
        url = resolve_target(t.target)
        # Endpoint and keys of an S3 lake from the binlake_lake_s3 Connection, before Spark starts.
        config.use_lake_s3_connection()
        # The always-on Spark when one is set (the lake's reads are DataFrame jobs;
        # the target is written from this process, parallel mode included).
        with sessions.job_session("binlake-apply") as spark:
            summary = runner.Applier(spark, t, target_url=url, progress=log.info).run(until)
    except errors.BinlakeError as exc:
        if errors.is_final(exc):
            raise AirflowFailException(f"apply {task_file}: {exc}") from None
        raise AirflowException(f"apply {task_file}: {exc}") from None
    log.info("%s", summary.summary())
    out = report.summary_dict(summary)
    out["task_file"] = task_file
    return out


def diff(result: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the task's target with its ``diff_source``, when the task file names one."""
    from binlake import errors
    from binlake.replicate import task
    from binlake.sql.diff import diff_databases

    t = task.load(str(result["task_file"]))
    if not t.diff_source:
        return {"task": t.name, "diff": "skipped (no diff_source in the task file)"}
    try:
        report = diff_databases(t.diff_source, resolve_target(t.target))
    except errors.BinlakeError as exc:
        raise AirflowException(f"diff {t.name}: {exc}") from None
    log.info("%s", report.summary())
    if not report.ok:
        raise AirflowFailException(f"diff {t.name}: the target differs from {t.diff_source}:\n{report.summary()}")
    return {"task": t.name, "diff": "OK", "tables": len(report.tables)}
