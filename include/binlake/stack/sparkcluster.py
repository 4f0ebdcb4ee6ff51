"""A Spark standalone cluster as local processes: one master and N workers from the pyspark wheel.

The tests and ``binlake up --spark-cluster`` need a real ``spark://`` master
but no Spark installation beside pyspark: the wheel ships ``bin/spark-class``
and the standalone Master and Worker classes. ``SparkCluster(root)`` starts
the master on a free loopback port, then the workers (each with its own work
directory and log under ``root``, small cores and memory: the machine is
shared), waits until every worker has registered with the master (the
master's ``/json`` status page), and stops them all, workers first.

    with SparkCluster(tmp / "spark", workers=1) as cluster:
        spark = build_spark("job", cluster.master_url)   # spark://127.0.0.1:PORT

Every process binds to ``host`` (127.0.0.1 by default). The executors of one
machine's cluster share its disk, so a local lake works; a cluster across
hosts shares only the lake on object storage (see docs/how-to/hosts/spark.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Self

from binlake import errors
from binlake.net import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0


def spark_home() -> pathlib.Path:
    """The pyspark wheel's directory: its ``bin/spark-class`` and ``jars/`` are a Spark home."""
    import pyspark

    return pathlib.Path(pyspark.__file__).resolve().parent


def spark_class() -> str:
    """``bin/spark-class`` of the installed pyspark (runs a Spark JVM class in the foreground)."""
    path = spark_home() / "bin" / "spark-class"
    if not path.is_file():
        raise errors.FailedPrecondition(f"{path} is missing: reinstall pyspark (pip install -c constraints.txt pyspark)")
    return str(path)


