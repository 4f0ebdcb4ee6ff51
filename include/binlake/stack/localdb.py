"""Database servers as local processes: PostgreSQL and MariaDB.

``binlake up`` runs Airflow's metadata database on ``LocalPostgres``; the tests,
the demo and the benchmarks need real upstream/target databases but no service
manager: ``LocalPostgres(root)`` and ``LocalMariaDB(root)``
create a data directory under ``root``, start the server on a free loopback
TCP port with its log in ``root``, wait until it accepts connections, and stop
it gracefully (then by force). They use the Debian packages' binaries
(``apt-get install postgresql mariadb-server``); ``available()`` says whether
they are installed, so callers can skip instead of fail.

    with LocalPostgres(tmp / "pg") as pg:
        url = pg.create_database("app")   # postgresql+psycopg://postgres@127.0.0.1:PORT/app

Durability settings stay at the servers' safe defaults (fsync on, InnoDB
flush at every commit): binlake's crash tests reason about what a committed
upstream transaction guarantees, so the servers must keep that promise.
"""

from __future__ import annotations

import atexit
import glob
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Self

from binlake import errors
from binlake.net import free_port
from binlake.stack import procs

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# A free port is found by binding port 0 and releasing it; another process can
# take it before the server binds. Retry start-up on a new port that often.
_PORT_ATTEMPTS = 3
_DB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _is_root() -> bool:
    return os.geteuid() == 0


