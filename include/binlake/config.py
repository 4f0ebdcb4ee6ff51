"""Configuration: defaults < TOML file < ``BINLAKE_*`` environment < command-line flags.

Every setting of binlake is a field of one of the section classes below, listed in
``SECTIONS`` (the configuration reference is rendered from them, so each field says
what it is for); ``config/binlake.toml`` documents every key. A TOML file has one
table per section (``[registry]``, ``[pump]``, ``[client]``, ``[security]``,
``[paths]``, ``[spark]``, ``[restore]``, ``[lake]``, ``[lake.s3]``, ...); unknown keys
and bad values are reported on one line with the key's name and its variable.

Each field is also read from the environment, as ``BINLAKE_<SECTION>_<KEY>`` or the
variable its ``validation_alias`` names, and, in the Airflow plugin, from the Airflow
Variable its ``airflow_variable`` names (``binlake_airflow.config``'s settings source).
Nothing in binlake reads a ``BINLAKE_*`` variable but this module: a command's child
processes get the settings it chose through ``child_env``, never through writes into
this process's environment.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import AliasChoices, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from binlake import errors
from binlake.net import DEFAULT_REGISTRY_ADDR, TLSFiles, parse_addr, parse_addr_list

GiB = 1 << 30
MiB = 1 << 20

# gRPC's hard ceiling for one message is 2 GiB - 1; keep room for the envelope.
MAX_BINLOG_BYTES_CEILING = 2 * GiB - 2 * MiB


def _check_addr(value: str | None, what: str) -> str | None:
    if value is None:
        return value
    try:
        parse_addr(value, what)
    except errors.InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    return value


def _check_addr_list(value: str | None, what: str) -> str | None:
    if value is None:
        return value
    try:
        parse_addr_list(value, what)
    except errors.InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    return value


def _non_empty(value: Any, what: str) -> Any:
    # An empty string would silently mean "." (a path) or "unset" (an id): refuse it.
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"is empty; give {what}")
    return value


def _variable(name: str, connection: str | None = None) -> dict[str, Any]:
    """The ``json_schema_extra`` of a field the Airflow plugin also reads from the
    Variable ``name`` (and, before it, from the Connection ``connection``)."""
    extra: dict[str, Any] = {"airflow_variable": name}
    if connection is not None:
        extra["airflow_connection"] = connection
    return extra


def airflow_variable(field: FieldInfo) -> str | None:
    """The Airflow Variable that sets ``field`` in the DAGs' tasks; None for none."""
    extra = field.json_schema_extra
    value = extra.get("airflow_variable") if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


def airflow_connection(field: FieldInfo) -> str | None:
    """The Airflow Connection that sets ``field`` in the DAGs' tasks, above its Variable; None for none."""
    extra = field.json_schema_extra
    value = extra.get("airflow_connection") if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


def env_names(cls: type[BaseSettings], name: str) -> tuple[str, ...]:
    """The environment variables that set field ``name`` of ``cls``, first one first."""
    field = cls.model_fields[name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    if isinstance(alias, str):
        return (alias,)
    return (f"{cls.model_config.get('env_prefix', '')}{name}".upper(),)


# The one spelling of a duration in settings: 30s, 5 min, 1.5h, 1d.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> float | None:
    """The seconds of a duration in the settings' one spelling (``30s``, ``5 min``,
    ``1.5h``, ``1d``), or None when ``text`` is not one."""
    match = _DURATION.match(text)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()] if match else None


