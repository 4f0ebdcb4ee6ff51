"""binlake's jobs as Spark Connect clients of an always-on Spark.

A Spark Connect session (``sc://HOST:PORT``) has no JVM in the client: no
``sparkContext``, no py4j gateway, no RDDs. Everything the ingest needs works
through it (checked against Spark 4.0 + Delta 4.0): the ``binlake`` Python data
source (``spark.dataSource.register`` ships the class to the server, whose
Python workers import binlake), Delta writes with ``replaceWhere``, ``MERGE``
in SQL, ``Observation`` counts and ``createDataFrame``. Delta's Python
``DeltaTable`` API does not: over Connect it needs the Delta Connect (``delta-spark-connect-server``)
plugin on the server, which binlake does not ship, so binlake changes Delta
tables with SQL statements (``MERGE INTO``, ``UPDATE``, ``DELETE``, ``ALTER
TABLE`` on ``delta.`path```), which work over both kinds of session. Nor do
RDDs: the apply's parallel mode runs its buckets in threads of its own process.

This module holds the few places where the two kinds differ, so the jobs
run unchanged on a classic session (``local[*]``, spark-submit) and on a
Connect one.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from binlake.config import REMOTE_PATTERN

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Where binlake's jobs find the always-on Spark (``binlake up`` starts it and sets this).
REMOTE_ENV = "BINLAKE_SPARK_REMOTE"
DEFAULT_PORT = 15002
DEFAULT_REMOTE = f"sc://127.0.0.1:{DEFAULT_PORT}"

# A lost server is retried this many times (about 4 s in all) before the job fails.
RETRIES = 4



def check_remote(url: Any, what: str = "Spark Connect URL") -> str:
    """``url`` if it is a Spark Connect URL ``sc://HOST:PORT``; InvalidArgument naming ``what`` otherwise."""
    from binlake import errors

    if not isinstance(url, str) or not REMOTE_PATTERN.match(url.strip()):
        raise errors.InvalidArgument(
            f"{what} {url!r} is not a Spark Connect URL: use sc://HOST:PORT (e.g. {DEFAULT_REMOTE})")
    return url.strip()


def is_remote(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM in this process)."""
    from pyspark.sql.utils import is_remote as env_remote

    if env_remote():
        return True
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect(url: str, app_name: str = "binlake") -> SparkSession:
    """A Spark Connect session to ``url``; a clear ConnectionError when nobody answers there.

    The session's confs (Delta, jars, time zone) are the server's: ``binlake up``
    and docker-compose start it with binlake's. Only the session time zone is
    set per session, because commit_ts and data intervals are UTC whatever the
    server was told.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    remote = check_remote(url)
    _share_release_pool_safely()
    try:
        # A new session each time (not getOrCreate): one left from a server that
        # went away would only fail again.
        spark = SparkSession.builder.remote(remote).appName(app_name).create()
        # Spark's client retries a lost server for 10 minutes or more; binlake's
        # jobs fail within seconds instead, with a clear message, and leave the
        # retry to the scheduler (Airflow's retries, a backfill re-run).
        spark.client.set_retry_policies([DefaultPolicy(max_retries=RETRIES, initial_backoff=100,
                                                       max_backoff=2000, backoff_multiplier=4.0)])
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    except Exception as exc:
        raise ConnectionError(unreachable(remote, exc)) from None
    return spark  # type: ignore[no-any-return]  # builder.create() is untyped


def delta_table(path: str) -> str:
    """The Delta table at ``path`` as Spark SQL names it in a statement: ``delta.`path```
    (a backquote inside the path doubled)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"a Delta table path is a non-empty str, got {path!r}")
    return f"delta.{sql_ident(path)}"


def sql_ident(name: str) -> str:
    """``name`` (a column or a path) quoted as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


_release_pool_fixed = False


