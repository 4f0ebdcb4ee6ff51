"""Building a SparkSession for binlake: Delta Lake configured, jars local, UTC.

Every Spark entry point (jobs, tests, the Airflow tasks) goes through
``build_spark`` so that all of them agree on the catalog, the session time zone
and the Python the executors run. The Delta jars are resolved ahead of time by
``make setup`` (Maven, from ``jars/pom.xml``) and put on ``spark.jars``: a
Spark start never downloads anything, so it works offline and is reproducible.
A lake on S3 gets its s3a settings (``binlake.lake.s3settings``) at the start
and, on a session already running, through ``configure_spark``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from binlake import config, errors
from binlake.config import MASTER_PATTERN, S3Settings
from binlake.lake import s3settings
from binlake.lake.sparkenv import connect

if TYPE_CHECKING:
    # pyspark is heavy to import; only load it when a session is really built.
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
JARS_DIR_ENV = "BINLAKE_JARS_DIR"

_DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# Confs that would make Spark resolve artifacts from a repository at start.
_DOWNLOADING_CONFS = ("spark.jars.packages", "spark.jars.repositories", "spark.jars.ivySettings")


def check_master(master: str, what: str = "Spark master") -> str:
    """``master`` if it is a Spark master URL (local[N], spark://HOST:PORT, yarn, k8s://...);
    InvalidArgument naming ``what`` otherwise."""
    if not isinstance(master, str) or not MASTER_PATTERN.match(master.strip()):
        raise errors.InvalidArgument(
            f"{what} {master!r} is not a Spark master URL: use local[N], local[*], spark://HOST:PORT, "
            "yarn, k8s://URL or a Spark Connect server's sc://HOST:PORT")
    return master.strip()


def jars_dir() -> Path:
    """The directory holding the Delta jars: ``$BINLAKE_JARS_DIR``, else ``<checkout>/jars/lib``
    (``binlake.config.PathSettings``)."""
    return config.paths().jars()


def delta_jars() -> list[Path]:
    """Every jar in the Delta jars directory, sorted, for ``spark.jars``.

    Raises RuntimeError when the directory has no delta-spark jar, because a
    session without it only fails later, on the first Delta read or write,
    with a far less helpful ClassNotFoundException.
    """
    directory = jars_dir()
    jars = sorted(p.resolve() for p in directory.glob("*.jar") if p.is_file()) if directory.is_dir() else []
    if not any(p.name.startswith("delta-spark_") for p in jars):
        raise RuntimeError(
            f"no delta-spark jar in {directory}: run `make setup` to fetch the Delta Lake jars "
            f"with Maven (or point {JARS_DIR_ENV} at a directory that has them)"
        )
    return jars


def is_cluster(master: str) -> bool:
    """Whether ``master`` runs executors outside the driver's JVM (spark://, yarn, k8s://):
    they then need binlake importable on their own (the ``binlake`` data source runs there)."""
    return not master.strip().startswith(("local", "sc://"))


def code_zip(cache_dir: Path | None = None) -> Path:
    """A zip of this process's ``binlake`` package (its ``.py`` files), for ``addPyFile``.

    Executors on a cluster unpickle the data source's classes by reference, so they must
    import the same binlake the driver runs; shipping it makes the workers need only
    Python and binlake's dependencies. The zip is named by a hash of its contents, and
    written to a temporary name then renamed: a reader never sees a half-written zip, and
    two drivers building it at once end with the same file. C extensions cannot be
    imported from a zip: executors then use the pure-Python image decoder
    (``binlake.lake.decoding.native``); set ``BINLAKE_SPARK_SHIP_CODE=false`` when every worker
    has this binlake installed, native decoder included.
    """
    import binlake

    root = Path(binlake.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    directory = cache_dir or Path(tempfile.gettempdir()) / "binlake-pyfiles"
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"binlake-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".zip.tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in files:
                z.write(f, str(Path("binlake") / f.relative_to(root)))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def ship_code() -> bool:
    """Whether cluster jobs ship binlake to the executors (``[spark] ship_code``,
    ``$BINLAKE_SPARK_SHIP_CODE``; default yes)."""
    return config.load(config.SparkSettings).ship_code


def configured_master() -> str | None:
    """The master of ``[spark] master`` / ``$BINLAKE_SPARK_MASTER``; None when unset."""
    return config.load(config.SparkSettings).master


# What every binlake entry point that reads or writes the lake adds (CLI, jobs,
# Airflow tasks): Delta rebuilds a table's state with 50 tasks by default, which
# dominates the small tables an ingest reads (windows, ddl_history) on a few
# cores; the console progress bar would interleave with binlake's own progress.
LAKE_CONF = {"spark.databricks.delta.snapshotPartitions": "4", "spark.ui.showConsoleProgress": "false"}


def build_spark(
    app_name: str = "binlake",
    master: str | None = None,
    *,
    ui: bool = False,
    shuffle_partitions: int | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Build (or get) the SparkSession binlake uses, with Delta Lake enabled.

    ``master`` defaults to spark-submit's ``--master`` when running under
    spark-submit, else ``[spark] master`` / ``$BINLAKE_SPARK_MASTER``, else ``local[*]``.
    On a cluster master (``spark://``, yarn, k8s) binlake itself is shipped to
    the executors (``code_zip``) unless ``BINLAKE_SPARK_SHIP_CODE=false``. A Spark
    Connect URL (``sc://HOST:PORT``) gives a client session of that always-on
    server instead (``binlake.lake.sparkenv.connect``); the other arguments are then the
    server's business.
    ``extra_conf`` is applied last, so it may override anything set here
    (e.g. ``spark.pyspark.python`` when executors live on hosts with another
    layout); a ``spark.jars`` in it is appended to the Delta jars rather than
    replacing them. Confs that make Spark download packages are refused.

    As with ``SparkSession.builder.getOrCreate``, a session already running in
    this process is returned as is: static confs such as ``spark.jars`` only
    take effect when the JVM starts.
    """
    # Under spark-submit the JVM already runs with the --master it was given, which the
    # setting must not silently replace (the DAG passes binlake_spark_master as --master).
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or (None if under_submit else configured_master())
    if chosen is not None and chosen.strip().startswith("sc://"):
        # An always-on Spark Connect server: its confs (Delta, jars) are the server's.
        return connect.connect(chosen, app_name)
    extra = dict(extra_conf or {})
    downloading = [key for key in _DOWNLOADING_CONFS if key in extra]
    if downloading:
        raise ValueError(
            f"{', '.join(downloading)} would make Spark download at start; binlake puts local jars "
            "on spark.jars instead (add them to jars/pom.xml and run `make setup`)"
        )
    # Check the jars before touching pyspark: a missing setup is reported in
    # milliseconds instead of after a JVM start.
    jars = [str(p) for p in delta_jars()]
    if extra.get("spark.jars"):
        jars.append(extra.pop("spark.jars"))

    from pyspark.sql import SparkSession

    conf: dict[str, str] = {
        "spark.jars": ",".join(jars),
        **_DELTA_CONF,
        "spark.ui.enabled": "true" if ui else "false",
        "spark.pyspark.python": sys.executable,
        # commit_ts and Airflow data intervals are UTC; never depend on the host zone.
        "spark.sql.session.timeZone": "UTC",
    }
    # The heaps are [memory] settings (one place for every memory bound); they take
    # effect when this call starts the JVM (a running one keeps its own).
    bounds = config.memory()
    conf["spark.driver.memory"] = bounds.driver
    conf["spark.executor.memory"] = bounds.executor
    # Parquet writers size their row groups from a pool of 95 % of the heap by default,
    # which leaves nothing to the tasks that feed them when the heap is small and the
    # rows wide; a third keeps row groups large on any usual heap.
    conf["spark.hadoop.parquet.memory.pool.ratio"] = "0.3"
    if shuffle_partitions is not None:
        if shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions must be >= 1, got {shuffle_partitions}")
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    # The lake may be on S3: the s3a settings from AWS_* / [lake.s3], without the keys
    # (start confs end up on the JVM's command line): those are set on the running
    # session below, and the JVM inherits AWS_* from this process.
    conf.update(s3settings.spark_conf())
    # The Python workers get the settings this command chose from its flags and config
    # file (TLS files, ...) as their environment, as its other child processes do.
    conf.update({f"spark.executorEnv.{name}": value for name, value in config.exported().items()})
    conf.update(extra)

    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit the JVM launched this Python (PYSPARK_GATEWAY_PORT is
    # set) with the --master it was given: keep that unless told otherwise.
    if chosen is not None or not under_submit:
        builder = builder.master(chosen or DEFAULT_MASTER)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    # The driver is this interpreter; Python workers must run the same one (same minor
    # version, same installed packages, e.g. binlake's data source). pyspark takes the
    # workers' interpreter from this attribute when it wraps each function, and would
    # otherwise take $PYSPARK_PYTHON or whatever python3 is first on PATH.
    session.sparkContext.pythonExec = sys.executable
    running = session.sparkContext.master or ""
    if is_cluster(running) and ship_code():
        # Executors import binlake from the zip before any installed copy (pyspark puts
        # shipped files first on their sys.path); the driver keeps its own, already imported.
        # (A session reused by getOrCreate has it already: pyspark lists shipped files by name.)
        zipped = code_zip()
        if zipped.name not in (getattr(session.sparkContext, "_python_includes", None) or []):
            session.sparkContext.addPyFile(str(zipped))
    # A session already running in this process keeps its start-time confs: bring
    # its Hadoop configuration up to the S3 settings in force now.
    configure_spark(session)
    return session


def configure_spark(spark: SparkSession, settings: S3Settings | None = None) -> None:
    """Apply the s3a confs to a running classic session's Hadoop configuration (the
    one Delta and binlake's log checks open file systems with)."""
    if connect.is_remote(spark):
        return  # a Spark Connect server holds its own settings
    conf = s3settings.hadoop_conf(settings)
    key = (id(spark), tuple(sorted(conf.items())))
    if _configured.get(id(spark)) == key:
        return  # already in force: no py4j round trips
    hconf: Any = spark.sparkContext._jsc.hadoopConfiguration()  # py4j: untyped
    for name, value in conf.items():
        hconf.set(name, value)
    _configured[id(spark)] = key


# The s3a settings last applied to each session (by id), so re-applying is free.
_configured: dict[int, tuple[int, tuple[tuple[str, str], ...]]] = {}


def command_session(master: str | None = None, quiet: bool = True) -> SparkSession:
    """The session a ``binlake`` command runs its Spark jobs in (``build_spark`` with
    ``LAKE_CONF``); ``quiet``: Spark's own logs off on a local session, since failures
    reach the user as one line (``spark_errors.command_error``) and Spark's task logs
    would bury it."""
    spark = build_spark("binlake-cli", master, extra_conf=LAKE_CONF)
    if quiet and not connect.is_remote(spark):
        spark.sparkContext.setLogLevel("FATAL")
    return spark