class RegistrySettings(BaseSettings):
    """The registry (TSO and node states)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_REGISTRY_", extra="forbid")

    addr: str = Field(DEFAULT_REGISTRY_ADDR, description="HOST:PORT the registry listens on (port 0 = any free port).")
    data_dir: pathlib.Path = Field(pathlib.Path("data/registry"), description="Directory of the SQLite store.")
    tso_window_ms: int = Field(3000, ge=1, le=600_000, description="TSO high-water mark step persisted ahead of use.")
    store: str = Field(
        "", description="Store URL instead of data_dir: sqlite:///file.db, or etcd://h1:2379,h2:2379,h3:2379[/prefix] "
        "for a group of registries on several hosts (one leads; the others stand by).")
    cluster_id: int = Field(0, ge=0, description="When > 0, refuse a store that holds another cluster id.")
    replicas: int | None = Field(None, ge=1, le=16, description="The cluster's replication R from its first TSO on, "
                                 "recorded when the registry creates its store (on a store that has served, it must "
                                 "equal the setting in force; change that with `binlake ctl replication`).")
    min_acks: int | None = Field(None, ge=1, le=16, description="W with `replicas` (default R).")

    @field_validator("addr")
    @classmethod
    def _addr(cls, v: str) -> str:
        return _check_addr(v, "registry addr") or v

    @field_validator("min_acks")
    @classmethod
    def _min_acks(cls, v: int | None, info: ValidationInfo) -> int | None:
        # A field validator (replicas is validated first), so the error names min_acks.
        replicas = info.data.get("replicas")
        if v is not None and replicas is None:
            raise ValueError("min_acks needs replicas (give both, e.g. --replicas 3 --min-acks 2)")
        if v is not None and replicas is not None and v > replicas:
            raise ValueError(f"min_acks={v} is above replicas={replicas}: a write cannot be acknowledged by more "
                             "Pumps than it is written to; lower min_acks or raise replicas")
        return v

    @field_validator("data_dir", mode="before")
    @classmethod
    def _dir(cls, v: Any) -> Any:
        return _non_empty(v, "a directory")


class PumpSettings(BaseSettings):
    """A Pump: durable binlog storage, sorter and reader."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_PUMP_", extra="forbid")

    registry: str = Field(DEFAULT_REGISTRY_ADDR, description="Registry HOST:PORT, or the group's HOST:PORT,HOST:PORT,...")
    addr: str = Field("127.0.0.1:8250", description="HOST:PORT the Pump listens on (port 0 = any free port).")
    advertise_addr: str | None = Field(None, description="Address clients use, if not addr (e.g. behind NAT).")
    data_dir: pathlib.Path = Field(pathlib.Path("data/pump"), description="Value log segments and the index.")
    node_id: str | None = Field(None, description="Node id; default: remembered from the data dir, else host:port.")
    metrics_addr: str | None = Field(None, description="HOST:PORT for Prometheus /metrics; unset = no endpoint.")
    fake_binlog_interval_s: float = Field(3.0, gt=0, le=3600, description="Idle Pumps write a fake binlog this often.")
    txn_timeout_s: float = Field(600.0, gt=0, le=86400 * 7, description="Ask the upstream about a prewrite after this.")
    heartbeat_interval_s: float = Field(2.0, gt=0, le=600, description="Status report to the registry.")
    gc_retention_days: float = Field(
        7.0, ge=0, le=3650,
        description="Keep binlogs this long (days); GC never passes a registered consumer's checkpoint.")
    # Both off (0) by default: only an operator's explicit choice may remove binlogs
    # a consumer (the lake's ingest) has not read.
    gc_hard_limit_days: float = Field(
        0.0, ge=0, le=3650,
        description="Collect past consumer checkpoints older than this many days (0 = never; loud when it does).")
    gc_hard_limit_bytes: int = Field(
        0, ge=0, description="Collect past consumer checkpoints when storage exceeds this (0 = never).")
    gc_interval_s: float = Field(600.0, gt=0, description="How often GC runs.")
    max_binlog_bytes: int = Field(GiB, ge=1024, le=MAX_BINLOG_BYTES_CEILING, description="Largest binlog accepted.")
    segment_bytes: int = Field(512 * MiB, ge=4096, le=64 * GiB, description="Value log segment size.")
    stop_write_at_free_bytes: int = Field(GiB, ge=0, description="Refuse new writes below this much free disk.")
    fsync: bool = Field(True, description="fsync before acknowledging (turn off only for throwaway tests).")
    max_group_bytes: int = Field(16 * MiB, ge=4096, description="Most bytes appended under one fsync.")
    sync_commits: bool = Field(
        False, description="fsync commits and rollbacks before acknowledging them too (prewrites always are); "
        "off: they are fsynced with the next group or within 5 ms, and one lost with the host is resolved "
        "through the writer's status service.")
    read_batch_txns: int = Field(256, ge=1, le=100_000, description="Transactions per PullBinlogs message.")
    read_batch_bytes: int = Field(4 * MiB, ge=1024, description="Bytes per PullBinlogs message (soft).")
    grpc_workers: int = Field(32, ge=2, le=1024, description="Server threads.")

    @field_validator("addr", "advertise_addr", "metrics_addr")
    @classmethod
    def _addr(cls, v: str | None, info: Any) -> str | None:
        return _check_addr(v, f"pump {info.field_name}")

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str) -> str:
        return _check_addr_list(v, "pump registry") or v

    @field_validator("data_dir", "node_id", mode="before")
    @classmethod
    def _not_empty(cls, v: Any, info: Any) -> Any:
        return _non_empty(v, "a directory" if info.field_name == "data_dir" else "an id (or leave it unset)")

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, v: str | None) -> str | None:
        # The registry's rules, checked before the id is remembered in the data dir.
        if v is not None and (len(v) > 128 or not v.isprintable() or any(c.isspace() for c in v)):
            raise ValueError(f"{v[:40]!r} must be at most 128 printable characters without whitespace")
        return v


