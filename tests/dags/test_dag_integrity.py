"""Every DAG in dags/ imports cleanly and follows the project's rules.

The files are loaded through Airflow's own DagBag while every way out of the
process is blocked: sockets, gRPC channels, Airflow Variables and
Connections. A DAG file that talks to the network or reads a setting while it
is parsed fails here instead of slowing down (or hanging) the DAG processor.
"""

from __future__ import annotations

import ast
import contextlib
import pathlib
import socket
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from binlake_airflow import config

from binlake import errors

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"


class ParseTimeAccess(AssertionError):
    pass


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ParseTimeAccess(f"{what} called while parsing DAG files (args {args!r})")

    return refuse


@contextlib.contextmanager
def _offline() -> Iterator[list[str]]:
    """Block the network and Airflow's settings stores; collect what was attempted."""
    from airflow.sdk.bases.hook import BaseHook
    from airflow.sdk.definitions.connection import Connection
    from airflow.sdk.definitions.variable import Variable

    import binlake.registry.client

    targets = {
        "socket.socket.connect": (socket.socket, "connect"),
        "socket.socket.connect_ex": (socket.socket, "connect_ex"),
        "socket.create_connection": (socket, "create_connection"),
        "socket.getaddrinfo": (socket, "getaddrinfo"),
        "Variable.get": (Variable, "get"),
        "Connection.get": (Connection, "get"),
        "BaseHook.get_connection": (BaseHook, "get_connection"),
        "RegistryClient": (binlake.registry.client.RegistryClient, "__init__"),
    }
    with contextlib.ExitStack() as stack:
        for name, (owner, attr) in targets.items():
            stack.enter_context(mock.patch.object(owner, attr, _refuse(name)))
        import grpc

        stack.enter_context(mock.patch.object(grpc, "insecure_channel", _refuse("grpc.insecure_channel")))
        # Module-level code of the plugins package must run under the patches too.
        saved = {k: v for k, v in sys.modules.items() if k == "binlake_airflow" or k.startswith("binlake_airflow.")}
        for k in saved:
            del sys.modules[k]
        try:
            yield []
        finally:
            for k in [k for k in sys.modules if k == "binlake_airflow" or k.startswith("binlake_airflow.")]:
                del sys.modules[k]
            sys.modules.update(saved)


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    with _offline():
        # Examples are off through AIRFLOW__CORE__LOAD_EXAMPLES (Airflow 3's DagBag
        # no longer takes include_examples).
        return DagBag(dag_folder=str(DAGS))


def test_no_import_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}, "\n".join(f"{f}:\n{e}" for f, e in dagbag.import_errors.items())
    files = sorted(p.stem for p in DAGS.glob("*.py") if not p.name.startswith("_"))
    assert sorted(dagbag.dag_ids) == files, "one DAG per file in dags/"
    assert "binlake_ingest" in dagbag.dag_ids


def test_parse_is_offline_and_reads_no_settings() -> None:
    """A DAG file whose parse reads a Variable is reported, so the guard works."""
    from airflow.dag_processing.dagbag import DagBag

    with _offline():
        bad = DagBag(dag_folder=str(pathlib.Path(__file__).parent / "bad_dags"))
    assert len(bad.import_errors) == 1
    (error,) = bad.import_errors.values()
    assert "Variable.get called while parsing" in error


def test_every_dag_follows_the_rules(dagbag: Any) -> None:
    for dag_id, dag in dagbag.dags.items():
        path = pathlib.Path(dag.fileloc)
        assert path.stem == dag_id, f"{path.name} must define the DAG {path.stem!r}"
        assert dag.tags, f"{dag_id}: no tags"
        assert dag.doc_md and dag.doc_md.strip(), f"{dag_id}: no doc_md"
        assert dag.default_args.get("retries", 0) >= 1, f"{dag_id}: default_args retries must be >= 1"
        for t in dag.tasks:
            assert t.retries >= 1, f"{dag_id}.{t.task_id}: retries {t.retries}"
        assert _passes_keyword(path, "catchup"), f"{dag_id}: set catchup explicitly in @dag/DAG(...)"


