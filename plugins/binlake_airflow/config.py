"""Where binlake's Airflow tasks find the registry, the lake and Spark: the Airflow
Variables and Connections as a settings source of ``binlake.config``'s model.

Run-time settings are resolved when a task runs, never when a DAG file is
parsed: the DAG processor parses every file every few seconds, and a
Variable or Connection read there is a metadata-database (or secrets-backend)
round trip per parse. Each run-time setting is a field of ``binlake.config``
that names its Variable (``airflow_variable``); ``AirflowSource`` puts, in
this order:

1. the Airflow Connection of the field, for the registry (``binlake_registry``:
   a registry group is an endpoint like the databases the DAGs reach, and an
   Airflow user keeps those as Connections);
2. the Airflow Variable (``binlake_registry``, ``binlake_lake``, ...), which
   also covers ``AIRFLOW_VAR_BINLAKE_*`` environment variables and any
   secrets backend, so an operator can change it in the UI;

above the ``BINLAKE_*`` environment variable of the worker (``binlake up`` and
``docker-compose.yaml`` set these for their whole stack), then the default.
An S3 lake's endpoint and keys come first from the ``binlake_lake_s3``
Connection (``use_lake_s3_connection``).

Relative lake paths are resolved against the project root (the directory
holding ``dags/`` and ``plugins/``), not the working directory: Airflow
starts task processes from wherever the scheduler or worker was started.

The ingest DAG's shape (schedule, start date, runs at once, deadline) is read
at parse time, from the environment only (``binlake.config.IngestDagSettings``);
changing it means restarting the DAG processor with the new environment.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from binlake import config, errors
from binlake.net import DEFAULT_REGISTRY_ADDR, parse_addr_list

# plugins/binlake_airflow/config.py -> parents[2] is the project root.
PROJECT_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_LAKE_DIR = "data/lake"
# A fixed start date, as Airflow requires for stable serialized DAGs. Catchup
# starts here unless BINLAKE_INGEST_START_DATE moves it (``binlake up`` sets it
# to the day the stack first came up, so a new stack does not replay months
# of empty windows).
DEFAULT_START_DATE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DEFAULT_MAX_ACTIVE_RUNS: int = config.IngestDagSettings.model_fields["max_active_runs"].default

SPARK_SUBMIT = "spark-submit"
INPROCESS = "inprocess"
CONNECT = "connect"
INGEST_MODES = config.INGEST_MODES

SCHEDULE_ENV = config.env_names(config.IngestDagSettings, "schedule")[0]
MAX_ACTIVE_RUNS_ENV = config.env_names(config.IngestDagSettings, "max_active_runs")[0]
START_DATE_ENV = config.env_names(config.IngestDagSettings, "start_date")[0]
# The Connection holding the registry group: conn type ``generic``, host the
# comma-separated members, port the port of members that name none.
REGISTRY_CONN_ID = "binlake_registry"
# The Connection of an S3 lake: conn type ``aws``, login the access key id,
# password the secret key, extra ``endpoint_url`` and ``region_name``.
LAKE_S3_CONN_ID = "binlake_lake_s3"

S = TypeVar("S", bound=BaseSettings)


# --------------------------------------------------------------------------- run time


def _variable(key: str) -> str | None:
    # Imported here so that importing this module (at parse time) never touches
    # Variables, and so the module stays importable where only the Task SDK is.
    from airflow.sdk import Variable

    value: Any = Variable.get(key, default=None)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


class AirflowSource(PydanticBaseSettingsSource):
    """The Airflow Connections and Variables that fields of ``binlake.config`` name,
    as a pydantic-settings source (placed above the environment); for ``[lake.s3]``
    the ``binlake_lake_s3`` Connection."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        connection = config.airflow_connection(field)
        value = _connection_value(connection) if connection is not None else None
        if value is None:
            variable = config.airflow_variable(field)
            value = _variable(variable) if variable is not None else None
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if issubclass(self.settings_cls, config.S3Settings):
            out.update(_lake_s3_connection())
        for name, field in self.settings_cls.model_fields.items():
            if name not in out:
                value, _, _ = self.get_field_value(field, name)
                if value is not None:
                    out[name] = value
        return config.source_keys(self.settings_cls, out)


