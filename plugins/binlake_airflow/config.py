"""Where binlake's Airflow tasks find the registry, the lake and Spark.

Run-time settings are resolved when a task runs, never when a DAG file is
parsed: the DAG processor parses every file every few seconds, and a
Variable or Connection read there is a metadata-database (or secrets-backend)
round trip per parse. The registry's address is first looked up as the Airflow
Connection ``binlake_registry`` (see ``registry_addr``): a registry group is an
endpoint like the databases the DAGs reach, and an Airflow user keeps those
as Connections. Then each run-time setting, the registry's included, is
looked up in this order:

1. the Airflow Variable (``binlake_registry``, ``binlake_lake``, ...), which
   also covers ``AIRFLOW_VAR_BINLAKE_*`` environment variables and any
   secrets backend, so an operator can change it in the UI;
2. the ``BINLAKE_*`` environment variable of the worker (``binlake up`` and
   ``docker-compose.yaml`` set these for their whole stack);
3. the default for one machine.

Relative lake paths are resolved against the project root (the directory
holding ``dags/`` and ``plugins/``), not the working directory: Airflow
starts task processes from wherever the scheduler or worker was started.

Two settings are read at parse time, because they shape the DAG itself
rather than one run: the ingest schedule and its start date. They come from
the environment only (``BINLAKE_INGEST_SCHEDULE``,
``BINLAKE_INGEST_START_DATE``); reading the environment is free, whereas an
Airflow Variable there would cost a database query on every parse. Changing
them means restarting the DAG processor with the new environment.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from binlake.net import DEFAULT_REGISTRY_ADDR, parse_addr_list

# plugins/binlake_airflow/config.py -> parents[2] is the project root.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The spark-submit entry point of the ingest (a path only: nothing is read here):
# $BINLAKE_INGEST_JOB where binlake is deployed without this checkout's jobs/,
# else the checkout's (the environment is free to read at parse time).
INGEST_JOB = Path(os.environ.get("BINLAKE_INGEST_JOB", "").strip() or PROJECT_ROOT / "jobs" / "ingest.py")

DEFAULT_LAKE_DIR = "data/lake"
DEFAULT_SCHEDULE = "5m"
# A fixed start date, as Airflow requires for stable serialized DAGs. Catchup
# starts here unless BINLAKE_INGEST_START_DATE moves it (``binlake up`` sets it
# to the day the stack first came up, so a new stack does not replay months
# of empty windows).
DEFAULT_START_DATE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
# How often the wait step asks the registry for the Pumps' safe ts. Pumps
# report every ~2 s and idle Pumps move their safe ts every ~3 s, so polling
# much faster than this buys nothing.
DEFAULT_POLL_INTERVAL_S = 5.0

SPARK_SUBMIT = "spark-submit"
INPROCESS = "inprocess"
CONNECT = "connect"
INGEST_MODES = (CONNECT, SPARK_SUBMIT, INPROCESS)

SCHEDULE_ENV = "BINLAKE_INGEST_SCHEDULE"
MAX_ACTIVE_RUNS_ENV = "BINLAKE_INGEST_MAX_ACTIVE_RUNS"
DEFAULT_MAX_ACTIVE_RUNS = 4
# The Connection holding the registry group: conn type ``generic``, host the
# comma-separated members, port the port of members that name none.
REGISTRY_CONN_ID = "binlake_registry"
# The Connection of an S3 lake: conn type ``aws``, login the access key id,
# password the secret key, extra ``endpoint_url`` and ``region_name``.
LAKE_S3_CONN_ID = "binlake_lake_s3"
START_DATE_ENV = "BINLAKE_INGEST_START_DATE"


class ConfigError(ValueError):
    """A binlake setting has a value binlake cannot use; the message names the setting."""


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


def setting(variable: str, env: Sequence[str], default: str | None) -> str | None:
    """The first of: Airflow Variable ``variable``, env vars ``env`` in order, ``default``."""
    value = _variable(variable)
    if value is not None:
        return value
    for name in env:
        text = os.environ.get(name, "").strip()
        if text:
            return text
    return default


def registry_from_connection(host: str | None, port: int | None) -> str:
    """The registry list a ``binlake_registry`` Connection's ``host`` and ``port`` give.

    ``host`` is one member or a comma-separated group (``h1:8230,h2:8230``);
    a member without a port takes the Connection's ``port`` (so
    ``generic://h1,h2,h3:8230`` as a URI is the group ``h1:8230,h2:8230,h3:8230``).
    Raises ConfigError naming the Connection when the list is malformed.
    """
    from binlake import errors

    where = f"Airflow Connection {REGISTRY_CONN_ID}"
    text = (host or "").strip()
    if not text:
        raise ConfigError(f"{where} has no host: set it to the registry group, e.g. h1:8230,h2:8230,h3:8230")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise ConfigError(f"{where}: port {port!r} is not a TCP port (1-65535)")
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
        raise ConfigError(
            f"{where}: {exc}; its host must list the registry group as HOST:PORT[,HOST:PORT...] "
            "(or HOST[,HOST...] with the port in the Connection's port field)"
        ) from None
    return addr


def _registry_connection() -> str | None:
    """The registry list of the ``binlake_registry`` Connection; None when no such Connection exists."""
    # Imported here for the same reason as in _variable: never at parse time.
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(REGISTRY_CONN_ID)
    except AirflowNotFoundException:
        return None
    return registry_from_connection(conn.host, conn.port)


def registry_addr() -> str:
    """The registry's HOST:PORT, or a registry group's comma-separated list.

    In order: the Airflow Connection ``binlake_registry`` (its host the list,
    see ``registry_from_connection``), the Variable ``binlake_registry``, env
    ``BINLAKE_REGISTRY`` (or ``BINLAKE_CLIENT_REGISTRY``), 127.0.0.1:8230.
    """
    from binlake import errors

    from_connection = _registry_connection()
    if from_connection is not None:
        return from_connection
    # BINLAKE_CLIENT_REGISTRY is what docker-compose.yaml gives every client.
    addr = setting("binlake_registry", ("BINLAKE_REGISTRY", "BINLAKE_CLIENT_REGISTRY"), DEFAULT_REGISTRY_ADDR)
    assert addr is not None
    try:
        parse_addr_list(addr, "registry address")
    except errors.InvalidArgument as exc:
        raise ConfigError(f"{exc} (from Variable binlake_registry or env BINLAKE_REGISTRY)") from None
    return addr


def s3_from_connection(login: str | None, password: str | None, extra: dict[str, Any]) -> dict[str, str]:
    """The AWS_* variables an ``aws`` Connection gives (its login/password the keys,
    extra ``endpoint_url``/``region_name`` as the amazon provider's ``aws`` type has them)."""
    out: dict[str, str] = {}
    if (login or "").strip():
        if not (password or "").strip():
            raise ConfigError(f"Airflow Connection {LAKE_S3_CONN_ID} has a login (access key id) but no password "
                              "(secret key)")
        out["AWS_ACCESS_KEY_ID"] = str(login).strip()
        out["AWS_SECRET_ACCESS_KEY"] = str(password).strip()
    endpoint = extra.get("endpoint_url") or extra.get("host")
    if endpoint:
        if not re.match(r"^https?://", str(endpoint)):
            raise ConfigError(f"Airflow Connection {LAKE_S3_CONN_ID}: extra endpoint_url {endpoint!r} is not an "
                              "http:// or https:// URL")
        out["AWS_ENDPOINT_URL"] = str(endpoint)
    region = extra.get("region_name")
    if region:
        out["AWS_REGION"] = str(region)
    if extra.get("aws_session_token"):
        out["AWS_SESSION_TOKEN"] = str(extra["aws_session_token"])
    return out


def use_lake_s3_connection() -> bool:
    """Put the ``binlake_lake_s3`` Connection's endpoint, region and keys in this task
    process's environment (where binlake, its in-process Spark and a spark-submit child
    read them); False when no such Connection exists. Read at run time only, through
    the Task SDK (the amazon provider is not needed); never logged."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(LAKE_S3_CONN_ID)
    except AirflowNotFoundException:
        return False
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    os.environ.update(s3_from_connection(conn.login, conn.password, extra))
    return True


def lake_dir() -> str:
    """The lake's root (Variable ``binlake_lake``, env ``BINLAKE_LAKE_DIR``), absolute.

    URIs (``s3://...``, ``file:/...``) are returned unchanged for Spark to resolve; for an
    ``s3://`` lake the ``binlake_lake_s3`` Connection, when there is one, supplies the
    endpoint and keys (``use_lake_s3_connection``).
    """
    lake = setting("binlake_lake", ("BINLAKE_LAKE_DIR",), DEFAULT_LAKE_DIR)
    assert lake is not None
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
    default = CONNECT if spark_remote() is not None else SPARK_SUBMIT
    mode = (setting("binlake_ingest_mode", ("BINLAKE_INGEST_MODE",), default) or default).lower()
    if mode not in INGEST_MODES:
        raise ConfigError(
            f"binlake_ingest_mode must be one of {', '.join(INGEST_MODES)}, got {mode!r} "
            "(from Variable binlake_ingest_mode or env BINLAKE_INGEST_MODE)"
        )
    return mode


def spark_remote() -> str | None:
    """The always-on Spark Connect server, ``sc://HOST:PORT`` (Variable
    ``binlake_spark_remote``, env ``BINLAKE_SPARK_REMOTE``); None when there is none."""
    from binlake.lake.sparkenv.connect import check_remote

    return _checked_setting("binlake_spark_remote", "BINLAKE_SPARK_REMOTE", check_remote)


def spark_master() -> str | None:
    """The Spark master of the DAGs' jobs (Variable ``binlake_spark_master``, env
    ``BINLAKE_SPARK_MASTER``): in-process sessions, and spark-submit ingests, where it
    wins over the ``spark_default`` connection (``spark://HOST:PORT`` for a standalone
    cluster). None: in-process sessions run ``local[*]``, spark-submit the connection's."""
    from binlake.lake.sparkenv.session import check_master

    return _checked_setting("binlake_spark_master", "BINLAKE_SPARK_MASTER", check_master)