class ClientSettings(BaseSettings):
    """The PumpClient inside upstream writers."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_CLIENT_", extra="forbid")

    registry: str = Field(DEFAULT_REGISTRY_ADDR, description="Registry HOST:PORT, or the group's HOST:PORT,HOST:PORT,...")
    strategy: Literal["range", "hash", "score"] = Field("range", description="How prewrites pick a Pump.")
    write_timeout_s: float = Field(10.0, gt=0, le=3600, description="Deadline of one write RPC.")
    max_failures: int = Field(3, ge=1, le=1000, description="Consecutive failures before a Pump is unavailable.")
    probe_interval_s: float = Field(1.0, gt=0, le=600, description="Probe unavailable online Pumps this often.")
    refresh_interval_s: float = Field(1.0, gt=0, le=600, description="Re-read the Pump list from the registry.")
    commit_retry_s: float = Field(30.0, gt=0, le=86400, description="Keep retrying a commit on its Pump this long.")
    max_batch_binlogs: int = Field(512, ge=1, le=100_000, description="Binlogs coalesced into one write RPC.")
    max_batch_bytes: int = Field(8 * MiB, ge=1024, description="Bytes coalesced into one write RPC (soft).")
    max_binlog_bytes: int = Field(GiB, ge=1024, le=MAX_BINLOG_BYTES_CEILING, description="Largest binlog sent.")
    max_inflight_batches: int = Field(1, ge=1, le=1024, description="Write batches on the wire per Pump at once.")
    replicas: int = Field(1, ge=1, le=16, description="Pumps each prewrite is written to (R; a cluster setting).")
    min_acks: int | None = Field(None, ge=1, le=16, description="Pumps that must fsync before a write is "
                                 "acknowledged (W; default R). Readers skip up to W - 1 unreachable Pumps.")
    txn_lookback_s: float = Field(600.0, gt=0, le=7 * 86400, description="The longest a transaction runs from "
                                  "start_ts to commit_ts. A window is read with the lowest W in force from this long "
                                  "before its start (a change of R/W reaches reads this long after it applies).")

    @field_validator("registry")
    @classmethod
    def _addr(cls, v: str) -> str:
        return _check_addr_list(v, "client registry") or v

    @model_validator(mode="after")
    def _acks(self) -> ClientSettings:
        if self.min_acks is not None and self.min_acks > self.replicas:
            raise ValueError(f"min_acks={self.min_acks} is above replicas={self.replicas}: a write cannot be "
                             "acknowledged by more Pumps than it is written to; lower min_acks or raise replicas")
        return self

    @property
    def acks(self) -> int:
        """W: ``min_acks``, or R when unset."""
        return self.replicas if self.min_acks is None else self.min_acks


class SecuritySettings(BaseSettings):
    """TLS for every gRPC service and client (TiDB Binlog's [security]). Paths of PEM
    files only; see ``binlake.rpc`` for what each combination means."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_SECURITY_", extra="forbid")

    ca: str | None = Field(None, description="CA certificate: verify peers; servers require client certs signed by it.")
    cert: str | None = Field(None, description="This process's certificate (servers and clients present it).")
    key: str | None = Field(None, description="The certificate's private key (never logged).")

    @field_validator("ca", "cert", "key")
    @classmethod
    def _non_empty(cls, v: str | None, info: Any) -> str | None:
        if v is not None and not v.strip():
            return None  # an empty env var or flag means "not set"
        return v

    def files(self) -> TLSFiles:
        return TLSFiles(self.ca, self.cert, self.key)


