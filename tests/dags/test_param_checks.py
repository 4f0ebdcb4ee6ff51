"""The DAGs' first-task checks without a run: the restore params and their
combinations, the apply task files, the maintenance settings, the ingest
deadline; and the per-run claims of restore targets (a real SQLite target).
Each bad value fails with ``AirflowFailException`` (no retries) naming it.

(The same checks inside real runs, triggered as the UI does, are in
tests/e2e/test_dag_journeys.py.)
"""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from binlake_airflow import apply_tasks, config, deadline, restore_tasks, undo_tasks

from binlake import errors
from binlake.restore import claims
from binlake.sql import schema as sc
from binlake.sql.url import open_target

FORM = {"commit_ts": None, "datetime": None, "tz": None, "tables": None, "out": None, "target": None,
        "verify": None, "replace": False, "rename": None, "into_schema": None}


def _resolve(**filled: Any) -> dict[str, Any]:
    return restore_tasks.resolve({**FORM, **filled}, "manual__2026-11-26T01:00:00+00:00")


def test_the_form_defaults_with_a_datetime_and_a_target_resolve(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("BINLAKE_LAKE_DIR", str(tmp_path / "lake"))
    r = _resolve(datetime="2026-11-21T08:00:00", tz="UTC", target="sqlite:///x.db", verify="sqlite:///up.db",
                 tables="", out="")
    assert r["tables"] is None and r["target"] == "sqlite:///x.db" and r["replace_target"] is False
    assert r["out"].startswith(str(tmp_path / "lake" / "restores" / "manual__2026-11-26T01_00_00_00_00"))
    assert _resolve(commit_ts=5, out="/o", tables="main.a, b  c,")["tables"] == ["main.a", "b", "c"]
    assert _resolve(commit_ts="5", out="/o", tables=["a", " b "])["tables"] == ["a", "b"]
    r = _resolve(commit_ts=5, target="postgresql://u@h/db", rename="main.a=main.a_old, b=c", into_schema="")
    assert r["rename"] == [["main.a", "main.a_old"], ["b", "c"]] and r["into_schema"] is None
    assert _resolve(commit_ts=5, target="mysql://u@h/db", into_schema="restored")["into_schema"] == "restored"


@pytest.mark.parametrize(("filled", "message"), [
    ({}, "exactly one of a commit_ts"),
    ({"commit_ts": 5, "datetime": "2026-11-21T08:00:00", "out": "/o"}, "exactly one of a commit_ts"),
    ({"commit_ts": 5, "tz": "UTC", "out": "/o"}, "tz applies to datetime only"),
    ({"tz": "UTC", "out": "/o"}, "tz is set but datetime is empty"),
    ({"datetime": "2026-11-21T08:00", "tz": "Mars/Base", "out": "/o"}, "unknown time zone"),
    ({"commit_ts": "soon", "out": "/o"}, "commit_ts: give a TSO"),
    ({"commit_ts": True, "out": "/o"}, "commit_ts: give a TSO"),
    ({"commit_ts": 5}, "exactly one destination"),
    ({"commit_ts": 5, "out": "/o", "target": "sqlite:///x.db"}, "exactly one destination"),
    ({"commit_ts": 5, "out": "rel"}, "out: give an absolute directory"),
    ({"commit_ts": 5, "target": "x.db"}, "target: give a SQLAlchemy URL"),
    ({"commit_ts": 5, "out": "/o", "verify": "sqlite:///u.db"}, "verify compares a target database"),
    ({"commit_ts": 5, "target": "sqlite:///u.db", "verify": "sqlite:///u.db"}, "the same database"),
    ({"commit_ts": 5, "out": "/o", "tables": "a.b.c"}, "'a.b.c' is not TABLE or DB.TABLE"),
    ({"commit_ts": 5, "out": "/o", "tables": 7}, "tables: give table names"),
    ({"commit_ts": 5, "out": "/o", "replace": "yes"}, "replace: give true or false"),
    ({"commit_ts": 5, "out": "/o", "rename": "a"}, "rename 'a': give OLD=NEW"),
    ({"commit_ts": 5, "out": "/o", "rename": "a=b.c.d"}, "'b.c.d' is not TABLE or DB.TABLE"),
    ({"commit_ts": 5, "out": "/o", "rename": 3}, "rename: give a string"),
    ({"commit_ts": 5, "out": "/o", "into_schema": "a.b"}, "into_schema 'a.b': give one schema"),
    ({"commit_ts": 5, "target": "sqlite:///x.db", "into_schema": "s"}, "into_schema: SQLite has no schemas"),
    ({"commit_ts": 5, "target": "duckdb:///x.duckdb", "into_schema": "s"}, "DuckDB has no schemas"),
    ({"commit_ts": 5, "target": "sqlite:///x.db", "verify": "sqlite:///u.db", "rename": "a=b"},
     "verify compares tables under their own names"),
])
def test_bad_restore_params_name_the_param(filled: dict[str, Any], message: str) -> None:
    with pytest.raises(AirflowFailException, match="bad params") as caught:
        _resolve(**filled)
    assert message in str(caught.value)


UNDO_FORM = {"start": None, "end": None, "tz": None, "txn": None, "tables": None, "where": None, "target": None,
             "dry_run": True, "skip_conflicts": False, "force": False, "max_conflicts": 20}


def test_the_undo_form_with_a_range_and_a_target_checks(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("BINLAKE_LAKE_DIR", str(tmp_path / "lake"))
    r = undo_tasks.check({**UNDO_FORM, "start": "100", "end": "2026-11-21T08:00:00", "tz": "UTC", "tables": "",
                          "target": f"sqlite:///{tmp_path / 'x.db'}"}, "manual__1")
    assert r["dry_run"] is True and r["selection"]["start_ts"] == 100 and r["selection"]["tables"] is None
    assert r["sql_file"] == str(tmp_path / "lake" / "undo" / "manual__1.sql")


@pytest.mark.parametrize(("filled", "message"), [
    ({}, "target: give the URL"),
    ({"target": "sqlite:///x.db"}, "say which changes"),
    ({"target": "sqlite:///x.db", "start": "200", "end": "100"}, "end (100) must be after start"),
    ({"target": "sqlite:///x.db", "start": "100", "end": "200", "txn": "5"}, "either start/end or txn"),
    ({"target": "sqlite:///x.db", "txn": "5,x"}, "txn takes start_ts values"),
    ({"target": "sqlite:///x.db", "start": "soon", "end": "200"}, "start:"),
    ({"target": "sqlite:///x.db", "txn": "5", "where": 5}, "where: give a string"),
    ({"target": "x.db", "txn": "5"}, "target must be a database URL"),
    ({"target": "sqlite:///x.db", "txn": "5", "skip_conflicts": True, "force": True}, "skip_conflicts or force, not both"),
    ({"target": "sqlite:///x.db", "txn": "5", "dry_run": "no"}, "dry_run: give true or false"),
    ({"target": "sqlite:///x.db", "txn": "5", "max_conflicts": -1}, "max_conflicts: give a number"),
])
def test_bad_undo_params_name_the_param(filled: dict[str, Any], message: str, tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AirflowFailException, match="bad params") as caught:
        undo_tasks.check({**UNDO_FORM, **filled}, "manual__1")
    assert message in str(caught.value)


def _info(name: str) -> Any:
    return sc.new_table(7, "main", name, [sc.ColumnDef("id", "int", False)], ["id"], None, 1)


def test_a_target_table_is_replaced_only_by_the_run_that_made_it(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with open_target(url) as target:
        claims.create(target, _info("a"), "run1", 10, replace=False)
        target.bulk_load(_info("a"), [{"id": 1}])
        claims.refuse_foreign(target, ["a"], "run1", replace=False)  # its own: fine (a retry)
        claims.create(target, _info("a"), "run1", 10, replace=False)  # the retry replaces it
        assert target.table_names().count("a") == 1
        with pytest.raises(errors.AlreadyExists, match=r"already holds table\(s\) a that this run did not create"):
            claims.refuse_foreign(target, ["a", "b"], "run2", replace=False)
        with pytest.raises(errors.AlreadyExists, match="already holds table a"):
            claims.create(target, _info("a"), "run2", 11, replace=False)
        # A table made by hand is nobody's run's.
        with target.engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE b (id INTEGER)")
        assert claims.foreign_tables(target, ["a", "b"], "run1") == ["b"]
        claims.create(target, _info("b"), "run2", 11, replace=True)  # replace: taken over
        assert claims.foreign_tables(target, ["a", "b"], "run2") == ["a"]
    with pytest.raises(ValueError, match="run_id"):
        claims.foreign_tables(object(), ["a"], "")


def test_apply_without_task_files_is_skipped_and_a_missing_path_fails(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BINLAKE_APPLY_TASKS", raising=False)
    monkeypatch.setattr(config, "PROJECT_ROOT", tmp_path)  # no config/tasks there
    with pytest.raises(AirflowSkipException, match="no replication task configured.*config/tasks"):
        apply_tasks.task_files()
    (tmp_path / "empty").mkdir()
    with pytest.raises(AirflowSkipException, match="no replication task configured"):
        apply_tasks.task_files(str(tmp_path / "empty"))
    with pytest.raises(AirflowFailException, match="nope is neither a task file nor a directory"):
        apply_tasks.task_files(str(tmp_path / "nope"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("a", "b"):
        (tasks / f"{name}.toml").write_text(f'name = "{name}"\nlake = "/l"\ntarget = "sqlite:///same.db"\n'
                                            'mode = "consistent"\n')
    with pytest.raises(AirflowFailException, match="write the same target"):
        apply_tasks.task_files(str(tasks))
    (tasks / "b.toml").write_text('name = "b"\nlake = "/l"\ntarget = "sqlite:///b.db"\nmode = "fast"\n')
    with pytest.raises(AirflowFailException, match=r"b\.toml.*mode"):
        apply_tasks.task_files(str(tasks))
    (tasks / "b.toml").write_text('name = "b"\nlake = "/l"\ntarget = "sqlite:///b.db"\nmode = "parallel"\n')
    assert apply_tasks.task_files(str(tasks)) == [str(tasks / "a.toml"), str(tasks / "b.toml")]
    assert apply_tasks.until_param(None) is None and apply_tasks.until_param(42) == 42
    with pytest.raises(AirflowFailException, match="until_ts must be a TSO"):
        apply_tasks.until_param("soon")


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("BINLAKE_VACUUM_RETENTION_HOURS", "0", "binlake_vacuum_retention_hours: Input should be greater than or equal to 1"),
    ("BINLAKE_GC_MARGIN_HOURS", "soon", "binlake_gc_margin_hours: Input should be a valid number"),
    ("BINLAKE_REGISTRY", "nowhere", "binlake_registry"),
])
def test_bad_maintenance_settings_fail_its_first_tasks(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                                       message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(AirflowFailException) as caught:
        restore_tasks.maintenance_settings()
    assert message in str(caught.value)


def test_ingest_deadline_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    five = config.ingest_timetable("5m")
    start = config.DEFAULT_START_DATE
    assert deadline.grace("") == dt.timedelta(minutes=15) and deadline.grace("off") is None
    assert deadline.window_length(config.ingest_timetable("*/10 * * * *"), start) == dt.timedelta(minutes=10)
    monkeypatch.setenv(deadline.DEADLINE_ENV, "30s")
    alert = deadline.alert(five, start)
    assert alert.interval == dt.timedelta(minutes=5, seconds=30)
    for env, value, message in ((deadline.DEADLINE_ENV, "soon", "is not a duration"),
                                (deadline.CALLBACK_ENV, "nodots", "dotted path"),
                                (deadline.WEBHOOK_ENV, "ftp://x", r"an http\(s\) URL")):
        monkeypatch.setenv(env, value)
        with pytest.raises(errors.ConfigError, match=message):
            deadline.alert(five, start)
        monkeypatch.delenv(env)
    monkeypatch.setenv(deadline.DEADLINE_ENV, "off")
    assert deadline.alert(five, start) is None


def test_the_deadline_callback_describes_the_late_window() -> None:
    import asyncio

    context = {"dag_run": {"dag_id": "binlake_ingest", "dag_run_id": "r1", "state": "running",
                           "data_interval_start": "2026-11-26T01:00:00+00:00",
                           "data_interval_end": "2026-11-26T01:05:00+00:00"},
               "deadline": {"deadline_time": "2026-11-26T01:20:00+00:00"}}
    payload = deadline.describe(context, 900.0)
    assert payload["run_id"] == "r1" and payload["window_end"] == "2026-11-26T01:05:00+00:00"
    # Airflow keeps a callback's result in a text column: a string, never a dict.
    out = asyncio.run(deadline.window_late(None, 900.0, context))
    assert out == payload["text"] and "is not in the lake 900s after it closed (run r1)" in out


def test_spark_master_setting_and_the_submit_operators_master(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from binlake_airflow.operators import IngestSubmitOperator

    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "spark:/h1")
    with pytest.raises(errors.ConfigError, match=r"BINLAKE_SPARK_MASTER / Airflow Variable binlake_spark_master: .*not a Spark master URL"):
        config.spark_master()
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "spark://h1:7077")
    assert config.spark_master() == "spark://h1:7077"
    # spark-submit ingests: the setting (rendered into `master`) wins over spark_default's.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = IngestSubmitOperator(task_id="ingest", application="jobs/ingest.py", conn_id="spark_default",
                              master="spark://h1:7077")
    assert "master" in op.template_fields
    assert op._get_hook()._connection["master"] == "spark://h1:7077"
    op = IngestSubmitOperator(task_id="ingest", application="jobs/ingest.py", conn_id="spark_default", master="")
    assert op._get_hook()._connection["master"] == "local[2]"
    # Its driver and executors get the [memory] heaps on spark-submit's command line.
    monkeypatch.setenv("BINLAKE_MEMORY_DRIVER", "1500m")
    monkeypatch.setenv("BINLAKE_MEMORY_EXECUTOR", "900m")
    op = IngestSubmitOperator(task_id="ingest", application="jobs/ingest.py", conn_id="spark_default")
    command = op._get_hook()._build_spark_submit_command("jobs/ingest.py")
    assert command[command.index("--driver-memory") + 1] == "1500m"
    assert command[command.index("--executor-memory") + 1] == "900m"


def test_maintenance_of_a_lake_nothing_was_ingested_into_starts_no_spark(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, registry: Any, reg: Any) -> None:
    """A new stack's first maintenance run: the snapshot is skipped and the GC report
    made (no window ingested, so every Pump's GC ts is weighed against ts 0) without a
    Spark session, which on a cluster would hold the worker's cores from the first ingests."""
    from binlake.registry.model import NodeRecord

    def no_spark(name: str) -> Any:
        raise AssertionError(f"{name} started Spark for a lake nothing was ingested into")

    monkeypatch.setattr(restore_tasks, "_spark_or_connect", no_spark)
    monkeypatch.setenv("BINLAKE_LAKE_DIR", str(tmp_path / "lake"))
    monkeypatch.setenv("BINLAKE_REGISTRY", registry.addr)
    reg.register(NodeRecord(node_id="pump1", kind="pump", addr="127.0.0.1:9"))
    with pytest.raises(AirflowSkipException, match="nothing was ingested"):
        restore_tasks.snapshot_latest()
    assert restore_tasks.gc_report(dt.datetime.now(dt.UTC)) == {"pumps": 1, "oldest_uningested_ts": 0}


def test_the_drill_form_defaults_resolve_to_a_drawn_drill() -> None:
    from binlake_airflow import drill_tasks

    empty = {name: None for name in drill_tasks.PARAMS}
    assert drill_tasks.check(empty) == {**empty, "tables": None}
    full = drill_tasks.check({"ts": 5, "tables": "main.a, b", "count": 2, "seed": 0, "until_ts": "9",
                              "target": "sqlite:////tmp/d.db", "upstream": "sqlite:////tmp/u.db", "rpo_s": 60,
                              "rto_s": "1.5"})
    assert full["tables"] == ["main.a", "b"] and full["until_ts"] == 9 and full["rto_s"] == 1.5 and full["seed"] == 0


@pytest.mark.parametrize(("filled", "message"), [
    ({"ts": "soon"}, "ts: give an integer"),
    ({"ts": True}, "ts: give an integer"),
    ({"count": 0}, "count: give an integer of at least 1"),
    ({"seed": -1}, "seed: give an integer of at least 0"),
    ({"tables": "a.b.c"}, "tables: give comma-separated"),
    ({"tables": 7}, "tables: give comma-separated"),
    ({"target": "x.db"}, "target: give a SQLAlchemy URL"),
    ({"upstream": 3}, "upstream: give a SQLAlchemy URL"),
    ({"rpo_s": 0}, "rpo_s: give a number of seconds above 0"),
    ({"rto_s": "fast"}, "rto_s: give a number of seconds above 0"),
    ({"nope": 1}, "unknown nope"),
])
def test_bad_drill_params_name_the_param(filled: dict[str, Any], message: str) -> None:
    from binlake_airflow import drill_tasks

    with pytest.raises(AirflowFailException, match="bad params") as caught:
        drill_tasks.check(filled)
    assert message in str(caught.value)