def load(cls: type[S]) -> S:
    """Section ``cls`` of the model as a task sees it: Airflow Connections and Variables
    above the environment (``errors.ConfigError``, one line, for a value it refuses)."""
    return config.load(cls, sources=(AirflowSource,))


def registry_from_connection(host: str | None, port: int | None) -> str:
    """The registry list a ``binlake_registry`` Connection's ``host`` and ``port`` give.

    ``host`` is one member or a comma-separated group (``h1:8230,h2:8230``);
    a member without a port takes the Connection's ``port`` (so
    ``generic://h1,h2,h3:8230`` as a URI is the group ``h1:8230,h2:8230,h3:8230``).
    Raises ConfigError naming the Connection when the list is malformed.
    """
    where = f"Airflow Connection {REGISTRY_CONN_ID}"
    text = (host or "").strip()
    if not text:
        raise errors.ConfigError(f"{where} has no host: set it to the registry group, e.g. h1:8230,h2:8230,h3:8230")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise errors.ConfigError(f"{where}: port {port!r} is not a TCP port (1-65535)")
    members = []
    for part in text.split(","):
        item = part.strip()
        # A bare name or IPv4 address (no colon) or a bracketed IPv6 one without
        # a port takes the Connection's port; anything else is parsed as given.
        if port is not None and item and (":" not in item or (item.startswith("[") and item.endswith("]"))):
            item = f"{item}:{port}"
        members.append(item)
    addr = ",".join(members)
    try:
        parse_addr_list(addr, "registry address list")
    except errors.InvalidArgument as exc:
        raise errors.ConfigError(
            f"{where}: {exc}; its host must list the registry group as HOST:PORT[,HOST:PORT...] "
            "(or HOST[,HOST...] with the port in the Connection's port field)"
        ) from None
    return addr


def _connection_value(conn_id: str) -> str | None:
    """The registry list of the ``binlake_registry`` Connection; None when no such Connection exists."""
    # Imported here for the same reason as in _variable: never at parse time.
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    if conn_id != REGISTRY_CONN_ID:
        raise errors.ConfigError(f"no reader for Airflow Connection {conn_id}")
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return None
    return registry_from_connection(conn.host, conn.port)


def registry_addr() -> str:
    """The registry's HOST:PORT, or a registry group's comma-separated list.

    In order: the Airflow Connection ``binlake_registry`` (its host the list,
    see ``registry_from_connection``), the Variable ``binlake_registry``, env
    ``BINLAKE_REGISTRY`` (or ``BINLAKE_CLIENT_REGISTRY``), 127.0.0.1:8230.
    """
    return load(config.ClusterSettings).registry or DEFAULT_REGISTRY_ADDR


def s3_from_connection(login: str | None, password: str | None, extra: dict[str, Any]) -> dict[str, str]:
    """The ``[lake.s3]`` settings an ``aws`` Connection gives (its login/password the keys,
    extra ``endpoint_url``/``region_name`` as the amazon provider's ``aws`` type has them)."""
    out: dict[str, str] = {}
    if (login or "").strip():
        if not (password or "").strip():
            raise errors.ConfigError(f"Airflow Connection {LAKE_S3_CONN_ID} has a login (access key id) but no "
                                     "password (secret key)")
        out["access_key_id"] = str(login).strip()
        out["secret_access_key"] = str(password).strip()
    endpoint = extra.get("endpoint_url") or extra.get("host")
    if endpoint:
        if not re.match(r"^https?://", str(endpoint)):
            raise errors.ConfigError(f"Airflow Connection {LAKE_S3_CONN_ID}: extra endpoint_url {endpoint!r} is not "
                                     "an http:// or https:// URL")
        out["endpoint_url"] = str(endpoint)
    region = extra.get("region_name")
    if region:
        out["region"] = str(region)
    if extra.get("aws_session_token"):
        out["session_token"] = str(extra["aws_session_token"])
    return out