class RestoreSettings(BaseSettings):
    """Restores, snapshots and history tables (``binlake restore/snapshot/history`` and
    the restore and maintenance DAGs)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_RESTORE_", extra="forbid")

    parallelism: int = Field(4, ge=1, le=64, json_schema_extra=_variable("binlake_restore_parallelism"), description=(
        "Tables written (Delta) or loaded (a target database) at once after the one pass over the lake; "
        "SQLite targets load one at a time (one writer)."))


_MEMORY = re.compile(r"^[1-9]\d*[mMgG]$")


class MemorySettings(BaseSettings):
    """Every memory bound of binlake's data work, in one place (``[memory]``).

    The rule they keep: no process's memory grows with the size of a table, a
    window, a snapshot or the lake. Spark does the data work in its executors,
    partitioned by key; what must pass through one process (a target's
    connection, the task or CLI process) streams in batches of the sizes below.
    A job that still runs out of memory names the setting to raise. ``binlake
    lake status`` prints the values in force.

    The ingest's own bounds in the task process are fixed, not settings here: its
    planning scan of a window keeps counts, the DDLs, the duplicate copies and at
    most ``window_index.SPLIT_CANDIDATES`` partition bounds per Pump, whatever the
    window's size. On a local lake every window is decoded in the task process and
    appended by delta-rs as it is decoded (``lake.store.arrowwrite``: a queue of
    batches, a row group and one file's bytes in memory) or, when it replaces rows,
    streamed to staged Parquet files (a batch per input partition in memory), whatever
    the window's size; on an S3 lake only a window (or batch of windows) of at most
    ``ingest.DECODE_HERE_ROWS`` (100,000) row changes is (about 0.4 KB of Arrow a row
    change: 40 MB, sent inside the Spark Connect plan), any larger one is read by
    Spark's executors through the ``binlake`` data source
    (``binlake ingest --decode-here-rows N`` moves that threshold for one run)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_MEMORY_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    driver: str = Field("2g", description=(
        "Heap of the Spark driver JVM binlake starts (CLI commands, in-process DAG tasks, spark-submit "
        "ingests): spark.driver.memory. In local mode it is the executors' heap too."))
    executor: str = Field("1g", description=(
        "Heap of each executor on a cluster master (spark.executor.memory); the workers of "
        "`binlake up --spark-cluster` offer [spark] worker_memory (2g) to them: keep it below that."))
    partition_rows: int = Field(200_000, ge=1_000, le=100_000_000, description=(
        "Rows of one partition of a restore's, snapshot's or history build's shared result: the most rows "
        "one task holds, and what streams through the driver at a time."))
    partition_bytes: int | None = Field(None, ge=MiB, le=4 * GiB, description=(
        "Bytes (of row images) of one such partition: wide rows make more, smaller partitions "
        "(default: the driver heap / 32, e.g. 64 MiB for 2g: the driver copies a partition a few "
        "times while it hands it over)."))
    batch_rows: int = Field(10_000, ge=100, le=1_000_000, description=(
        "Rows per batch written to a target database or an Arrow/Delta batch by a restore (a database "
        "load's memory is a few such batches, whatever the table's size)."))
    direct_rows: int = Field(50_000, ge=0, le=10_000_000, description=(
        "A table with at most this many rows at T is decoded in the CLI/task process (no Spark job: the "
        "many-tables path); larger ones are rebuilt by Spark's executors and streamed. A snapshot's proof "
        "sums a table of at most this many change rows (and rows written) there too."))
    read_budget: int = Field(200_000, ge=1_000, le=100_000_000, description=(
        "The apply's read of the lake: the most row changes held at once (consecutive small windows are "
        "read together up to this; a larger window is read and applied in pieces of at most this size, cut "
        "between transactions)."))
    diff_keys: int = Field(100, ge=0, le=1_000_000, description=(
        "Differing keys `binlake diff` lists per table and kind (the counts are always exact; fix SQL "
        "goes to its file as it is found)."))

    def partition_bytes_in_force(self) -> int:
        """``partition_bytes``, or its default from the driver heap."""
        if self.partition_bytes is not None:
            return self.partition_bytes
        amount, unit = int(self.driver[:-1]), self.driver[-1]
        return max(MiB, amount * (GiB if unit == "g" else MiB) // 32)

    @field_validator("driver", "executor")
    @classmethod
    def _heap(cls, v: str) -> str:
        if not _MEMORY.match(v):
            raise ValueError(f"{v!r} is not an amount of memory such as 512m or 2g")
        return v.lower()


def memory() -> MemorySettings:
    """The memory bounds in force (environment and the command's config file)."""
    return load(MemorySettings)


class S3Settings(BaseSettings):
    """How to reach an S3 lake: ``[lake.s3]`` in the config file, BINLAKE_LAKE_S3_* in
    the environment; the standard AWS_* variables take precedence over both."""

    # The AWS SDK's own variables come first (an empty one counts as unset), as for
    # every other tool that reaches the bucket.
    model_config = SettingsConfigDict(env_prefix="BINLAKE_LAKE_S3_", extra="forbid", validate_by_name=True,
                                      env_ignore_empty=True)

    endpoint_url: str | None = Field(None, validation_alias=AliasChoices(
        "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "BINLAKE_LAKE_S3_ENDPOINT_URL"), description=(
        "S3 endpoint, e.g. http://127.0.0.1:8333 for SeaweedFS or MinIO (default: AWS's own)."))
    region: str = Field("us-east-1", validation_alias=AliasChoices(
        "AWS_REGION", "AWS_DEFAULT_REGION", "BINLAKE_LAKE_S3_REGION"), description="Region of the bucket.")
    access_key_id: str | None = Field(None, validation_alias=AliasChoices(
        "AWS_ACCESS_KEY_ID", "BINLAKE_LAKE_S3_ACCESS_KEY_ID"), description="Access key (AWS_ACCESS_KEY_ID wins).")
    secret_access_key: str | None = Field(None, validation_alias=AliasChoices(
        "AWS_SECRET_ACCESS_KEY", "BINLAKE_LAKE_S3_SECRET_ACCESS_KEY"), repr=False,
        description="Secret key (AWS_SECRET_ACCESS_KEY wins); never logged.")
    session_token: str | None = Field(None, validation_alias=AliasChoices(
        "AWS_SESSION_TOKEN", "BINLAKE_LAKE_S3_SESSION_TOKEN"), repr=False,
        description="Session token of temporary credentials (AWS_SESSION_TOKEN wins).")
    path_style: bool = Field(True, description=(
        "Address buckets as ENDPOINT/BUCKET (what S3-compatible servers need) rather than BUCKET.ENDPOINT."))
    writer_lease_ttl_s: float = Field(60.0, ge=1, le=3600, description=(
        "Seconds a writer's lease on the lake (_binlake/writer.lease) lasts without renewal: a writer killed "
        "while holding it holds the lake's writes up for this long. The holder renews it every third of it."))

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"{v!r} is not an http:// or https:// URL")
        return v

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.startswith("http://"))


# include/binlake/config.py -> parents[2]: the checkout's root, when binlake runs from one.
CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