def _checked_setting(variable: str, env: str, check: Callable[[str, str], str]) -> str | None:
    """Variable ``variable`` or env ``env`` as ``check(value, variable)`` accepts it;
    None when neither is set, ``ConfigError`` naming both when the value is refused."""
    from binlake import errors

    value = setting(variable, (env,), None)
    if value is None:
        return None
    try:
        return check(value, variable)
    except errors.InvalidArgument as exc:
        raise ConfigError(f"{exc} (from Variable {variable} or env {env})") from None


def spark_python() -> str:
    """The Python the Spark driver and executors run (Variable ``binlake_spark_python``,
    env ``BINLAKE_SPARK_PYTHON``); by default the worker's own interpreter, the
    one binlake is installed in. spark-submit would otherwise pick whatever
    ``python3`` is first on PATH."""
    return setting("binlake_spark_python", ("BINLAKE_SPARK_PYTHON",), None) or sys.executable


def poll_interval_s() -> float:
    """Seconds between safe-ts polls of the wait step (env ``BINLAKE_SAFE_TS_POLL_S``)."""
    text = setting("binlake_safe_ts_poll_s", ("BINLAKE_SAFE_TS_POLL_S",), None)
    if text is None:
        return DEFAULT_POLL_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ConfigError(f"binlake_safe_ts_poll_s must be a number of seconds in (0, 3600], got {text!r}")
    return value