def _which(names: tuple[str, ...], extra_dirs: tuple[str, ...] = ()) -> str | None:
    """The first of ``names`` found on PATH or in ``extra_dirs`` (sbin is often not on a user's PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra_dirs])
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def _tail(path: pathlib.Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class _LocalServer:
    """Common life cycle: init the data dir once, start on a free port, wait, stop."""

    kind = "server"
    log_name = "server.log"
    # Log lines meaning "the port was taken between free_port() and bind".
    _port_taken = ("Address already in use", "could not bind", "Can't start server: Bind on TCP/IP port")

    def __init__(self, root_dir: str | os.PathLike[str], *, port: int | None = None) -> None:
        self.root_dir = pathlib.Path(root_dir).absolute()
        self.log_path = self.root_dir / self.log_name
        self._fixed_port = port
        self.port = port or 0
        self.proc: subprocess.Popen[bytes] | None = None

    # -- what subclasses provide
    @classmethod
    def available(cls) -> bool:
        raise NotImplementedError

    def _init_data_dir(self) -> None:
        raise NotImplementedError

    def _server_command(self) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _ping(self) -> None:
        """Connect and run a trivial query; raise if the server does not answer."""
        raise NotImplementedError

    def _execute_admin(self, sql: str) -> None:
        raise NotImplementedError

    def url_for(self, database: str | None) -> str:
        raise NotImplementedError

    _graceful_signal = signal.SIGTERM

    # -- life cycle
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the server's default database, as its superuser."""
        if not self.running:
            raise errors.FailedPrecondition(f"{self.kind} under {self.root_dir} is not running; call start()")
        return self.url_for(None)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Self:
        if self.running:
            return self
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self._init_data_dir()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self.port = self._fixed_port or free_port()
            log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
            with self.log_path.open("ab") as log:
                log.write(f"\n--- binlake.stack.localdb: starting {self.kind} on 127.0.0.1:{self.port}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    self._server_command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    # Own session: a Ctrl-C aimed at the test run must not kill the
                    # server before the run's teardown has used and stopped it.
                    start_new_session=True, **self._popen_kwargs(),
                )
            # A leaked server (a test run that dies without teardown) must not outlive us.
            atexit.register(self.stop)
            try:
                self._wait_ready(timeout_s)
                return self
            except errors.BinlakeError:
                self.stop()
                new_log = self.log_path.read_text(errors="replace")[log_size:] if self.log_path.exists() else ""
                if self._fixed_port is None and attempt < _PORT_ATTEMPTS and any(
                    s in new_log for s in self._port_taken
                ):
                    continue
                raise
        raise AssertionError("unreachable")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no attempt yet"
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise errors.Unavailable(
                    f"{self.kind} exited with code {code} during start-up; log {self.log_path}:\n"
                    f"{_tail(self.log_path)}"
                )
            try:
                self._ping()
                return
            except Exception as exc:  # any driver error means "not ready yet"
                last = f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            if time.monotonic() > deadline:
                raise errors.Unavailable(
                    f"{self.kind} did not accept connections on 127.0.0.1:{self.port} within {timeout_s:g}s "
                    f"(last error: {last}); log {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.1)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Graceful shutdown; SIGKILL if the server has not exited within ``timeout_s``."""
        atexit.unregister(self.stop)
        if self.proc is None:
            return
        # Past the timeout the whole session is killed: PostgreSQL's backends and MariaDB's helpers too.
        procs.stop_group(self.proc, self._graceful_signal, timeout_s)
        self.proc = None

    def create_database(self, name: str) -> str:
        """Create database ``name`` (an identifier: letters, digits, _) and return its URL."""
        if not isinstance(name, str) or not _DB_NAME.match(name):
            raise errors.InvalidArgument(
                f"database name {name!r} must be letters, digits and _ (not starting with a digit), at most 63 chars"
            )
        if not self.running:
            raise errors.FailedPrecondition(f"{self.kind} under {self.root_dir} is not running; call start()")
        self._execute_admin(self._create_database_sql(name))
        return self.url_for(name)

    def _create_database_sql(self, name: str) -> str:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port {self.port}" if self.running else "stopped"
        return f"{type(self).__name__}({str(self.root_dir)!r}, {state})"


# ---------------------------------------------------------------------------- PostgreSQL

_PG_USER = "postgres"  # the system user the Debian package creates; also our superuser name


def _pg_bin_dir() -> pathlib.Path | None:
    """Directory holding initdb, postgres and pg_ctl of one PostgreSQL version.

    Debian keeps them in /usr/lib/postgresql/<major>/bin (off PATH); a PATH entry
    may be a symlink into it, so resolve it to keep the three binaries matched."""
    candidates: list[pathlib.Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(pathlib.Path(on_path).resolve().parent)

    def major(p: str) -> int:
        m = re.search(r"/postgresql/(\d+)/bin/", p)
        return int(m.group(1)) if m else -1

    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=major, reverse=True):
        candidates.append(pathlib.Path(found).parent)
    for d in candidates:
        if all(os.access(d / b, os.X_OK) for b in ("initdb", "postgres")):
            return d
    return None


def pg_tool(name: str) -> str | None:
    """A PostgreSQL client program (pg_dump, psql, ...) of the version whose server
    ``LocalPostgres`` runs (None: not installed beside it)."""
    d = _pg_bin_dir()
    path = d / name if d is not None else None
    return str(path) if path is not None and os.access(path, os.X_OK) else None


class LocalPostgres(_LocalServer):
    """A PostgreSQL server in ``root_dir`` (data in ``data/``, socket in ``sock/``, log ``postgres.log``).

    Superuser ``postgres``, trust authentication on loopback and the socket:
    this is a throwaway server for one machine's tests, never a deployment."""

    kind = "PostgreSQL"
    log_name = "postgres.log"
    # Fast shutdown: roll back open sessions and stop cleanly (a smart shutdown
    # would wait for every pooled connection to go away).
    _graceful_signal = signal.SIGINT

    def __init__(self, root_dir: str | os.PathLike[str], *, port: int | None = None, logical: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(root_dir, port=port)
        self.data_dir = self.root_dir / "data"
        self.socket_dir = self.root_dir / "sock"
        self._bin = _pg_bin_dir()
        # logical=True: wal_level=logical with room for replication slots and
        # WAL senders, as a logical-decoding source needs (binlake.source.postgres).
        self.logical = logical
        self.extra_args = tuple(extra_args)

    @classmethod
    def available(cls) -> bool:
        if _pg_bin_dir() is None:
            return False
        # As root, the server must run as the package's system user.
        return not _is_root() or _has_user(_PG_USER)

    def startable(self) -> str:
        """'' when this server can start here; else why not, in one line (no binaries,
        or, as root, a root dir the ``postgres`` user cannot reach)."""
        try:
            self._require_bin()
            if _is_root():
                if not _has_user(_PG_USER):
                    return f"running as root, and there is no {_PG_USER} system user for PostgreSQL to run as"
                _check_reachable(self.root_dir, pwd.getpwnam(_PG_USER))
        except errors.FailedPrecondition as exc:
            return str(exc)
        return ""

    def _require_bin(self) -> pathlib.Path:
        if self._bin is None:
            raise errors.FailedPrecondition(
                "PostgreSQL server binaries (initdb, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; "
                "install them with: apt-get install postgresql"
            )
        return self._bin

    def _popen_kwargs(self) -> dict[str, Any]:
        # PostgreSQL refuses to run as root. Switch user in the child itself
        # rather than through a `runuser` wrapper: the server is then our direct
        # child, so shutdown signals reach it unchanged (runuser's watching parent
        # turns any signal into SIGTERM and a SIGKILL two seconds later).
        if not _is_root():
            return {}
        pw = pwd.getpwnam(_PG_USER)
        env = {**os.environ, "HOME": pw.pw_dir, "USER": _PG_USER, "LOGNAME": _PG_USER}
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "env": env, "cwd": str(self.root_dir)}

    def _run_tool(self, args: list[str], what: str) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n--- binlake.stack.localdb: {' '.join(args)}\n".encode())
            log.flush()
            res = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=START_TIMEOUT_S, **self._popen_kwargs())
        if res.returncode != 0:
            raise errors.FailedPrecondition(
                f"{what} failed with code {res.returncode}; log {self.log_path}:\n{_tail(self.log_path)}"
            )

    def _init_data_dir(self) -> None:
        bindir = self._require_bin()
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.touch(exist_ok=True)
        if _is_root():
            pw = pwd.getpwnam(_PG_USER)
            _check_reachable(self.root_dir, pw)
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            for p in (self.data_dir, self.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            return  # initialised by an earlier start(): keep its data
        self._run_tool(
            [str(bindir / "initdb"), "-D", str(self.data_dir), "-U", _PG_USER, "--auth=trust",
             "--encoding=UTF8", "--locale=C",
             # A throwaway cluster: skip initdb's own fsync of every template file
             # (seconds on a slow disk); the server itself runs with fsync on.
             "--no-sync"],
            "initdb",
        )

    def _server_command(self) -> list[str]:
        bindir = self._require_bin()
        return [
            str(bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port), "-k", str(self.socket_dir),
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on",
            # Each TxnWriter pools up to 32 connections; several writers share a server in tests.
            "-c", "max_connections=300",
            *(["-c", "wal_level=logical", "-c", "max_replication_slots=16", "-c", "max_wal_senders=16"]
              if self.logical else []),
            *self.extra_args,
        ]

    def url_for(self, database: str | None) -> str:
        return f"postgresql+psycopg://{_PG_USER}@127.0.0.1:{self.port}/{database or 'postgres'}"

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=_PG_USER, dbname="postgres",
                               connect_timeout=2, autocommit=True)

    def _ping(self) -> None:
        with self._connect() as conn:
            conn.execute("SELECT 1")

    def _execute_admin(self, sql: str) -> None:
        # CREATE DATABASE cannot run inside a transaction block: autocommit.
        with self._connect() as conn:
            conn.execute(sql)

    def _create_database_sql(self, name: str) -> str:
        return f'CREATE DATABASE "{name}" ENCODING \'UTF8\' TEMPLATE template0'


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _check_reachable(path: pathlib.Path, pw: pwd.struct_passwd) -> None:
    """Refuse early, with a clear message, if ``pw``'s user cannot traverse to ``path``
    (pytest's and mkdtemp's directories are 0700 root: the server could not even start)."""
    blocked = []
    p = path
    while True:
        try:
            st = p.stat()
        except FileNotFoundError:
            st = None
        if st is not None:
            if st.st_uid == pw.pw_uid:
                ok = bool(st.st_mode & 0o100)
            elif st.st_gid == pw.pw_gid:
                ok = bool(st.st_mode & 0o010)
            else:
                ok = bool(st.st_mode & 0o001)
            if not ok:
                blocked.append(str(p))
        if p.parent == p:
            break
        p = p.parent
    if blocked:
        raise errors.FailedPrecondition(
            f"PostgreSQL runs as user {pw.pw_name} (it refuses root), who cannot enter {', '.join(blocked)}; "
            f"put the server's root dir {path} under a directory others may traverse (chmod o+x), e.g. one "
            "made with tempfile.mkdtemp() and chmod 0o755"
        )