class PathSettings(BaseSettings):
    """Where the files that ship beside the package live: the Delta jars, the Airflow
    DAGs and plugins, the benchmarks. Each defaults to the checkout's folder; an
    installed wheel (no checkout) points them elsewhere with BINLAKE_<KEY>."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_", extra="forbid")

    jars_dir: pathlib.Path | None = Field(None, description="Delta jars for spark.jars (default <checkout>/jars/lib).")
    dags_folder: pathlib.Path | None = Field(None, description="Airflow DAGs of `binlake up` (default <checkout>/dags).")
    plugins_folder: pathlib.Path | None = Field(
        None, description="Airflow plugins of `binlake up` (default <checkout>/plugins).")
    bench_dir: pathlib.Path | None = Field(None, description="The benchmark modules (default <checkout>/bench).")

    def jars(self) -> pathlib.Path:
        return self.jars_dir or CHECKOUT / "jars" / "lib"

    def dags(self) -> pathlib.Path:
        return self.dags_folder or CHECKOUT / "dags"

    def plugins(self) -> pathlib.Path:
        return self.plugins_folder or CHECKOUT / "plugins"

    def bench(self) -> pathlib.Path:
        return self.bench_dir or CHECKOUT / "bench"


# Spark's master URL forms (a typo would otherwise surface only after a JVM start);
# binlake.lake.sparkenv.session checks a master given on a command line with it too.
MASTER_PATTERN = re.compile(r"^(local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
                            r"(spark|k8s|mesos|sc)://\S+)$")
# A Spark Connect URL, sc://HOST:PORT with optional ;-parameters (binlake.lake.sparkenv.connect
# checks the URLs it connects to with it too).
REMOTE_PATTERN = re.compile(r"^sc://[A-Za-z0-9.\-\[\]:]+:\d{1,5}(/;?[A-Za-z0-9_=;.\-]*)?$")


class SparkSettings(BaseSettings):
    """Where binlake's Spark jobs run (the CLI's lake commands, jobs/ingest.py and
    jobs/apply.py, the DAGs' in-process sessions and spark-submit ingests)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_SPARK_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    master: str | None = Field(None, json_schema_extra=_variable("binlake_spark_master"), description=(
        "Spark master: local[N], spark://HOST:PORT (a standalone cluster), yarn, k8s://URL "
        "(default local[*]; the DAGs' Variable binlake_spark_master wins, and for spark-submit "
        "ingests wins over the spark_default connection)."))
    ship_code: bool = Field(True, description=(
        "On a cluster master, ship this binlake to the executors (a zip on spark.submit.pyFiles) "
        "instead of relying on a copy installed on every worker."))
    remote: str | None = Field(None, json_schema_extra=_variable("binlake_spark_remote"), description=(
        "The always-on Spark Connect server (sc://HOST:PORT) the DAGs' jobs are clients of "
        "(`binlake up` and docker-compose.yaml set it); unset: none."))
    python: str | None = Field(None, json_schema_extra=_variable("binlake_spark_python"), description=(
        "The Python the spark-submit ingests' driver and executors run (default: the worker's own "
        "interpreter, the one binlake is installed in)."))
    worker_memory: str = Field("2g", description=(
        "Memory each worker of `binlake up --spark-cluster` offers its executors (Spark's --memory: 512m, 2g)."))

    @field_validator("master")
    @classmethod
    def _master(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if not MASTER_PATTERN.match(v.strip()):
            raise ValueError(f"{v!r} is not a Spark master URL (local[N], spark://HOST:PORT, yarn, k8s://URL)")
        return v.strip()

    @field_validator("remote")
    @classmethod
    def _remote(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if not REMOTE_PATTERN.match(v.strip()):
            raise ValueError(f"{v!r} is not a Spark Connect URL: use sc://HOST:PORT")
        return v.strip()

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("worker_memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if not re.match(r"^[1-9]\d*[mMgG]$", v):
            raise ValueError(f"{v!r} is not an amount of memory such as 512m or 2g")
        return v.lower()


class LakeSettings(BaseSettings):
    """The lake: where the ingest writes and every lake command, job and DAG reads
    (an S3 lake's endpoint and keys are ``[lake.s3]``)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_LAKE_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    dir: str | None = Field(None, json_schema_extra=_variable("binlake_lake"), description=(
        "The lake's directory or URI (s3://BUCKET/PREFIX), the default of --lake; the DAGs "
        "default to data/lake under the project root."))
    consumer_id: str | None = Field(None, description=(
        "The id the lake's ingest registers as a consumer of the Pumps (default lake:<absolute path "
        "or URI>); set it when two lakes on different hosts have the same path."))


class ClusterSettings(BaseSettings):
    """Where the commands, jobs and DAGs that read the Pumps find the registry."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_", extra="forbid", validate_by_name=True,
                                      env_ignore_empty=True, str_strip_whitespace=True)

    # BINLAKE_CLIENT_REGISTRY is what docker-compose.yaml gives every client, and
    # BINLAKE_PUMP_REGISTRY every Pump: a command run in either container finds the same registry.
    registry: str | None = Field(
        None, validation_alias=AliasChoices("BINLAKE_REGISTRY", "BINLAKE_CLIENT_REGISTRY", "BINLAKE_PUMP_REGISTRY"),
        json_schema_extra=_variable("binlake_registry", connection="binlake_registry"), description=(
            "Registry HOST:PORT, or a registry group's HOST:PORT,HOST:PORT,... (the default of "
            "--registry; unset: 127.0.0.1:8230). The DAGs read the Airflow Connection binlake_registry first."))

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str | None) -> str | None:
        return _check_addr_list(v or None, "registry")


class LogSettings(BaseSettings):
    """What the binlake command logs."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_LOG_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log verbosity of the binlake command (the default of --log-level).")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


INGEST_MODES = ("connect", "spark-submit", "inprocess")


class IngestSettings(BaseSettings):
    """How the ingest DAG's runs ingest a window (read when a task runs)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_INGEST_", extra="forbid", validate_by_name=True,
                                      env_ignore_empty=True, str_strip_whitespace=True)

    mode: Literal["connect", "spark-submit", "inprocess"] | None = Field(
        None, json_schema_extra=_variable("binlake_ingest_mode"), description=(
            "Where a window's Spark job runs: connect (a client of the always-on Spark Connect server, "
            "the default when [spark] remote is set), spark-submit (a Spark application per window "
            "through the spark_default connection, the default otherwise) or inprocess (a local[*] "
            "Spark inside the task)."))
    batch_windows: int = Field(1, ge=1, le=288, json_schema_extra=_variable("binlake_ingest_batch_windows"),
                               description="At most this many consecutive due windows in one run's Spark job "
                               "(connect mode; 1: each window in its own run).")
    batch_max_rows: int = Field(100_000, ge=0, le=10**9, json_schema_extra=_variable("binlake_ingest_batch_max_rows"),
                                description="Windows join a batch while their row changes together stay at or "
                                "under this; a bigger window gets a run of its own.")
    safe_ts_poll_s: float = Field(
        5.0, gt=0, le=3600, validation_alias=AliasChoices("BINLAKE_SAFE_TS_POLL_S"),
        json_schema_extra=_variable("binlake_safe_ts_poll_s"),
        description="Seconds between the wait step's polls of the Pumps' safe ts.")

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() not in INGEST_MODES:
            raise ValueError(f"{v!r} is not one of {', '.join(INGEST_MODES)}")
        return v.strip().lower() if isinstance(v, str) else v


