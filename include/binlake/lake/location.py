"""Where the lake is: a local directory or ``s3://bucket/prefix``, and how to reach it.

Every command, job and DAG that takes a lake goes through this module for:

* the lake itself (``parse``/``check_lake``): a plain path (made absolute), a
  ``file:`` URI, or ``s3://BUCKET[/PREFIX]`` (``s3a://`` is accepted as the same);
* each table's location (``table_path``, ``join``), and the relative form kept
  inside the lake (``relative``/``resolve``): nothing stored in the lake names an
  absolute location, so a lake copied, moved or synced to a bucket keeps working;
* the settings handed to the two engines that open it: the Hadoop ``fs.s3a.*``
  confs for Spark (``hadoop_conf``/``configure_spark``) and the ``storage_options``
  of delta-rs (``storage_options``);
* a cheap check that an S3 lake is reachable with the credentials given
  (``probe``), run before anything is written.

Credentials and endpoint come from, in this order: the ``AWS_*`` environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``), then
``BINLAKE_LAKE_S3_*``, then the ``[lake.s3]`` table of the config file. They are
never taken from a command line and never logged (``S3Settings.__repr__`` hides
the secret; Spark redacts ``fs.s3a.*key`` confs).

Writers: Spark writes every lake table (through s3a, with delta-spark's default
S3 LogStore, safe for one driver at a time: the writers of a lake take turns
through ``lake.writelock``, on S3 its writer lease); delta-rs only reads, so it
needs no locking provider or conditional-put setting.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import TYPE_CHECKING, Any

from binlake import errors
from binlake.config import S3Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The lake's tables, written by the ingest.
CHANGES = "changes"
DDL_HISTORY = "ddl_history"
WINDOWS = "windows"
TABLES = (CHANGES, DDL_HISTORY, WINDOWS)

def s3_settings() -> S3Settings:
    """The S3 settings in force: AWS_* > BINLAKE_LAKE_S3_* > [lake.s3] of the command's
    --config > defaults (``binlake.config.S3Settings``; in the DAGs' tasks the
    ``binlake_lake_s3`` Connection comes first)."""
    from binlake import config

    return config.load(S3Settings)


@dataclasses.dataclass(frozen=True)
class Lake:
    """A parsed lake location. ``base`` is what table paths hang off: an absolute local
    directory, or ``s3a://bucket/prefix`` (the scheme Spark's hadoop-aws serves)."""

    given: str
    scheme: str  # "file", "s3", or another Hadoop scheme passed to Spark as is
    bucket: str | None  # S3 only
    prefix: str  # inside the bucket, without leading/trailing '/'
    base: str

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    @property
    def local(self) -> str | None:
        return self.base if self.scheme == "file" else None


def parse(lake: Any, what: str = "lake") -> Lake:
    """The lake at ``lake``: a local path, ``file:`` URI or ``s3://bucket[/prefix]``.
    ``errors.InvalidArgument`` (one line) for anything else."""
    if not isinstance(lake, str) or not lake.strip():
        raise errors.InvalidArgument(f"{what} must be a directory or an s3://bucket/prefix URI, got {lake!r}")
    text = lake.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        if text.startswith("file:"):
            text = text[len("file:"):]
        return Lake(lake, "file", None, "", os.path.abspath(os.path.expanduser(text)).rstrip("/") or "/")
    scheme = scheme.lower()
    if scheme == "file":
        return Lake(lake, "file", None, "", os.path.abspath(rest or "/").rstrip("/") or "/")
    if scheme not in ("s3", "s3a"):
        # Another file system Spark may know (hdfs://, abfss://, gs://): passed on as is,
        # with whatever Hadoop settings the session has; only S3 is configured here.
        if not rest.strip("/"):
            raise errors.InvalidArgument(f"{what} {lake!r} names no location after {scheme}://")
        return Lake(lake, scheme, None, "", text.rstrip("/"))
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise errors.InvalidArgument(f"{what} {lake!r} names no bucket: give s3://BUCKET/PREFIX")
    if not _valid_bucket(bucket):
        raise errors.InvalidArgument(
            f"{what} {lake!r}: {bucket!r} is not a valid bucket name (3-63 lowercase letters, digits, '.', '-')")
    prefix = "/".join(p for p in prefix.split("/") if p)
    if any(p in (".", "..") for p in prefix.split("/")):
        raise errors.InvalidArgument(f"{what} {lake!r}: the prefix may not hold '.' or '..' parts")
    base = f"s3a://{bucket}" + (f"/{prefix}" if prefix else "")
    return Lake(lake, "s3", bucket, prefix, base)


