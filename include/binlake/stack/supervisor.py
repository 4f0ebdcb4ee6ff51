"""``binlake up``: the always-on stack on one machine, in the foreground.

What runs (each a child process with its own log under ``<data>/logs``):

- the registry (``<data>/registry``) and N Pumps (``<data>/pump1..N``) on fixed
  loopback ports, so a restart finds the same cluster with the same data;
- the always-on Spark: a Spark Connect server on ``--spark-connect-port``
  (``binlake.lake.sparkenv.connect_server``), whose clients are the DAGs' Spark jobs
  (``BINLAKE_SPARK_REMOTE``), so a window costs its work rather than a JVM start;
- Airflow with its metadata on a PostgreSQL server of the stack's own (data in
  ``<data>/airflow/postgres``; SQLite ``<data>/airflow/airflow.db`` where no
  PostgreSQL is installed, see ``binlake.stack.airflow_db``): API server (UI), scheduler,
  DAG processor and triggerer (what ``airflow standalone`` runs), pointed at this
  project's ``dags/`` and ``plugins/``, with the ``binlake_*`` settings of the
  DAGs in their environment.

Ctrl-C (or SIGTERM) stops everything in order: Airflow first (so no task
starts against a Pump that is going away), then Spark, then the Pumps (they flush and
report "paused"), then the registry, then Airflow's PostgreSQL. A second Ctrl-C kills what is left.
If any child exits on its own, the stack stops and says which one, with its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from binlake import config, errors, net
from binlake.stack import airflow_db

# The checkout's root (dags/, plugins/, jobs/) when run from one; the folders
# themselves come from binlake.config.PathSettings (BINLAKE_DAGS_FOLDER, ...).
PROJECT_ROOT = config.CHECKOUT

DEFAULT_PUMP_PORT_BASE = 8250
DEFAULT_AIRFLOW_PORT = 8080
DEFAULT_SPARK_CONNECT_PORT = 15002
DEFAULT_SPARK_MASTER_PORT = 7077
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Airflow's state file of this stack: the ingest DAG's start date is fixed on the
# first `binlake up`, so later restarts catch up on the windows they missed.
STATE_FILE = "binlake-up.json"


def local_airflow(home: pathlib.Path, dags: pathlib.Path | None = None,
                  plugins: pathlib.Path | None = None) -> dict[str, str]:
    """The settings of an Airflow on this machine running this project's DAGs: its
    home and SQLite metadata database under ``home``, no example DAGs. Airflow reads
    them from the environment when first imported (the stack, the demo, the DAG tests)."""
    dags = dags or config.paths().dags()
    plugins = plugins or config.paths().plugins()
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags.resolve()),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins.resolve()),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        # Writers wait for SQLite's lock instead of failing after 5 s (binlake.stack.airflow_db).
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": airflow_db.CONNECT_ARGS_PATH,
    }


@dataclasses.dataclass
class StackConfig:
    data_dir: pathlib.Path
    pumps: int = 3
    registry_addr: str = net.DEFAULT_REGISTRY_ADDR
    # Pump i (1-based) listens on base + 10*(i-1) and serves metrics on the port
    # after it (8250/8251, 8260/8261, ...); 0 = free ports.
    pump_port_base: int = DEFAULT_PUMP_PORT_BASE
    pump_args: list[str] = dataclasses.field(default_factory=list)
    airflow: bool = True
    airflow_port: int = DEFAULT_AIRFLOW_PORT
    # The always-on Spark Connect server (0 = none: the DAGs fall back to spark-submit).
    spark_connect_port: int = DEFAULT_SPARK_CONNECT_PORT
    dags_folder: pathlib.Path = dataclasses.field(default_factory=lambda: config.paths().dags())
    plugins_folder: pathlib.Path = dataclasses.field(default_factory=lambda: config.paths().plugins())
    ready_timeout_s: float = 180.0
    # Airflow's metadata database: auto (PostgreSQL when installed), postgres or sqlite.
    airflow_db: str = airflow_db.AUTO
    # A Spark standalone cluster (master + one worker) for the DAGs' jobs instead of
    # the Connect server: ingests go through spark-submit --master spark://...
    spark_cluster: bool = False
    spark_master_port: int = DEFAULT_SPARK_MASTER_PORT
    # (R, W) the registry creates a new cluster with (``binlake registry --replicas``).
    replication: tuple[int, int] | None = None


class Child:
    """A child process in its own session (so Ctrl-C reaches only `binlake up`,
    which stops children in order), logging to a file."""

    def __init__(self, name: str, args: Sequence[str], log_path: pathlib.Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} binlake up: {shlex.join(self.args)}\n".encode())
            log.flush()
            # Without an environment of its own, a child gets this command's with the settings
            # it chose from flags and --config (TLS files, the Spark master) on top.
            env = self.env if self.env is not None else config.child_env()
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        """Signal the child's whole process group: Airflow components run workers
        (uvicorn, executor slots, task processes) under them."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