# The values of a deadline that turn the alert off.
DEADLINE_OFF = ("off", "none", "0", "false", "no")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def http_url(v: str | None) -> str | None:
    """An alert webhook setting: None, or an http(s) URL."""
    if v is not None and not re.match(r"^https?://", v):
        raise ValueError(f"{v!r} is not an http(s) URL")
    return v


class IngestDagSettings(BaseSettings):
    """The ingest DAG's shape, read when its file is parsed: from the environment
    only (an Airflow Variable there would cost a database query on every parse);
    changing one means restarting the DAG processor with the new environment."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_INGEST_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    schedule: str = Field("5m", description=(
        "Window length as a duration (30s, 5m, 1h) or a cron expression or preset (*/5 * * * *, @hourly; UTC)."))
    start_date: dt.datetime | None = Field(None, description=(
        "Where catch-up starts, ISO-8601 (UTC unless an offset is given); default 2026-11-01, and "
        "`binlake up` sets the day the stack first came up."))
    max_active_runs: int = Field(4, ge=1, le=256, description=(
        "Ingest runs (windows) at once when catching up or backfilling."))
    deadline: str = Field("15m", description=(
        "Alert when a window is not ingested this long after it closed (a duration), or off."))
    deadline_webhook: str | None = Field(None, description="An http(s) URL the deadline alert POSTs a JSON line to.")
    deadline_callback: str = Field("binlake_airflow.deadline.window_late", description=(
        "Dotted path of the awaitable the deadline alert runs."))
    job: pathlib.Path | None = Field(None, description=(
        "The spark-submit entry point of the ingest (default <checkout>/jobs/ingest.py)."))

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        seconds = duration_seconds(v)
        if seconds is not None and seconds < 1:
            raise ValueError(f"{v!r}: an ingest interval must be at least 1s")
        return v or "5m"

    @field_validator("start_date", mode="before")
    @classmethod
    def _start(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = dt.datetime.fromisoformat(v)
            except ValueError:
                raise ValueError(f"{v!r} is not an ISO-8601 datetime such as 2026-11-21T08:00:00") from None
        if isinstance(v, dt.datetime) and v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return v

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str) -> str:
        if v.lower() not in DEADLINE_OFF and duration_seconds(v) is None:
            raise ValueError(f"{v!r} is not a duration such as 30s, 15m or 1h (or off)")
        return v

    @field_validator("deadline_webhook")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        return http_url(v)

    @field_validator("deadline_callback")
    @classmethod
    def _callback(cls, v: str) -> str:
        if not _DOTTED.match(v):
            raise ValueError(f"{v!r} is not a dotted path such as mypackage.alerts.ingest_late")
        return v


class ApplySettings(BaseSettings):
    """The apply DAG's replication tasks."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_APPLY_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    tasks: str | None = Field(None, json_schema_extra=_variable("binlake_apply_tasks"), description=(
        "Task files the apply DAG runs: a directory of *.toml or comma-separated files, relative to "
        "the project root (default config/tasks)."))