def _valid_bucket(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789.-")
    return 3 <= len(name) <= 63 and set(name) <= allowed and name[0].isalnum() and name[-1].isalnum()


def check_lake(lake: Any, what: str = "lake") -> str:
    """``lake`` unchanged once it parses (see ``parse``)."""
    parse(lake, what)
    return str(lake)


def join(lake: str, *parts: str) -> str:
    """The location ``parts`` under the lake (for Spark and delta-rs alike)."""
    base = parse(lake).base
    for p in parts:
        if not isinstance(p, str) or not p or p.startswith("/") or ".." in p.split("/"):
            raise ValueError(f"lake sub-path parts must be relative names, got {p!r}")
    return "/".join([base.rstrip("/"), *parts]) if parts else base


def table_path(lake: str, name: str) -> str:
    """The location of one of the ingest's tables."""
    if name not in TABLES:
        raise ValueError(f"unknown lake table {name!r}; expected {CHANGES}, {DDL_HISTORY} or {WINDOWS}")
    return join(lake, name)


def relative(lake: str, path: str) -> str:
    """``path`` (under the lake) as the relative name kept inside the lake's catalogs."""
    base = parse(lake).base.rstrip("/") + "/"
    if not path.startswith(base):
        raise ValueError(f"{path} is not under the lake {base}")
    return path[len(base):]


def resolve(lake: str, stored: str) -> str:
    """A location read from a catalog: relative names hang off the lake; an absolute
    path or URI (catalogs written before locations were relative) is kept."""
    if not stored or stored.startswith("/") or "://" in stored or stored.startswith("file:"):
        return stored
    return join(lake, *posixpath.normpath(stored).split("/"))


def to_object_store(path: str) -> str:
    """A table location as delta-rs opens it (``s3a://`` -> ``s3://``)."""
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


def is_delta(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table: its log directory exists (a file-system
    check, cheaper than loading the table's state; works over Spark Connect too)."""
    from binlake.lake import connect

    if path.startswith("s3a://"):
        # Every job asks this first about the tables it opens: a session built before
        # the S3 settings were known (a task that read its Connection after starting
        # Spark) gets them here, before its first S3 access.
        configure_spark(spark)
    return connect.delta_log_exists(spark, path)


def read_windows(spark: SparkSession, lake: str) -> list[dict[str, Any]]:
    """Every window of the ``windows`` ledger, by start_ts (empty when nothing was ingested yet).

    A local lake's ledger is read in this process (``arrowread.small_table_rows``);
    elsewhere, or when delta-rs cannot read it, through Spark."""
    from binlake.lake import arrowread

    path = table_path(lake, WINDOWS)
    if not is_delta(spark, path):
        return []
    rows = arrowread.small_table_rows(path, None)
    if rows is None:
        rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()]
    # One row per window, the newest: a ledger row appended by an attempt whose
    # client died, committed by the server after the retry's, is the same window twice.
    newest: dict[tuple[int, int], dict[str, Any]] = {}
    for r in rows:
        key = (int(r["start_ts"]), int(r["end_ts"]))
        if key not in newest or str(r.get("ingested_at")) > str(newest[key].get("ingested_at")):
            newest[key] = r
    return [newest[k] for k in sorted(newest)]


# ---- engines -------------------------------------------------------------------

def hadoop_conf(settings: S3Settings | None = None) -> dict[str, str]:
    """The ``fs.s3a.*`` Hadoop confs for Spark. Static credentials when given (the
    keys Spark's redaction hides), else the SDK's default chain (env, profile, IMDS)."""
    s = settings or s3_settings()
    conf = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.path.style.access": "true" if s.path_style else "false",
        "fs.s3a.endpoint.region": s.region,
        # Fail a dead endpoint in seconds rather than after the SDK's long default retries.
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
        "fs.s3a.connection.establish.timeout": "5s",
        "fs.s3a.connection.timeout": "60s",
    }
    if s.endpoint_url:
        conf["fs.s3a.endpoint"] = s.endpoint_url
        conf["fs.s3a.connection.ssl.enabled"] = "false" if s.allow_http else "true"
    if s.access_key_id and s.secret_access_key:
        conf["fs.s3a.access.key"] = s.access_key_id
        conf["fs.s3a.secret.key"] = s.secret_access_key
        if s.session_token:
            conf["fs.s3a.session.token"] = s.session_token
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


# Confs that carry a secret: never given at a session start, because pyspark puts
# start confs on the JVM's command line (visible to every user of the host).
_SECRET_CONFS = ("fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token", "fs.s3a.aws.credentials.provider")


def spark_conf(settings: S3Settings | None = None) -> dict[str, str]:
    """``hadoop_conf`` without its secrets as Spark session confs (``spark.hadoop.``
    prefix), for a session or server start. The keys reach that JVM through its
    environment (``aws_env``; s3a's default credential chain reads AWS_*), or
    ``configure_spark`` over py4j once it runs."""
    return {f"spark.hadoop.{k}": v for k, v in hadoop_conf(settings).items() if k not in _SECRET_CONFS}


def aws_env(settings: S3Settings | None = None) -> dict[str, str]:
    """The AWS_* variables for a child process (a Spark server, spark-submit) that must
    reach the lake with the settings in force here, wherever they came from."""
    s = settings or s3_settings()
    env = {"AWS_REGION": s.region}
    if s.endpoint_url:
        env["AWS_ENDPOINT_URL"] = s.endpoint_url
    if s.access_key_id and s.secret_access_key:
        env["AWS_ACCESS_KEY_ID"] = s.access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = s.secret_access_key
        if s.session_token:
            env["AWS_SESSION_TOKEN"] = s.session_token
    return env


def configure_spark(spark: SparkSession, settings: S3Settings | None = None) -> None:
    """Apply the s3a confs to a running classic session's Hadoop configuration (the
    one Delta and binlake's log checks open file systems with)."""
    from binlake.lake import connect

    if connect.is_remote(spark):
        return  # a Spark Connect server holds its own settings
    conf = hadoop_conf(settings)
    key = (id(spark), tuple(sorted(conf.items())))
    if _configured.get(id(spark)) == key:
        return  # already in force: no py4j round trips
    hconf: Any = spark.sparkContext._jsc.hadoopConfiguration()  # py4j: untyped
    for name, value in conf.items():
        hconf.set(name, value)
    _configured[id(spark)] = key


# The s3a settings last applied to each session (by id), so re-applying is free.
_configured: dict[int, tuple[int, tuple[tuple[str, str], ...]]] = {}


def storage_options(settings: S3Settings | None = None) -> dict[str, str]:
    """delta-rs ``storage_options`` for an S3 lake (reads only: no locking provider)."""
    s = settings or s3_settings()
    # The region, endpoint and keys a child process gets, under the same names, plus
    # what only delta-rs's object store reads.
    opts = {**aws_env(s), "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if s.path_style else "true"}
    if s.endpoint_url and s.allow_http:
        opts["AWS_ALLOW_HTTP"] = "true"
    return opts


def s3_filesystem(settings: S3Settings | None = None) -> Any:
    """A PyArrow S3 file system with the settings in force (for checks and listings
    outside the two engines), failing fast on a dead endpoint."""
    from pyarrow import fs as pafs

    s = settings or s3_settings()
    endpoint = s.endpoint_url or ""
    return pafs.S3FileSystem(
        access_key=s.access_key_id, secret_key=s.secret_access_key, session_token=s.session_token,
        region=s.region, endpoint_override=endpoint.split("://", 1)[-1] or None,
        scheme="http" if s.allow_http else "https", connect_timeout=5, request_timeout=20,
        force_virtual_addressing=not s.path_style,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))


def probe(lake: str, settings: S3Settings | None = None) -> None:
    """Check, before anything is written, that an S3 lake's bucket exists and answers
    these credentials; ``errors.InvalidArgument`` (one line) otherwise. A local lake
    passes (the callers check its directory)."""
    where = parse(lake)
    if not where.is_s3:
        return
    from pyarrow import fs as pafs

    s = settings or s3_settings()
    endpoint = s.endpoint_url or ""
    try:
        store = s3_filesystem(s)
        info = store.get_file_info(where.bucket or "")
    except OSError as exc:
        raise errors.InvalidArgument(_s3_failure(lake, s, str(exc))) from None
    if info.type == pafs.FileType.NotFound:
        raise errors.InvalidArgument(
            f"lake {lake}: bucket {where.bucket!r} does not exist at {endpoint or 'AWS S3'}: create it first")
    try:
        # A listing exercises the credentials (a HEAD of the bucket may be anonymous).
        store.get_file_info(pafs.FileSelector(f"{where.bucket}/{where.prefix}".rstrip("/"), allow_not_found=True))
    except OSError as exc:
        raise errors.InvalidArgument(_s3_failure(lake, s, str(exc))) from None


def prepare(spark: SparkSession | None, lake: str) -> Lake:
    """Before a job opens ``lake``: parse it and, for S3, check it answers (``probe``)
    and put the s3a settings on ``spark``'s running session."""
    where = parse(lake)
    if where.is_s3:
        probe(lake)
        if spark is not None:
            configure_spark(spark)
    return where


def _s3_failure(lake: str, s: S3Settings, message: str) -> str:
    endpoint = s.endpoint_url or "AWS S3"
    first = " ".join(message.split())[:300]
    low = first.lower()
    if any(k in low for k in ("accessdenied", "access denied", "access_denied", "invalidaccesskeyid", "signaturedoesnotmatch",
                              "forbidden", "403")):
        return (f"lake {lake}: {endpoint} refused the credentials ({first}); check AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY or [lake.s3]")
    if any(k in low for k in ("curl", "connect", "resolve", "timeout", "unreachable", "network")):
        return (f"lake {lake}: cannot reach the S3 endpoint {endpoint} ({first}); check AWS_ENDPOINT_URL or "
                "[lake.s3] endpoint_url and that the server is up")
    return f"lake {lake}: S3 at {endpoint} failed: {first}"