def _passes_keyword(path: pathlib.Path, keyword: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in ("dag", "DAG") and any(k.arg == keyword for k in node.keywords):
                return True
    return False


def test_ingest_dag_shape(dagbag: Any) -> None:
    dag = dagbag.dags["binlake_ingest"]
    assert dag.catchup is True
    assert dag.max_active_runs == 4
    assert set(dag.tags) == {"binlake", "ingest"}
    assert dag.default_args["retry_exponential_backoff"] > 1
    assert dag.start_date.tzinfo is not None
    assert type(dag.timetable).__name__ == "DeltaDataIntervalTimetable"
    tasks = dag.task_dict
    assert set(tasks) == {"plan", "wait", "choose_ingest", "ingest", "ingest_inprocess", "publish"}
    assert tasks["wait"].upstream_task_ids == {"plan"}
    assert tasks["choose_ingest"].upstream_task_ids == {"plan", "wait"}
    assert tasks["ingest"].upstream_task_ids == {"choose_ingest"}
    assert tasks["ingest_inprocess"].upstream_task_ids == {"plan", "choose_ingest"}
    assert tasks["publish"].upstream_task_ids == {"plan", "wait", "ingest", "ingest_inprocess"}
    assert tasks["publish"].trigger_rule == "none_failed_min_one_success"
    assert [a.uri for a in tasks["publish"].outlets] == ["binlake://lake/changes"]
    spark = tasks["ingest"]
    assert type(spark).__name__ == "IngestSubmitOperator"
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from binlake_airflow import operators

    from binlake import errors

    assert isinstance(spark, SparkSubmitOperator)
    # The operator spells the job's "no retry can help" exit status itself (no binlake import at parse time).
    assert operators.EXIT_FINAL == errors.EXIT_FINAL
    assert spark._conn_id == "spark_default"
    assert pathlib.Path(spark.application) == config.ingest_job()
    assert spark.application_args[:2] == ["--start-ts", "{{ ti.xcom_pull(task_ids='plan', key='start_ts') }}"]
    assert type(tasks["wait"]).__name__ == "WaitForSafeTsOperator"


@pytest.mark.parametrize(
    ("spec", "kind", "detail"),
    [
        ("5m", "DeltaDataIntervalTimetable", 300.0),
        ("90s", "DeltaDataIntervalTimetable", 90.0),
        ("1h", "DeltaDataIntervalTimetable", 3600.0),
        ("*/10 * * * *", "CronDataIntervalTimetable", "*/10 * * * *"),
        ("@hourly", "CronDataIntervalTimetable", "0 * * * *"),
    ],
)
def test_schedule_setting(spec: str, kind: str, detail: Any) -> None:
    timetable = config.ingest_timetable(spec)
    assert type(timetable).__name__ == kind
    if kind.startswith("Delta"):
        assert timetable.delta.total_seconds() == detail
    else:
        assert timetable.expression == detail


@pytest.mark.parametrize("spec", ["every five minutes", "0s", "61 * * * *"])
def test_bad_schedule_setting_names_the_variable(spec: str) -> None:
    with pytest.raises(errors.ConfigError, match="BINLAKE_INGEST_SCHEDULE"):
        config.ingest_timetable(spec)


def test_start_date_setting() -> None:
    assert config.ingest_start_date("").isoformat() == "2026-11-01T00:00:00+00:00"
    assert config.ingest_start_date("2026-11-21T08:05").isoformat() == "2026-11-21T08:05:00+00:00"
    with pytest.raises(errors.ConfigError, match="BINLAKE_INGEST_START_DATE"):
        config.ingest_start_date("yesterday")


def test_max_active_runs_setting() -> None:
    assert config.ingest_max_active_runs("") == config.DEFAULT_MAX_ACTIVE_RUNS
    assert config.ingest_max_active_runs("16") == 16
    for bad in ("0", "many", "1000"):
        with pytest.raises(errors.ConfigError, match="BINLAKE_INGEST_MAX_ACTIVE_RUNS"):
            config.ingest_max_active_runs(bad)


def test_connect_and_inprocess_run_inside_the_task() -> None:
    from binlake_airflow import ingest_tasks

    assert ingest_tasks.choose_ingest(config.CONNECT) == ingest_tasks.INPROCESS_TASK
    assert ingest_tasks.choose_ingest(config.INPROCESS) == ingest_tasks.INPROCESS_TASK
    assert ingest_tasks.choose_ingest(config.SPARK_SUBMIT) == ingest_tasks.SPARK_SUBMIT_TASK
