"""Which Spark a DAG task's job runs on: the always-on Spark, else one of its own.

Every task that runs a Spark job in its own process (the restore and
maintenance DAGs' tasks, the apply DAG's) takes its session here, so they all
choose the same way (docs/how-to/hosts/spark.md, "The always-on Spark"): a Spark Connect client of
the server at ``binlake_spark_remote`` / ``BINLAKE_SPARK_REMOTE`` when one is
set (``binlake up`` and docker-compose set it), else a session of its own
(``binlake_spark_master``, default ``local[*]``). The ingest DAG chooses with
its own setting (``binlake_ingest_mode``), which adds spark-submit per window.

pyspark is imported inside the functions: the DAG files parse without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from binlake import errors
from binlake_airflow import config


@contextmanager
def own_session(name: str) -> Iterator[Any]:
    """A classic session in this process (``binlake_spark_master``, default ``local[*]``),
    stopped at the end unless it was already running here (``dag.test`` in a test
    process reuses and keeps the shared one)."""
    from pyspark.sql import SparkSession

    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark

    owned = SparkSession.getActiveSession() is None
    spark = build_spark(name, master=config.spark_master(), extra_conf=LAKE_CONF)
    try:
        yield spark
    finally:
        if owned:
            spark.stop()


@contextmanager
def job_session(name: str) -> Iterator[Any]:
    """A Spark Connect session to the always-on Spark when one is set, else
    ``own_session``'s. A bad setting fails the task without retries; a server
    that does not answer fails it for a retry, with one line naming it."""
    from binlake.lake.sparkenv import connect

    try:
        remote = config.spark_remote()
    except errors.ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    if not remote:
        with own_session(name) as spark:
            yield spark
        return
    try:
        session = connect.connect(remote, name)
    except ConnectionError as exc:
        raise AirflowException(f"{name} failed, will retry: {exc}") from None
    try:
        yield session
    finally:
        with suppress(Exception):  # a lost server cannot be told
            session.stop()
