"""Where the lake is: a local directory or ``s3://bucket/prefix``, and where its tables are.

Every command, job and DAG that takes a lake goes through this module for:

* the lake itself (``parse``/``check_lake``): a plain path (made absolute), a
  ``file:`` URI, or ``s3://BUCKET[/PREFIX]`` (``s3a://`` is accepted as the same);
* each table's location (``table_path``, ``join``), and the relative form kept
  inside the lake (``relative``/``resolve``): nothing stored in the lake names an
  absolute location, so a lake copied, moved or synced to a bucket keeps working.

Paths only: the S3 settings are ``binlake.lake.s3settings``, reaching an S3 lake
``binlake.lake.store.s3``, the ledger ``binlake.lake.store.ledger``.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Any

from binlake import errors

# The lake's tables, written by the ingest.
CHANGES = "changes"
DDL_HISTORY = "ddl_history"
WINDOWS = "windows"
TABLES = (CHANGES, DDL_HISTORY, WINDOWS)


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