# ---------------------------------------------------------------------------- MariaDB


def _mariadb_bins() -> tuple[str | None, str | None]:
    sbin = ("/usr/sbin", "/usr/local/sbin", "/usr/bin")
    server = _which(("mariadbd", "mysqld"), sbin)
    install = _which(("mariadb-install-db", "mysql_install_db"), sbin)
    return server, install


def mariadb_client(names: tuple[str, ...]) -> str | None:
    """The first of ``names`` (e.g. mariadb-dump, mysqldump) beside the server binary
    ``LocalMariaDB`` runs, else on PATH (None: neither)."""
    server, _install = _mariadb_bins()
    near = (str(pathlib.Path(server).parent.parent / "bin"), str(pathlib.Path(server).parent)) if server else ()
    return _which(names, near)


class LocalMariaDB(_LocalServer):
    """A MariaDB server in ``root_dir`` (data in ``data/``, socket ``mysqld.sock``, log ``mariadb.log``).

    User ``root`` with an empty password over TCP (real grant tables, not
    --skip-grant-tables, so privileges behave as in a deployment)."""

    kind = "MariaDB"
    log_name = "mariadb.log"
    _graceful_signal = signal.SIGTERM  # mariadbd's normal shutdown

    def __init__(self, root_dir: str | os.PathLike[str], *, port: int | None = None, binlog: bool = False,
                 server_id: int = 1, binlog_format: str = "ROW", extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(root_dir, port=port)
        self.data_dir = self.root_dir / "data"
        self.socket_path = self.root_dir / "mysqld.sock"
        self._server, self._install = _mariadb_bins()
        # binlog=True: a replication primary as binlake's row-binlog source reads
        # it: log-bin in data/, the given format (ROW unless a test wants to see
        # another refused), full row images and this server id.
        self.binlog = binlog
        self.server_id = server_id
        self.binlog_format = binlog_format
        self.extra_args = tuple(extra_args)

    @classmethod
    def available(cls) -> bool:
        server, install = _mariadb_bins()
        return server is not None and install is not None

    def _require_bins(self) -> tuple[str, str]:
        if self._server is None or self._install is None:
            raise errors.FailedPrecondition(
                "MariaDB server binaries (mariadbd, mariadb-install-db) not found on PATH or in /usr/sbin; "
                "install them with: apt-get install mariadb-server"
            )
        return self._server, self._install

    def _user_args(self) -> list[str]:
        # mariadbd refuses to run as root unless told to; as any other user it
        # simply runs as that user.
        return ["--user=root"] if _is_root() else []

    def _init_data_dir(self) -> None:
        _server, install = self._require_bins()
        if (self.data_dir / "mysql").is_dir():
            return  # initialised by an earlier start(): keep its data
        args = [
            # --no-defaults must come first: never read /etc/mysql's config.
            install, "--no-defaults", f"--datadir={self.data_dir}", "--auth-root-authentication-method=normal",
            "--skip-test-db", "--skip-name-resolve", *self._user_args(),
        ]
        with self.log_path.open("ab") as log:
            log.write(f"\n--- binlake.stack.localdb: {' '.join(args)}\n".encode())
            log.flush()
            res = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=START_TIMEOUT_S)
        if res.returncode != 0:
            raise errors.FailedPrecondition(
                f"mariadb-install-db failed with code {res.returncode}; log {self.log_path}:\n{_tail(self.log_path)}"
            )

    def _server_command(self) -> list[str]:
        server, _install = self._require_bins()
        return [
            server, "--no-defaults", f"--datadir={self.data_dir}", f"--socket={self.socket_path}",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--pid-file={self.root_dir / 'mariadbd.pid'}",
            *self._user_args(),
            "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=1",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_bin",
            # Naive DATETIMEs are UTC in binlake's codec; keep the server in UTC too.
            "--default-time-zone=+00:00",
            "--max-connections=300",
            *([f"--log-bin={self.data_dir / 'binlog'}", f"--binlog-format={self.binlog_format}",
               "--binlog-row-image=FULL", f"--server-id={self.server_id}", "--log-slave-updates=0"]
              if self.binlog else []),
            *self.extra_args,
        ]

    def url_for(self, database: str | None) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database or ''}?charset=utf8mb4"

    def _connect(self) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="", connect_timeout=2,
                               autocommit=True, charset="utf8mb4")

    def _ping(self) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
        finally:
            conn.close()

    def _execute_admin(self, sql: str) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def _create_database_sql(self, name: str) -> str:
        return f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
