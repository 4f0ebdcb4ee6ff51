"""Reaching an S3 lake from this process: a PyArrow file system with the settings in
force, the check that the bucket answers them (``probe``) before anything is
written, and ``prepare``, what every job does before it opens a lake.

Writers: Spark writes every lake table (through s3a, with delta-spark's default
S3 LogStore, safe for one driver at a time: the writers of a lake take turns
through ``binlake.lake.store.writelock``, on S3 its writer lease); delta-rs only
reads, so it needs no locking provider or conditional-put setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from binlake import errors
from binlake.config import S3Settings
from binlake.lake.s3settings import s3_settings
from binlake.lake.sparkenv.session import configure_spark
from binlake.lake.store.location import Lake, parse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