def restore_parallelism() -> int:
    """Tables a restore, snapshot or history run writes at once (Variable
    ``binlake_restore_parallelism``, env ``BINLAKE_RESTORE_PARALLELISM``, default 4)."""
    text = setting("binlake_restore_parallelism", ("BINLAKE_RESTORE_PARALLELISM",), None)
    if text is None:
        return 4
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 64:
        raise ConfigError(f"binlake_restore_parallelism must be an integer from 1 to 64, got {text!r}")
    return value


def _int_setting(variable: str, env: str, default: int, lo: int, hi: int, what: str) -> int:
    text = setting(variable, (env,), None)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise ConfigError(f"{variable} must be {what} from {lo} to {hi}, got {text!r}")
    return value


def ingest_batch_windows() -> int:
    """At most this many consecutive due windows in one ingest run's Spark job
    (Variable ``binlake_ingest_batch_windows``, env ``BINLAKE_INGEST_BATCH_WINDOWS``,
    default 1: each window in its own run. Measured (bench/RESULTS.md): with runs
    at once, their writes already follow each other back to back, and a batch of
    12 made a 4-at-once backfill slower, not faster)."""
    return _int_setting("binlake_ingest_batch_windows", "BINLAKE_INGEST_BATCH_WINDOWS", 1, 1, 288,
                        "a whole number of windows")