def _check_port_free(addr: str, what: str) -> None:
    host, port = net.parse_addr(addr, what)
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        # As the servers themselves bind: connections of a previous run still in
        # TIME_WAIT must not count as "in use"; a listener still does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise errors.FailedPrecondition(
                f"{what} {addr} is not free ({exc.strerror}): is another `binlake up` (or a Pump) running? "
                "Stop it, or choose other ports (see `binlake up --help`)"
            ) from None


class Stack:
    """The processes of `binlake up`; ``run()`` is the whole command."""

    def __init__(self, cfg: StackConfig, out: TextIO | None = None) -> None:
        self.cfg = cfg
        self.out = out or sys.stdout
        self.data = cfg.data_dir.resolve()
        self.logs = self.data / "logs"
        host, port = net.parse_addr(cfg.registry_addr, "--registry-addr")
        self.registry_addr = f"{host}:{port or net.free_port(host)}"
        self.pump_addrs: dict[str, tuple[str, str]] = {}
        for i in range(1, cfg.pumps + 1):
            if cfg.pump_port_base:
                port = cfg.pump_port_base + 10 * (i - 1)
                self.pump_addrs[f"pump{i}"] = (f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}")
            else:
                self.pump_addrs[f"pump{i}"] = (f"127.0.0.1:{net.free_port()}", f"127.0.0.1:{net.free_port()}")
        self.airflow_home = self.data / "airflow"
        self.lake = self.data / "lake"
        self.children: list[Child] = []
        # The Spark standalone cluster of --spark-cluster (a SparkCluster), else None.
        self.spark_cluster: Any = None
        # The Connect server's child between its start and its port opening, else None.
        self.connect_starting: Child | None = None
        # Airflow's PostgreSQL (a LocalPostgres) and its URL; None on SQLite.
        self.postgres: Any = None
        self.airflow_db_url: str | None = None
        self.airflow_db_async_url: str | None = None
        self.stop_requested = threading.Event()
        self.force = threading.Event()

    # ------------------------------------------------------------------ the command

    def run(self) -> int:
        """Start everything, wait for Ctrl-C, stop everything; the exit status."""
        self._install_signal_handlers()
        try:
            self._preflight()
            self._start_binlake()
            if self.spark_remote and not self.stop_requested.is_set():
                self._start_spark_connect()
            if self.cfg.spark_cluster and self.cfg.airflow and not self.stop_requested.is_set():
                self._start_spark_cluster()
            if self.cfg.airflow and not self.stop_requested.is_set():
                self._start_airflow()
            if not self.stop_requested.is_set():
                self._wait_spark_connect()  # (already done when Airflow started)
            if self.stop_requested.is_set():
                return 0
            self._banner()
            return self._watch()
        finally:
            self.stop()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, _frame: object) -> None:
            if self.stop_requested.is_set():
                self.force.set()  # second Ctrl-C: stop waiting politely
            self.stop_requested.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _preflight(self) -> None:
        _check_port_free(self.registry_addr, "registry address")
        for node_id, (addr, metrics) in self.pump_addrs.items():
            _check_port_free(addr, f"{node_id} address")
            _check_port_free(metrics, f"{node_id} metrics address")
        if self.spark_remote:
            _check_port_free(f"127.0.0.1:{self.cfg.spark_connect_port}", "Spark Connect port")
        if self.cfg.spark_cluster and self.cfg.airflow:
            _check_port_free(f"127.0.0.1:{self.cfg.spark_master_port}", "Spark master port")
        if self.cfg.airflow:
            _check_port_free(f"127.0.0.1:{self.cfg.airflow_port}", "Airflow API server port")
            for what, folder in (("dags", self.cfg.dags_folder), ("plugins", self.cfg.plugins_folder)):
                if not folder.is_dir():
                    raise errors.FailedPrecondition(
                        f"{what} folder {folder} does not exist: run `binlake up` from a binlake checkout "
                        f"or pass --{what}-folder"
                    )
        try:
            self.data.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.InvalidArgument(
                f"--data-dir {self.data} cannot be created ({exc.strerror}); give a writable directory") from None

    # ------------------------------------------------------------------ binlake

    def _binlake(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "binlake.cli", *args]

    def _start_binlake(self) -> None:
        from binlake.registry.client import RegistryClient

        replication = self.cfg.replication
        flags = ["--replicas", str(replication[0]), "--min-acks", str(replication[1])] if replication else []
        registry = Child("registry", self._binlake("registry", "--data-dir", str(self.data / "registry"),
                                                   "--addr", self.registry_addr, *flags), self.logs / "registry.log")
        self._spawn(registry)
        self.say(f"binlake up: registry on {self.registry_addr} (data {self.data / 'registry'})")
        with RegistryClient(self.registry_addr, timeout_s=2.0) as reg:
            self._wait_for(lambda: reg.cluster_info() is not None, "the registry", [registry])
            pumps = []
            for node_id, (addr, metrics) in self.pump_addrs.items():
                child = Child(node_id, self._binlake(
                    "pump", "--registry", self.registry_addr, "--data-dir", str(self.data / node_id),
                    "--addr", addr, "--node-id", node_id, "--metrics-addr", metrics, *self.cfg.pump_args,
                ), self.logs / f"{node_id}.log")
                self._spawn(child)
                pumps.append(child)

            def pumps_online() -> bool:
                nodes, _ = reg.list_nodes("pump")
                up = {n.node_id for n in nodes if n.state == "online" and n.safe_ts > 0}
                return set(self.pump_addrs) <= up

            self._wait_for(pumps_online, f"{len(pumps)} pumps to come online", pumps)
        for node_id, (addr, metrics) in self.pump_addrs.items():
            self.say(f"binlake up: {node_id} on {addr} (metrics http://{metrics}/metrics, data {self.data / node_id})")

    def _spawn(self, child: Child) -> None:
        self.children.append(child)
        child.start()

    def _wait_for(self, check: Callable[[], bool], what: str, children: Sequence[Child]) -> None:
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        last: Exception | None = None
        while not self.stop_requested.is_set():
            for child in children:
                if not child.alive:
                    raise errors.Unavailable(
                        f"{child.name} exited with status {child.returncode} while waiting for {what}; "
                        f"see {child.log_path}"
                    )
            try:
                if check():
                    return
            except errors.BinlakeError as exc:
                last = exc
            if time.monotonic() > deadline:
                logs = ", ".join(str(c.log_path) for c in children)
                raise errors.DeadlineExceeded(
                    f"timed out after {self.cfg.ready_timeout_s:g}s waiting for {what} ({last or 'not ready'}); "
                    f"see {logs}"
                )
            self.stop_requested.wait(0.2)

    # ------------------------------------------------------------------ Spark

    @property
    def spark_remote(self) -> str | None:
        # Its clients are the DAGs' jobs: without Airflow there is nothing to serve; with a
        # cluster, the jobs are applications of the cluster (a Connect server would hold its cores).
        if not (self.cfg.airflow and self.cfg.spark_connect_port) or self.cfg.spark_cluster:
            return None
        return f"sc://127.0.0.1:{self.cfg.spark_connect_port}"

    def _start_spark_connect(self) -> None:
        """Start the Connect server's process; ``_wait_spark_connect`` waits for it to serve.
        In between the stack prepares Airflow's metadata: neither needs the other, and
        a JVM start and `airflow db migrate` each take seconds."""
        from binlake.lake.sparkenv import connect_server

        port = self.cfg.spark_connect_port
        try:
            args = connect_server.server_command(port)
        except RuntimeError as exc:  # no Delta jars: the message says to run `make setup`
            raise errors.FailedPrecondition(str(exc)) from None
        child = Child("spark-connect", args, self.logs / "spark-connect.log", env=connect_server.server_env())
        self._spawn(child)
        self.connect_starting = child

    def _wait_spark_connect(self) -> None:
        """Wait until the Connect server started by ``_start_spark_connect`` serves (before
        any Airflow component starts, so no DAG task runs before its Spark is there)."""
        from binlake.lake.sparkenv import connect_server

        child, self.connect_starting = self.connect_starting, None
        if child is None:
            return
        port = self.cfg.spark_connect_port
        self._wait_for(lambda: connect_server.port_open(port), f"the Spark Connect server on port {port}", [child])
        self.say(f"binlake up: Spark Connect server on {self.spark_remote} (log {child.log_path})")

    @property
    def spark_master(self) -> str | None:
        """The standalone master of --spark-cluster (with Airflow; its jobs are the DAGs')."""
        if not (self.cfg.airflow and self.cfg.spark_cluster):
            return None
        return f"spark://127.0.0.1:{self.cfg.spark_master_port}"

    def _start_spark_cluster(self) -> None:
        from binlake.stack.sparkcluster import SparkCluster

        # One worker with this machine's cores: each ingest is an application taking
        # them while it runs (the next one queues at the master until they are free).
        self.spark_cluster = SparkCluster(self.data / "spark", workers=1, cores=max(1, os.cpu_count() or 1),
                                          memory=config.load(config.SparkSettings).worker_memory,
                                          master_port=self.cfg.spark_master_port)
        try:
            self.spark_cluster.start(timeout_s=self.cfg.ready_timeout_s)
        except errors.BinlakeError as exc:
            self.spark_cluster = None
            raise errors.FailedPrecondition(f"the Spark standalone cluster did not start: {exc}") from None
        self.say(f"binlake up: Spark standalone cluster {self.spark_master} "
                 f"(master UI http://127.0.0.1:{self.spark_cluster.ui_port}, logs in {self.data / 'spark'})")

    # ------------------------------------------------------------------ Airflow

    def airflow_env(self) -> dict[str, str]:
        """The environment of every Airflow component (and of `airflow` commands run by hand)."""
        env = config.child_env()
        bin_dir = str(pathlib.Path(sys.executable).parent)
        env.update({
            # spark-submit and airflow live next to this interpreter (the venv).
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            **local_airflow(self.airflow_home, self.cfg.dags_folder, self.cfg.plugins_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # The stack is always on: its DAGs run as soon as they are parsed.
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            # One machine, loopback only: the UI needs no login (as `airflow standalone`
            # with all-admins); never expose this port beyond the machine.
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.cfg.airflow_port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.cfg.airflow_port}/execution/",
            # binlake settings of the DAGs (Airflow Variables of the same names override them).
            "BINLAKE_REGISTRY": self.registry_addr,
            "BINLAKE_LAKE_DIR": str(self.lake),
            "BINLAKE_INGEST_START_DATE": self._ingest_start_date(),
        })
        if self.spark_master:
            # Every window a spark-submit application of the cluster (binlake_spark_master
            # wins over the spark_default connection); in-process DAG jobs drive it too.
            env["BINLAKE_SPARK_MASTER"] = self.spark_master
            env.setdefault("BINLAKE_INGEST_MODE", "spark-submit")
        if self.airflow_db_url:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.airflow_db_url
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = self.airflow_db_async_url or self.airflow_db_url
            env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", None)  # SQLite's lock timeout
        if self.spark_remote:
            # The DAGs' Spark jobs run as clients of the always-on server (ingest mode `connect`).
            env["BINLAKE_SPARK_REMOTE"] = self.spark_remote
        # An idle scheduler looks for work every second by default; an ingest run is
        # five tasks one after another, each waiting for the next look, so that second
        # is paid five times between a window's close and its asset event (freshness).
        # A user's own setting wins.
        env.setdefault("AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME", "0.25")
        return env

    def _ingest_start_date(self) -> str:
        """The ingest DAG's start date: an explicit BINLAKE_INGEST_START_DATE, else the
        time of this stack's first `binlake up` (kept in its state file)."""
        explicit = config.load(config.IngestDagSettings).start_date
        if explicit is not None:
            return explicit.isoformat()
        path = self.airflow_home / STATE_FILE
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            return str(json.loads(path.read_text())["ingest_start_date"])
        now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
        # Aligned to 5 minutes, so the default schedule's windows are round.
        start = now - dt.timedelta(minutes=now.minute % 5)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"ingest_start_date": start.isoformat()}, indent=2) + "\n")
        return start.isoformat()

    def _write_env_file(self, env: dict[str, str]) -> pathlib.Path:
        """``<data>/airflow/env.sh``: source it to point the `airflow` CLI (backfill,
        dags test, variables) at this stack from another shell."""
        keys = sorted(k for k in env if k.startswith(("AIRFLOW_HOME", "AIRFLOW__", "BINLAKE_")))
        bin_dir = str(pathlib.Path(sys.executable).parent)
        lines = ["# written by `binlake up`: the environment of this stack's Airflow components",
                 f"export PATH={shlex.quote(bin_dir)}:\"$PATH\""]
        lines += [f"export {k}={shlex.quote(env[k])}" for k in keys]
        path = self.airflow_home / "env.sh"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def _run_airflow_command(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        log = self.logs / "airflow-setup.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # Its own session: a Ctrl-C during setup reaches only `binlake up`, which
        # lets the command finish and then stops the stack.
        done = subprocess.run(self._airflow(*args), env=env, capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        with log.open("a") as f:
            f.write(f"\n==== airflow {' '.join(args)} (exit {done.returncode})\n{done.stdout}{done.stderr}")
        return done

    def _start_metadata_db(self) -> str:
        """Start Airflow's PostgreSQL when the stack uses one; what the metadata is on, for the log."""
        from binlake.stack.localdb import LocalPostgres

        backend, why = airflow_db.choose(self.cfg.airflow_db, self.airflow_home)
        if backend == airflow_db.SQLITE:
            return f"SQLite {self.airflow_home / 'airflow.db'} ({why})"
        self.postgres = LocalPostgres(airflow_db.postgres_dir(self.airflow_home))
        try:
            self.postgres.start()
            self.airflow_db_url, self.airflow_db_async_url = airflow_db.postgres_urls(self.postgres)
        except errors.BinlakeError as exc:
            raise errors.FailedPrecondition(f"Airflow's PostgreSQL did not start: {exc}") from None
        return (f"PostgreSQL on 127.0.0.1:{self.postgres.port}, database {airflow_db.DATABASE} "
                f"(data {self.postgres.root_dir}, log {self.postgres.log_path})")

    def _start_airflow(self) -> None:
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        self.lake.mkdir(parents=True, exist_ok=True)
        where = self._start_metadata_db()
        env = self.airflow_env()
        self.say(f"binlake up: preparing Airflow metadata in {where}")
        done = self._run_airflow_command(env, "db", "migrate")
        if done.returncode != 0:
            raise errors.FailedPrecondition(
                f"`airflow db migrate` failed (exit {done.returncode}); see {self.logs / 'airflow-setup.log'}"
            )
        if self.airflow_db_url is None:
            # Before any Airflow process runs: readers and the one writer stop blocking
            # each other (a backfill's writes failed with "database is locked" without it).
            mode = airflow_db.use_wal(self.airflow_home / "airflow.db")
            if mode.lower() != "wal":
                self.say(f"binlake up: Airflow's SQLite database stays in journal mode {mode} (WAL refused)")
        # spark_default -> local[*], created once in the metadata DB (not through an
        # AIRFLOW_CONN_ variable) so it can be pointed at a cluster master from the UI.
        done = self._run_airflow_command(env, "connections", "add", "spark_default", "--conn-type", "spark",
                                         "--conn-host", "local[*]",
                                         "--conn-description", "binlake ingest: Spark master for spark-submit")
        if done.returncode != 0 and "already exists" not in done.stdout + done.stderr:
            raise errors.FailedPrecondition(
                f"could not create the spark_default connection; see {self.logs / 'airflow-setup.log'}"
            )
        self._write_env_file(env)
        self._wait_spark_connect()
        if self.stop_requested.is_set():
            return
        children = []
        for component in AIRFLOW_COMPONENTS:
            args = ["api-server", "--host", "127.0.0.1", "--port", str(self.cfg.airflow_port)] \
                if component == "api-server" else [component]
            child = Child(f"airflow {component}", self._airflow(*args), self.logs / f"airflow-{component}.log",
                          env=env)
            self._spawn(child)
            children.append(child)
        self.say(f"binlake up: starting Airflow ({', '.join(AIRFLOW_COMPONENTS)}); logs in {self.logs}")
        self._wait_for(self._airflow_healthy, "Airflow to become healthy", children)

    def _airflow_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.cfg.airflow_port}/api/v2/monitor/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                health = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(p) or {}).get("status") == "healthy" for p in parts)

    # ------------------------------------------------------------------ running

    def _banner(self) -> None:
        lines = ["", "binlake up: the stack is running", f"  registry     {self.registry_addr}"]
        for node_id, (addr, metrics) in self.pump_addrs.items():
            lines.append(f"  {node_id:<12} {addr}  (metrics http://{metrics}/metrics)")
        lines.append(f"  data         {self.data}  (logs in {self.logs})")
        if self.spark_remote:
            lines.append(f"  Spark        {self.spark_remote}  (Spark Connect, always on)")
        if self.spark_master:
            lines.append(f"  Spark        {self.spark_master}  (standalone cluster: spark-submit per window)")
        if self.cfg.airflow:
            env = self.airflow_env()
            lines += [
                f"  lake         {self.lake}",
                f"  Airflow UI   http://127.0.0.1:{self.cfg.airflow_port}  (local admin, no login; loopback only)",
                f"  DAG          binlake_ingest, catching up from {env['BINLAKE_INGEST_START_DATE']}",
                f"  DAG          binlake_apply: {self.apply_tasks_line()}",
                "  Airflow CLI  in another shell:",
                f"               . {self.airflow_home / 'env.sh'}",
                "               airflow backfill create --dag-id binlake_ingest --from-date ... --to-date ...",
            ]
        else:
            lines.append("  Airflow      not started (--no-airflow)")
        lines += [f"  binlake ctl pumps --registry {self.registry_addr}", "",
                  "Press Ctrl-C to stop everything (Airflow, then Spark, then the Pumps, then the registry"
                  + (", then Airflow's PostgreSQL)." if self.postgres is not None else ")."), ""]
        self.say("\n".join(lines))

    def apply_tasks_line(self) -> str:
        """Where the apply DAG finds its replication task files (its runs are skipped while
        there are none), as plugins/binlake_airflow/apply_tasks.py reads the setting."""
        explicit = config.load(config.ApplySettings).tasks
        if explicit:
            return f"task files from BINLAKE_APPLY_TASKS={explicit}"
        tasks = self.cfg.plugins_folder.resolve().parent / "config" / "tasks"
        if tasks.is_dir() and any(tasks.glob("*.toml")):
            return f"task files (*.toml) in {tasks}"
        return (f"no task file yet, its runs are skipped: put replication task files (*.toml, see "
                f"config/task.sample.toml) in {tasks}")

    def _watch(self) -> int:
        while not self.stop_requested.wait(1.0):
            if self.spark_cluster is not None and not self.spark_cluster.running:
                self.say(f"binlake up: the Spark cluster stopped; see {self.data / 'spark'}. Stopping the stack.")
                return 1
            if self.postgres is not None and not self.postgres.running:
                self.say(f"binlake up: Airflow's PostgreSQL exited; see {self.postgres.log_path}. Stopping the stack.")
                return 1
            for child in self.children:
                if not child.alive:
                    self.say(f"binlake up: {child.name} exited with status {child.returncode}; "
                             f"see {child.log_path}. Stopping the stack.")
                    return 1
        return 0

    def stop(self) -> None:
        """Stop children in reverse start order: Airflow, Spark, the Pumps, the registry, then
        Airflow's PostgreSQL."""
        running = [c for c in self.children if c.alive]
        if not running:
            if self.spark_cluster is not None:
                self.spark_cluster.stop()
                self.spark_cluster = None
            self._stop_postgres()
            return
        self.say("binlake up: stopping ...")
        airflow = [c for c in running if c.name.startswith("airflow ")]
        spark = [c for c in running if c.name == "spark-connect"]
        pumps = [c for c in running if c.name.startswith("pump")]
        registry = [c for c in running if c.name == "registry"]
        for group, grace in ((airflow, 30.0), (spark, 15.0), (pumps, 20.0), (registry, 10.0)):
            for child in group:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for child in group:
                while not child.wait(0.2):
                    if self.force.is_set() or time.monotonic() > deadline:
                        self.say(f"binlake up: {child.name} did not stop in time; killing it")
                        child.signal(signal.SIGKILL)
                        child.wait(5.0)
                        break
            for child in group:
                # Leftover grandchildren (e.g. a task's spark-submit) go with their group.
                child.signal(signal.SIGKILL)
            if group is airflow and self.spark_cluster is not None:
                # With Airflow gone no job is left to run on it.
                self.spark_cluster.stop()
                self.spark_cluster = None
        # Last: every Airflow process that wrote the metadata is gone.
        self._stop_postgres()
        self.say("binlake up: stopped")

    def _stop_postgres(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None


def parse_pump_args(text: str | None) -> list[str]:
    return shlex.split(text) if text else []