def _share_release_pool_safely() -> None:
    """Make closing one Connect session harmless to the others in this process.

    pyspark 4.0's client keeps one process-wide thread pool for its
    ReleaseExecute calls, and closing *any* session shuts that pool down while
    still publishing it (SPARK-55406; fixed upstream only after 4.0.4). Another
    session still reading results (or an iterator finalised meanwhile) then
    fails with "cannot schedule new futures after shutdown" in the middle of a
    job. binlake's tasks and tests hold more than one session in a process (a
    task's session beside a checker's, a session to a server that was
    restarted), so the pool is detached first and shut down without waiting:
    a new one is made on the next use, and a release still queued on the old
    one is dropped, which the server tolerates (it reaps abandoned executions).
    """
    global _release_pool_fixed
    if _release_pool_fixed:
        return
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as It

    def shutdown(cls: Any) -> None:
        with cls._lock:
            pool, cls._release_thread_pool_instance = cls._release_thread_pool_instance, None
        if pool is not None:
            pool.shutdown(wait=False)

    It.shutdown = classmethod(shutdown)  # type: ignore[method-assign,assignment]
    _release_pool_fixed = True


def unreachable(url: str, exc: BaseException) -> str:
    """The one line for a Connect server that cannot be reached or went away mid-job."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return (f"the Spark Connect server at {url} is not reachable or went away ({first[:200]}); "
            "start it with `binlake up` (or point binlake_spark_remote / BINLAKE_SPARK_REMOTE at a running one)")


def is_connection_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is the client losing its Connect server (killed, restarting,
    unreachable), rather than the job itself failing: a retry may help."""
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in (
        "StatusCode.UNAVAILABLE", "UNAVAILABLE", "Connection refused", "Socket closed",
        "failed to connect to all addresses", "INVALID_HANDLE.SESSION_NOT_FOUND", "SESSION_CLOSED",
        "StatusCode.CANCELLED", "RetriesExceeded"))


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism, which a Connect client cannot ask the server for:
    ``spark.default.parallelism`` when the server sets it (``binlake up`` does), else
    this host's CPU count (the server of ``binlake up`` runs beside its clients)."""
    if not is_remote(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    value = spark.conf.get("spark.default.parallelism", None)
    try:
        return max(1, int(value)) if value else max(1, os.cpu_count() or 1)
    except ValueError:
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def job_description(spark: SparkSession, text: str) -> Iterator[None]:
    """Name the Spark jobs run inside (the UI's description) on a classic session;
    a Connect client tags its operations instead (``spark.addTag``)."""
    if is_remote(spark):
        tag = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "binlake"
        spark.addTag(tag)
        try:
            yield
        finally:
            spark.removeTag(tag)
        return
    spark.sparkContext.setJobDescription(text)
    try:
        yield
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]  # None clears it


def delta_log_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table (its ``_delta_log`` directory exists).

    A classic session asks Hadoop's file system (any scheme Spark knows); a
    Connect client looks at a local path itself and, for a URI, asks the
    server to resolve the table (a missing one fails analysis).
    """
    local = _local_path(path)
    if local is not None:
        # A local lake is on this host's file system for both kinds of session
        # (``binlake up``'s server runs beside its clients): no Spark round trip.
        return os.path.isdir(os.path.join(local, "_delta_log"))
    if not is_remote(spark):
        jvm: Any = spark.sparkContext._jvm  # py4j gateway: untyped
        log = jvm.org.apache.hadoop.fs.Path(f"{path}/_delta_log")
        fs = log.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.exists(log))
    from pyspark.errors import AnalysisException

    try:
        spark.read.format("delta").load(path).schema  # noqa: B018  (analysis only: no job runs)
    except AnalysisException as exc:
        if any(m in str(exc) for m in ("PATH_NOT_FOUND", "DELTA_MISSING_TRANSACTION_LOG", "is not a Delta table")):
            return False
        raise
    return True


def _local_path(path: str) -> str | None:
    """The file-system path of a plain path or ``file:`` URI; None for other schemes."""
    if path.startswith("file:"):
        from urllib.parse import urlparse

        return urlparse(path).path or None
    return None if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path) else path