class DrillSettings(BaseSettings):
    """Restore drills (``binlake drill`` and the ``binlake_drill`` DAG): the objectives a
    drill is held to, and what it draws."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_DRILL_", extra="forbid", env_ignore_empty=True)

    rpo_s: float = Field(3600.0, gt=0, json_schema_extra=_variable("binlake_drill_rpo_s"), description=(
        "Recovery point objective: a drill fails when the newest ingested window ends more than this "
        "many seconds before the drill."))
    rto_s: float = Field(3600.0, gt=0, json_schema_extra=_variable("binlake_drill_rto_s"), description=(
        "Recovery time objective: a drill fails when its restore takes longer than this many seconds."))
    tables: int = Field(10, ge=1, le=1000, json_schema_extra=_variable("binlake_drill_tables"), description=(
        "Tables a drill draws when none are given."))
    report: str | None = Field(None, json_schema_extra=_variable("binlake_drill_report"), description=(
        "The HTML report the drill DAG writes after each drill (default LAKE/drills.html)."))
    scratch_dir: str | None = Field(None, json_schema_extra=_variable("binlake_drill_scratch_dir"), description=(
        "Directory of the default scratch target (a SQLite file in a fresh directory below it, removed after "
        "the drill); default the system's temporary directory. A drill restores up to its tables' size there."))
    webhook: str | None = Field(None, json_schema_extra=_variable("binlake_drill_webhook"), description=(
        "URL the drill DAG's failure callback POSTs a failed drill's one line to, as JSON whose 'text' key "
        "is what Slack and Mattermost incoming webhooks show; default none (the line is logged)."))

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        return http_url(v)


class MaintenanceSettings(BaseSettings):
    """The maintenance DAG: VACUUM and the Pumps' GC report."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_", extra="forbid", env_ignore_empty=True)

    # Restores read the tables' *current* versions, which VACUUM never removes, so any
    # retention keeps every restore the ledger promises; the floor only protects jobs
    # still reading an older version while VACUUM runs.
    vacuum_retention_hours: float = Field(
        168.0, ge=1, json_schema_extra=_variable("binlake_vacuum_retention_hours"),
        description="VACUUM keeps files older versions need for this many hours (at least 1).")
    # The default: a day before a Pump's retention (7 days) would lose the binlogs.
    gc_margin_hours: float = Field(
        24.0, ge=0, lt=24 * 3650, json_schema_extra=_variable("binlake_gc_margin_hours"),
        description="The GC report fails when the oldest window not ingested yet is this many hours "
        "from falling out of a Pump's retention.")


class NativeSettings(BaseSettings):
    """The C extensions: each on by default when built; off (false/0) forces the
    pure-Python path, e.g. to compare the two."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_NATIVE_", extra="forbid", env_ignore_empty=True)

    decode: bool = Field(True, description="Decode the lake's row images with the C extension.")
    framing: bool = Field(True, description="Read the MySQL binlog's event framing with the C extension.")
    rows: bool = Field(True, description=(
        "Decode MySQL row events, and encode the initial snapshot's rows, with the C extensions."))
    pgoutput: bool = Field(True, description=(
        "Decode PostgreSQL pgoutput messages, and the initial snapshot's COPY lines, with the C extension."))


class SourceSettings(BaseSettings):
    """The log-reading sources (`binlake mysql-source`, `binlake pg-source`) and the workload generator."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_", extra="forbid", env_ignore_empty=True,
                                      str_strip_whitespace=True)

    read_burst_ms: float = Field(5.0, ge=0, le=100, description=(
        "After a read of a trickle of events, a source sleeps this long (ms) so the next read "
        "brings more at once (0: never; read when a source starts)."))
    upstream: str | None = Field(None, description=(
        "SQLAlchemy URL of the upstream database `binlake workload` writes (the default of --upstream)."))


def paths() -> PathSettings:
    """The paths from the environment (BINLAKE_JARS_DIR, ...), else the checkout's."""
    return load(PathSettings)


S = TypeVar("S", bound=BaseSettings)

# Every section of the configuration and its table in the TOML file: the model the
# configuration reference and config/binlake.toml document.
SECTIONS: dict[type[BaseSettings], str] = {
    RegistrySettings: "registry",
    PumpSettings: "pump",
    ClientSettings: "client",
    SecuritySettings: "security",
    PathSettings: "paths",
    ClusterSettings: "cluster",
    LogSettings: "log",
    SparkSettings: "spark",
    LakeSettings: "lake",
    S3Settings: "lake.s3",
    IngestSettings: "ingest",
    IngestDagSettings: "ingest.dag",
    ApplySettings: "apply",
    DrillSettings: "drill",
    RestoreSettings: "restore",
    MemorySettings: "memory",
    MaintenanceSettings: "maintenance",
    NativeSettings: "native",
    SourceSettings: "source",
}

# A settings source of another origin (the Airflow plugin's Variables and Connections):
# a factory taking the section class.
SourceFactory = Callable[[type[BaseSettings]], PydanticBaseSettingsSource]

# What the running command chose beyond its own environment: its --config file (every
# load without a file of its own reads it), the settings sources registered for a
# section, and the variables its child processes must see (``child_env``).
_process_file: pathlib.Path | None = None
_process_sources: dict[type[BaseSettings], list[SourceFactory]] = {}
_exported: dict[str, str] = {}


def use_file(path: str | pathlib.Path | None) -> None:
    """Read ``path`` (the command's --config) in every ``load`` without a file of its
    own from now on in this process; None: no file."""
    global _process_file
    _process_file = pathlib.Path(path) if path is not None else None


def use_source(cls: type[BaseSettings], factory: SourceFactory) -> None:
    """Ask ``factory``'s source too, above the environment, in every ``load`` of ``cls``
    from now on in this process (once per factory)."""
    factories = _process_sources.setdefault(cls, [])
    if factory not in factories:
        factories.append(factory)


