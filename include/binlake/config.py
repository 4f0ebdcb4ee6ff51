"""Configuration: defaults < TOML file < ``BINLAKE_*`` environment < command-line flags.

Each component has a settings class; ``config/binlake.toml`` documents every key.
A TOML file has one table per component (``[registry]``, ``[pump]``,
``[client]``, ``[security]``, ``[paths]``, ``[restore]``, ``[lake.s3]``); unknown keys and bad values are reported with the key's name.
"""

from __future__ import annotations

import pathlib
import re
import tomllib
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
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

    @field_validator("addr")
    @classmethod
    def _addr(cls, v: str) -> str:
        return _check_addr(v, "registry addr") or v

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

    parallelism: int = Field(4, ge=1, le=64, description=(
        "Tables written (Delta) or loaded (a target database) at once after the one pass over the lake; "
        "SQLite targets load one at a time (one writer)."))


class S3Settings(BaseSettings):
    """How to reach an S3 lake: ``[lake.s3]`` in the config file, BINLAKE_LAKE_S3_* in
    the environment; the standard AWS_* variables take precedence over both."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_LAKE_S3_", extra="forbid")

    endpoint_url: str | None = Field(None, description=(
        "S3 endpoint, e.g. http://127.0.0.1:8333 for SeaweedFS or MinIO (default: AWS's own)."))
    region: str = Field("us-east-1", description="Region of the bucket.")
    access_key_id: str | None = Field(None, description="Access key (else AWS_ACCESS_KEY_ID).")
    secret_access_key: str | None = Field(None, description="Secret key (else AWS_SECRET_ACCESS_KEY); never logged.",
                                          repr=False)
    session_token: str | None = Field(None, description="Session token of temporary credentials.", repr=False)
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


class SparkSettings(BaseSettings):
    """Where binlake's Spark jobs run (the CLI's lake commands, jobs/ingest.py and
    jobs/apply.py, the DAGs' in-process sessions and spark-submit ingests)."""

    model_config = SettingsConfigDict(env_prefix="BINLAKE_SPARK_", extra="forbid")

    master: str | None = Field(None, description=(
        "Spark master: local[N], spark://HOST:PORT (a standalone cluster), yarn, k8s://URL "
        "(default local[*]; the DAGs' Variable binlake_spark_master wins)."))
    ship_code: bool = Field(True, description=(
        "On a cluster master, ship this binlake to the executors (a zip on spark.submit.pyFiles) "
        "instead of relying on a copy installed on every worker."))

    @field_validator("master")
    @classmethod
    def _master(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if not MASTER_PATTERN.match(v.strip()):
            raise ValueError(f"{v!r} is not a Spark master URL (local[N], spark://HOST:PORT, yarn, k8s://URL)")
        return v.strip()


def paths() -> PathSettings:
    """The paths from the environment (BINLAKE_JARS_DIR, ...), else the checkout's."""
    return load(PathSettings)


S = TypeVar("S", bound=BaseSettings)

SECTIONS: dict[type[BaseSettings], str] = {
    RegistrySettings: "registry",
    PumpSettings: "pump",
    ClientSettings: "client",
    SecuritySettings: "security",
    PathSettings: "paths",
    RestoreSettings: "restore",
    SparkSettings: "spark",
    S3Settings: "lake.s3",
}


class _TomlSection(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _section(doc: dict[str, Any], section: str) -> Any:
    """The table ``section`` of a TOML document; a dotted name (``lake.s3``) is nested."""
    table: Any = doc
    for part in section.split("."):
        if not isinstance(table, dict):
            return table
        table = table.get(part, {})
    return table


def read_toml(path: str | pathlib.Path) -> dict[str, Any]:
    p = pathlib.Path(path)
    if not p.is_file():
        raise errors.InvalidArgument(f"config file {p} does not exist (see config/binlake.toml for a sample)")
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise errors.InvalidArgument(f"config file {p} is not valid TOML: {exc}") from None


def load(cls: type[S], config_file: str | pathlib.Path | None = None, **overrides: Any) -> S:
    """Build ``cls`` from defaults, the file's table, the environment and ``overrides``
    (None values in overrides are ignored, so unset CLI flags fall through)."""
    section = SECTIONS.get(cls, "")
    values: dict[str, Any] = {}
    if config_file is not None:
        doc = read_toml(config_file)
        table = _section(doc, section)
        if not isinstance(table, dict):
            raise errors.InvalidArgument(f"config file {config_file}: [{section}] must be a table")
        values = table

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
            return (init_settings, env_settings, _TomlSection(settings_cls, values))

    _Loaded.__name__ = cls.__name__
    try:
        loaded = _Loaded(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise errors.InvalidArgument(describe_validation_error(exc, section, cls)) from None
    return cls.model_validate(loaded.model_dump())


def check_file(config_file: str | pathlib.Path) -> None:
    """Validate every section of ``config_file`` that it holds, whichever one the command
    reads: a bad value or unknown key anywhere in a user's file is reported, not skipped."""
    doc = read_toml(config_file)
    for cls, section in SECTIONS.items():
        table = _section(doc, section)
        if not isinstance(table, dict):
            raise errors.InvalidArgument(f"config file {config_file}: [{section}] must be a table")
        if not table:
            continue
        try:
            cls.model_validate(table)
        except ValidationError as exc:
            raise errors.InvalidArgument(describe_validation_error(exc, section, cls)) from None


def describe_validation_error(exc: ValidationError, section: str, cls: type[BaseSettings]) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "?"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (see config/binlake.toml for the keys)"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        given = err.get("input")
        # Our own validators already quote the value; pydantic's messages do not.
        shown = f" (got {given!r})" if given is not None and err["type"] not in ("extra_forbidden", "value_error") else ""
        lines.append(f"[{section}] {key} / {prefix}{key.upper()}: {msg}{shown}")
    # One line, as every user mistake is reported (the CLI prints it after "error:").
    return "invalid configuration: " + "; ".join(lines)