def _lake_s3_connection() -> dict[str, str]:
    """The ``binlake_lake_s3`` Connection's settings; empty when no such Connection exists.
    Read through the Task SDK (the amazon provider is not needed); never logged."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(LAKE_S3_CONN_ID)
    except AirflowNotFoundException:
        return {}
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    return s3_from_connection(conn.login, conn.password, extra)


def use_lake_s3_connection() -> None:
    """From now on in this task process, an S3 lake's endpoint, region and keys come
    first from the ``binlake_lake_s3`` Connection, when there is one (above AWS_* and
    BINLAKE_LAKE_S3_*), wherever binlake reads them (its in-process Spark, delta-rs, the
    environment it builds for a child)."""
    config.use_source(config.S3Settings, AirflowSource)


def lake_dir() -> str:
    """The lake's root (Variable ``binlake_lake``, env ``BINLAKE_LAKE_DIR``), absolute.

    URIs (``s3://...``, ``file:/...``) are returned unchanged for Spark to resolve; for an
    ``s3://`` lake the ``binlake_lake_s3`` Connection, when there is one, supplies the
    endpoint and keys (``use_lake_s3_connection``).
    """
    lake = load(config.LakeSettings).dir or DEFAULT_LAKE_DIR
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", lake):
        if lake.lower().startswith(("s3://", "s3a://")):
            use_lake_s3_connection()
        return lake
    path = Path(lake).expanduser()
    return str(path if path.is_absolute() else PROJECT_ROOT / path)


def ingest_mode() -> str:
    """How a window's Spark job runs (Variable ``binlake_ingest_mode``, env ``BINLAKE_INGEST_MODE``):

    ``connect``       inside the task, as a client of the always-on Spark Connect
                      server at ``spark_remote()`` (the default when one is set:
                      ``binlake up`` and docker-compose set it);
    ``spark-submit``  a Spark application per window through the ``spark_default``
                      connection (the default without a Connect server; a cluster
                      without Connect);
    ``inprocess``     a ``local[*]`` Spark inside the task's own interpreter.
    """
    mode = load(config.IngestSettings).mode
    if mode is not None:
        return mode
    return CONNECT if spark_remote() is not None else SPARK_SUBMIT


def spark_remote() -> str | None:
    """The always-on Spark Connect server, ``sc://HOST:PORT`` (Variable
    ``binlake_spark_remote``, env ``BINLAKE_SPARK_REMOTE``); None when there is none."""
    return load(config.SparkSettings).remote


def spark_master() -> str | None:
    """The Spark master of the DAGs' jobs (Variable ``binlake_spark_master``, env
    ``BINLAKE_SPARK_MASTER``): in-process sessions, and spark-submit ingests, where it
    wins over the ``spark_default`` connection (``spark://HOST:PORT`` for a standalone
    cluster). None: in-process sessions run ``local[*]``, spark-submit the connection's."""
    return load(config.SparkSettings).master


def spark_python() -> str:
    """The Python the Spark driver and executors run (Variable ``binlake_spark_python``,
    env ``BINLAKE_SPARK_PYTHON``); by default the worker's own interpreter, the
    one binlake is installed in. spark-submit would otherwise pick whatever
    ``python3`` is first on PATH."""
    return load(config.SparkSettings).python or sys.executable


def poll_interval_s() -> float:
    """Seconds between safe-ts polls of the wait step (Variable ``binlake_safe_ts_poll_s``,
    env ``BINLAKE_SAFE_TS_POLL_S``)."""
    return load(config.IngestSettings).safe_ts_poll_s


def restore_parallelism() -> int:
    """Tables a restore, snapshot or history run writes at once (Variable
    ``binlake_restore_parallelism``, env ``BINLAKE_RESTORE_PARALLELISM``, default 4)."""
    return load(config.RestoreSettings).parallelism


def ingest_batch_windows() -> int:
    """At most this many consecutive due windows in one ingest run's Spark job
    (Variable ``binlake_ingest_batch_windows``, env ``BINLAKE_INGEST_BATCH_WINDOWS``,
    default 1: each window in its own run. Measured (bench/RESULTS.md): with runs
    at once, their writes already follow each other back to back, and a batch of
    12 made a 4-at-once backfill slower, not faster)."""
    return load(config.IngestSettings).batch_windows