def export(cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
    """Hand ``values`` (fields of ``cls`` this process chose from its flags or config
    file) to its child processes as their environment variables (``child_env``)."""
    for name, value in values.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        _exported[env_names(cls, name)[0]] = text


def exported() -> dict[str, str]:
    """The variables ``export`` recorded: what a child process needs beyond this one's environment."""
    return dict(_exported)


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: ``base`` (default this process's environment)
    with the settings this process exported on top."""
    env = dict(os.environ if base is None else base)
    env.update(_exported)
    return env


def reset() -> None:
    """Forget the command's file, sources and exports (the end of ``binlake.cli.main``)."""
    use_file(None)
    _process_sources.clear()
    _exported.clear()


def source_keys(cls: type[BaseSettings], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (by field name) keyed as pydantic-settings' own sources key them: a field
    with a ``validation_alias`` by its first alias, so a higher source's value replaces a
    lower one's instead of sitting beside it. Unknown names are kept (and refused)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        field = cls.model_fields.get(name)
        out[env_names(cls, name)[0] if field is not None and field.validation_alias is not None else name] = value
    return out


class _TomlSection(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return source_keys(self.settings_cls, self._values)


def _section(doc: dict[str, Any], section: str) -> Any:
    """The table ``section`` of a TOML document; a dotted name (``lake.s3``) is nested,
    and a section's own sub-sections (``s3`` in ``[lake]``) are not its keys."""
    table: Any = doc
    for part in section.split("."):
        if not isinstance(table, dict):
            return table
        table = table.get(part, {})
    if isinstance(table, dict):
        children = {name.rpartition(".")[2] for name in SECTIONS.values() if name.rpartition(".")[0] == section}
        table = {k: v for k, v in table.items() if k not in children}
    return table


def read_toml(path: str | pathlib.Path) -> dict[str, Any]:
    p = pathlib.Path(path)
    if not p.is_file():
        raise errors.ConfigError(f"config file {p} does not exist (see config/binlake.toml for a sample)")
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise errors.ConfigError(f"config file {p} is not valid TOML: {exc}") from None


def load(cls: type[S], config_file: str | pathlib.Path | None = None, *,
         sources: Sequence[SourceFactory] = (), **overrides: Any) -> S:
    """Build ``cls`` from defaults, the file's table (``config_file``, else the command's
    --config), the environment, ``sources`` and the ones registered for ``cls`` (above
    the environment, in that order) and ``overrides`` (None values in overrides are
    ignored, so unset CLI flags fall through). Read anew on every call: a changed
    environment (or Airflow Variable) takes effect at once."""
    section = SECTIONS.get(cls, "")
    path = config_file if config_file is not None else _process_file
    values: dict[str, Any] = {}
    if path is not None:
        doc = read_toml(path)
        table = _section(doc, section)
        if not isinstance(table, dict):
            raise errors.ConfigError(f"config file {path}: [{section}] must be a table")
        values = table
    factories = [*sources, *_process_sources.get(cls, ())]

    class _Loaded(cls):  # type: ignore[valid-type, misc]
        @classmethod
        def settings_customise_sources(
            cls_,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, *(f(settings_cls) for f in factories), env_settings,
                    _TomlSection(settings_cls, values))

    _Loaded.__name__ = cls.__name__
    try:
        loaded = _Loaded(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise errors.ConfigError(describe_validation_error(exc, section, cls)) from None
    # Only the keys some layer set, so model_fields_set still tells them from defaults.
    return cls.model_validate(loaded.model_dump(exclude_unset=True))


def check_file(config_file: str | pathlib.Path) -> None:
    """Validate every section of ``config_file`` that it holds, whichever one the command
    reads: a bad value or unknown key anywhere in a user's file is reported, not skipped."""
    doc = read_toml(config_file)
    for cls, section in SECTIONS.items():
        table = _section(doc, section)
        if not isinstance(table, dict):
            raise errors.ConfigError(f"config file {config_file}: [{section}] must be a table")
        if not table:
            continue
        try:
            cls.model_validate(table)
        except ValidationError as exc:
            raise errors.ConfigError(describe_validation_error(exc, section, cls)) from None


def describe_validation_error(exc: ValidationError, section: str, cls: type[BaseSettings]) -> str:
    """One line naming each refused key with its TOML table, variable and Airflow Variable."""
    by_alias = {env.lower(): name for name in cls.model_fields for env in env_names(cls, name)}
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if loc and loc[0].lower() in by_alias:
            loc[0] = by_alias[loc[0].lower()]
        key = ".".join(loc) or "?"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see config/binlake.toml for the keys)"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        given = err.get("input")
        # Our own validators already quote the value; pydantic's messages do not.
        shown = f" (got {given!r})" if given is not None and err["type"] not in ("extra_forbidden", "value_error") else ""
        field = cls.model_fields.get(loc[0]) if loc else None
        names = env_names(cls, loc[0]) if field is not None else (f"{cls.model_config.get('env_prefix', '')}{key}".upper(),)
        where = " / ".join(names)
        variable = airflow_variable(field) if field is not None else None
        if variable is not None:
            where += f" / Airflow Variable {variable}"
        lines.append(f"[{section}] {key} / {where}: {msg}{shown}")
    # One line, as every user mistake is reported (the CLI prints it after "error:").
    return "invalid configuration: " + "; ".join(lines)