def _tail(path: pathlib.Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Proc:
    """One JVM of the cluster: its command, log and process (its own session, so a
    stop signals the JVM and anything it started, e.g. a worker's executors)."""

    def __init__(self, name: str, args: list[str], log_path: pathlib.Path, env: Mapping[str, str]) -> None:
        self.name, self.args, self.log_path, self.env = name, args, log_path, dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # The group goes too: a worker's executor JVMs and their Python workers.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class SparkCluster:
    """A standalone master and ``workers`` workers under ``root_dir``; a context manager.

    ``cores`` and ``memory`` are what each worker offers its executors (Spark's
    ``--cores`` and ``--memory``); ``master_port`` 0 picks a free port (``binlake
    up`` passes a fixed one so a restart keeps the same URL)."""

    def __init__(self, root_dir: str | os.PathLike[str], *, workers: int = 1, cores: int = 1,
                 memory: str = "1g", host: str = "127.0.0.1", master_port: int = 0,
                 env: Mapping[str, str] | None = None, master_wrap: Sequence[str] = (),
                 worker_hosts: Sequence[tuple[str, Sequence[str]]] | None = None) -> None:
        """``master_wrap`` and ``worker_hosts`` place the JVMs on the hosts of a multi-host
        test bed (``testing.netbed``): a command prefix that runs a program on a host
        (``ip netns exec NS``) for the master, and (address, prefix) per worker; by
        default every process runs here and binds ``host``."""
        if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 16:
            raise ValueError(f"workers must be an integer in 1..16, got {workers!r}")
        if not isinstance(cores, int) or isinstance(cores, bool) or not 1 <= cores <= 256:
            raise ValueError(f"cores must be an integer in 1..256, got {cores!r}")
        if not isinstance(memory, str) or not memory[:-1].isdigit() or memory[-1:].lower() not in ("m", "g"):
            raise ValueError(f"memory must be like 512m or 1g, got {memory!r}")
        if not isinstance(master_port, int) or not 0 <= master_port < 65536:
            raise ValueError(f"master_port must be in 0..65535, got {master_port!r}")
        self.root_dir = pathlib.Path(root_dir).absolute()
        self.workers, self.cores, self.memory, self.host = workers, cores, memory, host
        self._fixed_port = master_port
        self.master_port = master_port
        self.ui_port = 0
        from binlake import config

        # The settings the command chose (TLS files, ...) reach the executors' Python workers too.
        self._env = config.child_env(env)
        self.master_wrap = list(master_wrap)
        if worker_hosts is not None and len(worker_hosts) != workers:
            raise ValueError(f"worker_hosts names {len(worker_hosts)} hosts for {workers} workers")
        self.worker_hosts = [(addr, list(wrap)) for addr, wrap in worker_hosts or [(host, [])] * workers]
        self.procs: list[_Proc] = []

    @property
    def master_url(self) -> str:
        """``spark://HOST:PORT``, what ``--master`` and ``binlake_spark_master`` take."""
        return f"spark://{self.host}:{self.master_port}"

    def _env_for(self, name: str, addr: str) -> dict[str, str]:
        env = dict(self._env)
        # The address the JVM (and a worker's executors) bind and advertise.
        env["SPARK_LOCAL_IP"] = addr
        env["SPARK_HOME"] = str(spark_home())
        # Executors start Python workers with the application's spark.pyspark.python;
        # this is only the fallback for a job that names none.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        # Never pick up a developer's conf dir or a leftover SPARK_CONF_DIR of a test.
        env.pop("SPARK_CONF_DIR", None)
        env["SPARK_LOG_DIR"] = str(self.root_dir / "logs")
        env["SPARK_WORKER_DIR"] = str(self.root_dir / name / "work")
        # Small daemons: the master and worker themselves need little heap.
        env["SPARK_DAEMON_MEMORY"] = "256m"
        return env

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        """Start the master, then the workers; return once every worker is ALIVE at the master."""
        self.root_dir.mkdir(parents=True, exist_ok=True)
        # A host of a test bed has its own ports: any number free here is free there.
        port_host = "127.0.0.1" if self.master_wrap else self.host
        self.master_port = self._fixed_port or free_port(port_host)
        self.ui_port = free_port(port_host)
        master = _Proc("master", [*self.master_wrap, spark_class(), MASTER_CLASS, "--host", self.host,
                                  "--port", str(self.master_port), "--webui-port", str(self.ui_port)],
                       self.root_dir / "master.log", self._env_for("master", self.host))
        self.procs = [master]
        try:
            master.start()
            self._wait(lambda: self._status() is not None, "the Spark master", timeout_s)
            for i, (addr, wrap) in enumerate(self.worker_hosts, start=1):
                name = f"worker{i}"
                worker = _Proc(name, [*wrap, spark_class(), WORKER_CLASS, self.master_url, "--host", addr,
                                      "--webui-port", str(free_port("127.0.0.1" if wrap else addr)),
                                      "--cores", str(self.cores), "--memory", self.memory,
                                      "--work-dir", str(self.root_dir / name / "work")],
                               self.root_dir / f"{name}.log", self._env_for(name, addr))
                self.procs.append(worker)
                worker.start()
            self._wait(lambda: len(self.alive_workers()) >= self.workers,
                       f"{self.workers} Spark worker(s) to register with {self.master_url}", timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _status(self) -> dict[str, Any] | None:
        """The master's status page (JSON), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/", timeout=2) as resp:
                status: dict[str, Any] = json.loads(resp.read())
                return status
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master knows as ALIVE (each with its id, host, cores and memory)."""
        status = self._status() or {}
        return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]

    def _wait(self, check: Any, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            dead = [p for p in self.procs if not p.alive]
            if dead:
                p = dead[0]
                raise errors.Unavailable(f"Spark {p.name} exited while waiting for {what}; log {p.log_path}:\n"
                                         f"{_tail(p.log_path)}")
            if time.monotonic() > deadline:
                logs = ", ".join(str(p.log_path) for p in self.procs)
                raise errors.DeadlineExceeded(f"timed out after {timeout_s:g}s waiting for {what}; see {logs}")
            time.sleep(0.3)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` (1-based) and everything it started, its executors
        included (a worker host lost)."""
        if not 1 <= i <= self.workers:
            raise ValueError(f"no worker {i} (1..{self.workers})")
        proc = self.procs[i].proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    @property
    def running(self) -> bool:
        return bool(self.procs) and all(p.alive for p in self.procs)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the workers (and their executors), then the master."""
        for proc in reversed(self.procs):
            proc.stop(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SparkCluster({str(self.root_dir)!r}, {self.master_url if self.running else 'stopped'})"