def ingest_batch_max_rows() -> int:
    """Windows join a batch while their row changes together stay at or under this
    (Variable ``binlake_ingest_batch_max_rows``, env ``BINLAKE_INGEST_BATCH_MAX_ROWS``,
    default 100000): a bigger window is worth a run of its own."""
    return _int_setting("binlake_ingest_batch_max_rows", "BINLAKE_INGEST_BATCH_MAX_ROWS", 100_000, 0, 10**9,
                        "a whole number of row changes")


# --------------------------------------------------------------------------- parse time

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float | None:
    """The seconds of a duration in the settings' one spelling (``30s``, ``5 min``,
    ``1.5h``, ``1d``), or None when ``text`` is not one."""
    match = _DURATION.match(text)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()] if match else None


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

    raw = text if text is not None else os.environ.get(SCHEDULE_ENV, "")
    spec = raw.strip() or DEFAULT_SCHEDULE
    seconds = duration_seconds(spec)
    if seconds is not None:
        if seconds < 1:
            raise ConfigError(f"{SCHEDULE_ENV}={spec!r}: an ingest interval must be at least 1s")
        return DeltaDataIntervalTimetable(dt.timedelta(seconds=seconds))
    timetable = CronDataIntervalTimetable(spec, timezone="UTC")
    try:
        timetable.validate()
    except Exception as exc:  # croniter's own error types vary between versions
        raise ConfigError(
            f"{SCHEDULE_ENV}={spec!r} is neither a duration (30s, 5m, 1h) nor a cron expression: {exc}"
        ) from None
    return timetable


def ingest_start_date(text: str | None = None) -> dt.datetime:
    """The ingest DAG's start date: ``BINLAKE_INGEST_START_DATE`` (ISO-8601, UTC unless
    an offset is given) or the fixed default."""
    raw = (text if text is not None else os.environ.get(START_DATE_ENV, "")).strip()
    if not raw:
        return DEFAULT_START_DATE
    try:
        moment = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise ConfigError(
            f"{START_DATE_ENV}={raw!r} is not an ISO-8601 datetime such as 2026-11-21T08:00:00"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def ingest_max_active_runs(text: str | None = None) -> int:
    """How many ingest runs (windows) may run at once, catching up or backfilling:
    ``BINLAKE_INGEST_MAX_ACTIVE_RUNS`` (default 4). Windows are independent and
    each replaces only itself, so any number is safe; against the always-on Spark
    a run costs its work, so more runs at once shorten a backfill until Spark's
    cores are busy. ``airflow backfill create --max-active-runs`` overrides it per backfill.

    On S3 too, in every ingest mode: the runs' Delta writes take turns through the
    lake's writer lease (``binlake.lake.store.writelock``), whichever driver makes them."""
    raw = (text if text is not None else os.environ.get(MAX_ACTIVE_RUNS_ENV, "")).strip()
    if not raw:
        return DEFAULT_MAX_ACTIVE_RUNS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        raise ConfigError(f"{MAX_ACTIVE_RUNS_ENV}={raw!r}: give a whole number of runs in 1..256")
    return value
