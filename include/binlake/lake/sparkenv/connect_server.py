"""The always-on Spark: a Spark Connect server with binlake's lake settings.

``binlake up`` starts one beside the Pumps, docker-compose runs one as the
``spark-connect`` service, the tests and the bench start one per module; all
through ``server_command``, so every server has the same confs: the Delta jars
on ``spark.jars``, Delta's SQL extension and catalog, UTC, the lake's small
snapshot partitioning, and Python workers running this interpreter with
binlake importable (the ``binlake`` data source runs in them).

    python -m binlake.lake.sparkenv.connect_server [--port 15002] [--master local[*]]

runs one in the foreground (what the compose service does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from binlake import config, errors
from binlake.lake import s3settings
from binlake.lake.sparkenv.connect import DEFAULT_PORT
from binlake.lake.sparkenv.session import LAKE_CONF, check_master, delta_jars

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_submit() -> str:
    """The ``spark-submit`` of the installed pyspark (beside this interpreter in a venv)."""
    beside = pathlib.Path(sys.executable).parent / "spark-submit"
    if beside.is_file():
        return str(beside)
    import pyspark

    return str(pathlib.Path(pyspark.__file__).parent / "bin" / "spark-submit")


def server_conf(port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's confs: binlake's lake settings (the same as ``build_spark``'s)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    conf = {
        "spark.jars": ",".join(str(p) for p in delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        "spark.connect.grpc.binding.port": str(port),
        # Clients cannot ask a Connect server for its parallelism; they read this conf.
        "spark.default.parallelism": str(max(1, os.cpu_count() or 1)),
        # A window's job is small and the server's cores are few: Spark's default of
        # 200 shuffle partitions makes every sort of a small table 200 tasks.
        "spark.sql.shuffle.partitions": str(max(2, 2 * (os.cpu_count() or 1))),
        # A client that died mid-job must not keep its session's jobs and temp views long.
        "spark.connect.session.manager.defaultSessionTimeout": "10m",
        **LAKE_CONF,
        # An S3 lake's endpoint and addressing (its keys come through server_env).
        **s3settings.spark_conf(),
    }
    conf.update(extra or {})
    return conf


def server_command(port: int = DEFAULT_PORT, master: str = "local[*]",
                   extra_conf: Mapping[str, str] | None = None) -> list[str]:
    """The spark-submit command line of a binlake Spark Connect server on ``port``. The
    server is the driver of every job its clients run: its heap is ``[memory] driver``
    (``--driver-memory``; the JVM's size is fixed when it starts) and its executors' on a
    cluster master ``[memory] executor``, unless ``extra_conf`` sets them."""
    check_master(master, "--master")
    bounds = config.memory()
    conf = {"spark.executor.memory": bounds.executor, **server_conf(port, extra_conf)}
    driver = conf.pop("spark.driver.memory", bounds.driver)
    args = [spark_submit(), "--class", SERVER_CLASS, "--master", master, "--name", "binlake-spark-connect",
            "--driver-memory", driver]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: its Python workers run this interpreter and import
    this binlake (the data source's classes are pickled by reference), with the
    settings this command chose (``config.child_env``)."""
    import binlake
    env = config.child_env(base)

    include = str(pathlib.Path(binlake.__file__).resolve().parents[1])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([include, *[p for p in paths if p != include]])
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # An S3 lake's keys reach the server through its environment, never its command line.
    env.update(s3settings.aws_env())
    return env


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


class ConnectServer:
    """A Spark Connect server child process (tests, bench): ``start()``, ``stop()``, ``kill()``."""

    def __init__(self, port: int, log_path: pathlib.Path, extra_conf: Mapping[str, str] | None = None,
                 master: str = "local[*]") -> None:
        self.port = port
        self.log_path = log_path
        self.args = server_command(port, master, extra_conf)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> ConnectServer:
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is taken: another Spark Connect server runs there")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=server_env(),
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the Spark Connect server did not listen on {self.port} in {timeout_s:g}s; "
                                   f"see {self.log_path}")
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        """SIGKILL the server's process group (the JVM and its Python workers)."""
        self._signal(signal.SIGKILL)

    def stop(self, grace_s: float = 15.0) -> None:
        self._signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m binlake.lake.sparkenv.connect_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port (default {DEFAULT_PORT})")
    parser.add_argument("--master", default="local[*]", help="the server's Spark master (default local[*])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark conf")
    args = parser.parse_args(argv)
    extra: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.exit(2, f"--conf {item!r}: expected KEY=VALUE\n")
        extra[key] = value
    try:
        command = server_command(args.port, args.master, extra)
    except (ValueError, RuntimeError, errors.BinlakeError) as exc:  # a bad port or master, no Delta jars
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    os.execve(command[0], command, server_env())
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