def ingest_batch_max_rows() -> int:
    """Windows join a batch while their row changes together stay at or under this
    (Variable ``binlake_ingest_batch_max_rows``, env ``BINLAKE_INGEST_BATCH_MAX_ROWS``,
    default 100000): a bigger window is worth a run of its own."""
    return load(config.IngestSettings).batch_max_rows


def apply_tasks() -> str | None:
    """The apply DAG's task files as set (Variable ``binlake_apply_tasks``, env
    ``BINLAKE_APPLY_TASKS``); None when unset."""
    return load(config.ApplySettings).tasks


def maintenance() -> config.MaintenanceSettings:
    """The maintenance DAG's settings (Variables ``binlake_vacuum_retention_hours`` and
    ``binlake_gc_margin_hours``, env ``BINLAKE_VACUUM_RETENTION_HOURS`` and ``BINLAKE_GC_MARGIN_HOURS``)."""
    return load(config.MaintenanceSettings)


# --------------------------------------------------------------------------- parse time


def dag_setting(name: str, text: str | None) -> Any:
    """Field ``name`` of the ingest DAG's settings: ``text`` when given (empty: the
    default), else the environment's."""
    if text is None:
        return getattr(config.load(config.IngestDagSettings), name)
    if not text.strip():
        return config.IngestDagSettings.model_fields[name].default
    overrides: dict[str, Any] = {name: text}
    return getattr(config.load(config.IngestDagSettings, **overrides), name)


def ingest_job() -> Path:
    """The spark-submit entry point of the ingest (a path only: nothing is read here):
    ``BINLAKE_INGEST_JOB`` where binlake is deployed without this checkout's jobs/,
    else the checkout's."""
    job: Path | None = dag_setting("job", None)
    return job if job is not None else PROJECT_ROOT / "jobs" / "ingest.py"


def ingest_timetable(text: str | None = None) -> Any:
    """The ingest DAG's timetable from ``BINLAKE_INGEST_SCHEDULE`` (default ``5m``).

    A duration (``30s``, ``5m``, ``1h``) gives contiguous intervals of that
    length aligned to the start date; a cron expression (``*/5 * * * *``) or
    preset (``@hourly``) gives contiguous intervals between its fire times, in
    UTC. Either way every data interval is a real window ``[start, end)``: a
    plain cron string would give Airflow 3's default CronTriggerTimetable,
    whose runs have empty intervals, i.e. nothing to ingest.
    """
    from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable

    spec: str = dag_setting("schedule", text)
    seconds = config.duration_seconds(spec)
    if seconds is not None:
        return DeltaDataIntervalTimetable(dt.timedelta(seconds=seconds))
    timetable = CronDataIntervalTimetable(spec, timezone="UTC")
    try:
        timetable.validate()
    except Exception as exc:  # croniter's own error types vary between versions
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise errors.ConfigError(
            f"{SCHEDULE_ENV}={spec!r} is neither a duration (30s, 5m, 1h) nor a cron expression: {first}"
        ) from None
    return timetable


def ingest_start_date(text: str | None = None) -> dt.datetime:
    """The ingest DAG's start date: ``BINLAKE_INGEST_START_DATE`` (ISO-8601, UTC unless
    an offset is given) or the fixed default."""
    moment: dt.datetime | None = dag_setting("start_date", text)
    return moment if moment is not None else DEFAULT_START_DATE


def ingest_max_active_runs(text: str | None = None) -> int:
    """How many ingest runs (windows) may run at once, catching up or backfilling:
    ``BINLAKE_INGEST_MAX_ACTIVE_RUNS`` (default 4). Windows are independent and
    each replaces only itself, so any number is safe; against the always-on Spark
    a run costs its work, so more runs at once shorten a backfill until Spark's
    cores are busy. ``airflow backfill create --max-active-runs`` overrides it per backfill.

    On S3 too, in every ingest mode: the runs' Delta writes take turns through the
    lake's writer lease (``binlake.lake.store.writelock``), whichever driver makes them."""
    value: int = dag_setting("max_active_runs", text)
    return value
