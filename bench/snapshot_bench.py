"""``binlake bench snapshot``: a database's first day. ``binlake source mysql|postgres
--start snapshot`` of an existing database of ROWS rows in TABLES tables through two
real Pumps, the follow-up stream, ``binlake ingest`` windows, a restore at a ts of
the follow-up into PostgreSQL and ``binlake diff`` of it against the upstream, while
a workload of RATE txn/s runs on the same server throughout.

Everything binlake does here is a ``binlake`` subprocess started as a user would
(``binlake.testing.devcluster`` for the registry and the Pumps): the benchmark
does not know how the snapshot is cut into transactions or decided, only what
the command line shows.

Per database (``--db mariadb|postgres|both``), on a throwaway server of
``binlake.stack.localdb``:

* **load** (timed, not a target): TABLES tables ``t00``.. of twelve columns (bigint
  key, int, smallint, decimal, double, datetime(6), date, varchar, text, a blob of
  48 bytes, a status varchar; indexes on ``k``, ``created`` and ``(grp, day)``),
  about 300 bytes a row, filled by the server itself: ``INSERT ... SELECT`` from
  MariaDB's sequence engine with the binlog off for the session, PostgreSQL's
  ``generate_series``, never through TxnWriter. Two small workload tables beside
  them, ``wk`` and ``w``, in the snapshot too: their changes after it are the
  follow-up stream. (One source: two sources of one cluster number their tables
  alike, from 100, so the lake could not tell their tables apart.)
* **floor**: ``mariadb-dump --single-transaction`` / ``pg_dump`` of the snapshot's
  tables to /dev/null (the client binaries next to the server's), rows/s.
* **alone**: the cluster, the workload: RATE txn/s (each one row inserted and one
  updated, alternately in ``w`` and ``wk``), and the ingest loop: windows
  ``[previous end, now)`` at least ``--window-s`` long, each ``binlake ingest`` of
  it retried every second while it is refused (a Pump's safe ts below its end),
  its *freshness* the seconds from its end to its ingest's end. Two windows.
* **snapshot**: ``binlake source ... --start snapshot`` of the ``t*`` tables and
  ``wk``. It has ended when the Pumps hold all ROWS rows of ``t*`` and a workload
  transaction of ``wk`` (the follow-up stream flowing), as ``binlake ctl dump``
  shows them; its time runs from the source's spawn to the commit_ts of the later
  of the two. Upstream txn/s during it against txn/s alone; the freshness of the
  windows that overlap it against that of the windows after it (the workload
  streaming: the cluster's normal freshness). A window spans the whole cluster,
  so its freshness is that of every writer's transactions in it.
* **follow-up**: two more windows of workload after the snapshot was seen. Then the workload stops and one
  marker transaction (a delete) commits in ``wk`` and in ``w``; T = the later of
  their commit_ts, read from the Pumps with ``binlake ctl dump``. Nothing writes
  after the markers, so the upstream *now* is the upstream at T: the copy to
  compare with.
* **ingest**: the loop goes on until a window past T is in; the stage's seconds
  are the ingest runs of the windows that hold the snapshot's rows.
* **restore**: ``binlake restore --ts T --target`` a new PostgreSQL database (for
  both upstreams: MariaDB's tables are restored into PostgreSQL too).
* **diff**: ``binlake diff`` of the upstream's tables against the restored ones
  (must be equal).

Peak RSS, sampled every 0.25 s (psutil) per process tree: the snapshot's source, each Pump, the ingest runs and the restore (Python and
its Spark JVM together). Targets, printed PASS/MISS: snapshot rows/s >= 0.5 x the
dump's; freshness during the snapshot <= 2 x alone; upstream txn/s during the
snapshot >= 0.8 x alone; every peak RSS within its bound (``RSS_BOUNDS_MIB``,
documented in docs/benchmarks.md).

    binlake bench snapshot --rows 200000 --db both
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchkit import binlake_cmd, percentile

MIB = 1 << 20
SAMPLE_S = 0.25
SEED_ROWS = 1000  # rows of each workload table before anything starts
ALONE_WINDOWS = 2
DUMP_RETRIES = 10
INGEST_RETRIES = 3  # failed `binlake ingest` runs of one window (not refusals) before the loop fails  # consecutive failed `binlake ctl dump` runs before the stage fails
FOLLOW_WINDOWS = 2
# Peak RSS bounds per process (MiB), as docs/benchmarks.md states them: a source and
# a Pump hold batches, never a table (one snapshot transaction is --batch-rows rows);
# an ingest or a restore is a Python driver and a local Spark JVM of [memory] driver
# heap (2 GiB by default) plus the JVM's and Python's own.
RSS_BOUNDS_MIB = {"source": 512, "pump": 512, "ingest": 3584, "restore": 3584}
ROLES = ("source", "pump1", "pump2", "ingest", "restore")


def bound_of(role: str) -> int:
    return RSS_BOUNDS_MIB["pump" if role.startswith("pump") else "source" if "source" in role else role]


# -- the upstream's data -------------------------------------------------------------

def table_names(tables: int) -> list[str]:
    return [f"t{i:02d}" for i in range(tables)]


def split_rows(rows: int, tables: int) -> list[tuple[int, int]]:
    """Each table's ids as (first, last), inclusive: ``rows`` in all, as even as can be."""
    out, first = [], 1
    for i in range(tables):
        n = rows // tables + (1 if i < rows % tables else 0)
        out.append((first, first + n - 1))
        first += n
    return out


def load_chunks(first: int, last: int, chunk: int = 100_000) -> Iterator[tuple[int, int]]:
    """(first, last) pieces of at most ``chunk`` ids: one INSERT ... SELECT each."""
    a = first
    while a <= last:
        yield a, min(last, a + chunk - 1)
        a += chunk


MARIADB_TABLE = ("CREATE TABLE {t} (id BIGINT PRIMARY KEY, k INT NOT NULL, grp SMALLINT NOT NULL, "
                 "price DECIMAL(12,2) NOT NULL, qty INT NOT NULL, ratio DOUBLE NOT NULL, created DATETIME(6) NOT NULL, "
                 "day DATE NOT NULL, name VARCHAR(64) NOT NULL, note TEXT, payload BLOB, status VARCHAR(16) NOT NULL, "
                 "KEY k_k (k), KEY k_created (created), KEY k_grp_day (grp, day))")
MARIADB_FILL = ("INSERT INTO {t} SELECT seq, (seq * 7919) % 1000000, seq % 100, (seq % 100000) / 100, seq % 1000, "
                "(seq % 1000) * 0.25, TIMESTAMP('2025-01-01') + INTERVAL seq SECOND + INTERVAL (seq % 1000000) "
                "MICROSECOND, DATE('2024-01-01') + INTERVAL (seq % 3650) DAY, CONCAT('name-', seq, '-', MD5(seq)), "
                "REPEAT(CONCAT(MD5(seq), ' '), 4), UNHEX(CONCAT(MD5(seq), MD5(seq + 1), MD5(seq + 2))), "
                "ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'closed') FROM seq_{a}_to_{b}")
POSTGRES_TABLE = ("CREATE TABLE {t} (id BIGINT PRIMARY KEY, k INT NOT NULL, grp SMALLINT NOT NULL, "
                  "price NUMERIC(12,2) NOT NULL, qty INT NOT NULL, ratio DOUBLE PRECISION NOT NULL, "
                  "created TIMESTAMP(6) NOT NULL, day DATE NOT NULL, name VARCHAR(64) NOT NULL, note TEXT, "
                  "payload BYTEA, status VARCHAR(16) NOT NULL)")
POSTGRES_FILL = ("INSERT INTO {t} SELECT i, (i * 7919::bigint) % 1000000, i % 100, (i % 100000) / 100.0, i % 1000, "
                 "(i % 1000) * 0.25, timestamp '2025-01-01' + i * interval '1 second' + (i % 1000000) * "
                 "interval '1 microsecond', date '2024-01-01' + (i % 3650)::int, 'name-' || i || '-' || md5(i::text), "
                 "repeat(md5(i::text) || ' ', 4), decode(md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text), "
                 "'hex'), (array['new', 'paid', 'shipped', 'closed'])[1 + i % 4] FROM generate_series({a}, {b}) i")
POSTGRES_INDEXES = ("CREATE INDEX ON {t} (k)", "CREATE INDEX ON {t} (created)", "CREATE INDEX ON {t} (grp, day)",
                    "ALTER TABLE {t} REPLICA IDENTITY FULL")
WORK_TABLE = ("CREATE TABLE {t} (id BIGINT PRIMARY KEY, n INT NOT NULL, amount DECIMAL(14,2) NOT NULL, "
              "at {dt} NOT NULL, note VARCHAR(64) NOT NULL)")


class Upstream:
    """One throwaway server and its database ``bench``: the statements of the load, the
    workload and the markers, and what the CLI commands are given (DSN, flags)."""

    kind = ""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.server: Any = None

    # each kind: start, connect, dump command, source flags, url
    def start(self) -> None:
        raise NotImplementedError

    def connect(self) -> Any:
        raise NotImplementedError

    def dump_command(self) -> list[str]:
        raise NotImplementedError

    def source_args(self, which: str, tables: list[str]) -> list[str]:
        raise NotImplementedError

    def prepare_sources(self, tables: list[str]) -> None:
        """What the sources need in the server before they start (publications)."""

    def url(self) -> str:
        return str(self.server.url_for("bench"))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def load(self, tables: int, rows: int) -> None:
        raise NotImplementedError

    def data_bytes(self, tables: list[str]) -> int:
        raise NotImplementedError

    def now_sql(self) -> str:
        return "NOW(6)"


class MariaDBUpstream(Upstream):
    kind = "mariadb"

    def start(self) -> None:
        from binlake.stack.localdb import LocalMariaDB

        self.server = LocalMariaDB(self.root / "mariadb", binlog=True,
                                   extra_args=("--innodb-buffer-pool-size=512M",)).start()
        self.server.create_database("bench")

    def connect(self) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.server.port, user="root", database="bench",
                               autocommit=False, charset="utf8mb4")

    def load(self, tables: int, rows: int) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                # The load is the database's history before binlake: not in the binlog.
                cur.execute("SET SESSION sql_log_bin = 0")
                for name, (first, last) in zip(table_names(tables), split_rows(rows, tables), strict=True):
                    cur.execute(MARIADB_TABLE.format(t=name))
                    for a, b in load_chunks(first, last):
                        cur.execute(MARIADB_FILL.format(t=name, a=a, b=b))
                        conn.commit()
                for name in ("wk", "w"):
                    cur.execute(WORK_TABLE.format(t=name, dt="DATETIME(6)"))
                    cur.execute(f"INSERT INTO {name} SELECT seq, 0, seq, NOW(6), CONCAT('seed ', seq) "
                                f"FROM seq_1_to_{SEED_ROWS}")
                conn.commit()
        finally:
            conn.close()

    def data_bytes(self, tables: list[str]) -> int:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("ANALYZE TABLE " + ", ".join(tables))
                cur.fetchall()
                cur.execute("SELECT SUM(data_length) FROM information_schema.tables WHERE table_schema = 'bench' "
                            "AND table_name IN (" + ", ".join(f"'{t}'" for t in tables) + ")")
                return int(cur.fetchone()[0] or 0)
        finally:
            conn.close()

    def dump_command(self) -> list[str]:
        from binlake.stack.localdb import mariadb_client

        tool = mariadb_client(("mariadb-dump", "mysqldump"))
        if tool is None:
            raise FileNotFoundError("no mariadb-dump or mysqldump beside the server")
        return [tool, "-h127.0.0.1", f"-P{self.server.port}", "-uroot", "--single-transaction", "bench",
                *(t for t in self._snapshot_tables)]

    _snapshot_tables: list[str] = []

    def source_args(self, which: str, tables: list[str]) -> list[str]:
        self._snapshot_tables = [t for t in tables if t.startswith("t")]
        return ["mysql", "--dsn", f"mysql://root@127.0.0.1:{self.server.port}",
                "--server-id", "901",
                "--tables", ",".join(f"bench.{t}" for t in tables)]


class PostgresUpstream(Upstream):
    kind = "postgres"

    def start(self) -> None:
        from binlake.stack.localdb import LocalPostgres

        self.root.chmod(0o755)  # PostgreSQL's own user reaches its directory when this runs as root
        self.server = LocalPostgres(self.root / "pg", logical=True).start()
        self.server.create_database("bench")

    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/bench"

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn())

    def load(self, tables: int, rows: int) -> None:
        with self.connect() as conn:
            conn.autocommit = True
            for name, (first, last) in zip(table_names(tables), split_rows(rows, tables), strict=True):
                conn.execute(POSTGRES_TABLE.format(t=name))
                for a, b in load_chunks(first, last):
                    conn.execute(POSTGRES_FILL.format(t=name, a=a, b=b))
                for stmt in POSTGRES_INDEXES:
                    conn.execute(stmt.format(t=name))
            for name in ("wk", "w"):
                conn.execute(WORK_TABLE.format(t=name, dt="TIMESTAMP(6)"))
                conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
                conn.execute(f"INSERT INTO {name} SELECT i, 0, i, now(), 'seed ' || i "
                             f"FROM generate_series(1, {SEED_ROWS}) i")
            conn.execute("VACUUM ANALYZE")

    def data_bytes(self, tables: list[str]) -> int:
        with self.connect() as conn:
            row = conn.execute("SELECT SUM(pg_table_size(c.oid)) FROM pg_class c WHERE c.relname = ANY(%s) "
                               "AND c.relkind = 'r'", (tables,)).fetchone()
            return int(row[0] or 0) if row else 0

    def prepare_sources(self, tables: list[str]) -> None:
        with self.connect() as conn:
            conn.autocommit = True
            conn.execute("CREATE PUBLICATION snap_pub FOR TABLE " + ", ".join(tables))

    def dump_command(self) -> list[str]:
        from binlake.stack.localdb import pg_tool

        tool = pg_tool("pg_dump")
        if tool is None:
            raise FileNotFoundError("no pg_dump beside the PostgreSQL server")
        return [tool, "-h", "127.0.0.1", "-p", str(self.server.port), "-U", "postgres",
                *(f"--table=public.{t}" for t in self._snapshot_tables), "bench"]

    _snapshot_tables: list[str] = []

    def source_args(self, which: str, tables: list[str]) -> list[str]:
        self._snapshot_tables = [t for t in tables if t.startswith("t")]
        return ["postgres", "--dsn", self.dsn(), "--slot", "snap", "--publication", "snap_pub"]

    def now_sql(self) -> str:
        return "now()"


UPSTREAMS: dict[str, type[Upstream]] = {"mariadb": MariaDBUpstream, "postgres": PostgresUpstream}


# -- the workload ----------------------------------------------------------------------

class Workload:
    """RATE transactions/s on one connection, on a schedule (a late transaction runs at
    once, so a slow server shows as fewer of them, not as drift): transaction i inserts
    one row and updates another, in ``w`` when i is even, ``wk`` when odd. Keeps each
    commit's wall time."""

    def __init__(self, upstream: Upstream, rate: float) -> None:
        self.upstream = upstream
        self.rate = rate
        self.commits: list[float] = []
        self.latencies: list[float] = []  # seconds from each transaction's first statement to its commit
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def _run(self) -> None:
        rng = random.Random(7)
        next_id = {"w": SEED_ROWS, "wk": SEED_ROWS}
        now = self.upstream.now_sql()
        try:
            conn = self.upstream.connect()
        except Exception as exc:
            self.error = f"workload: {exc}"
            return
        began = time.monotonic()
        i = 0
        try:
            while not self._stop.is_set():
                due = began + i / self.rate
                wait = due - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    break
                table = "w" if i % 2 == 0 else "wk"
                next_id[table] += 1
                t0 = time.monotonic()
                cur = conn.cursor()
                cur.execute(f"INSERT INTO {table} VALUES ({next_id[table]}, {i}, {i % 1000}.25, {now}, 'txn {i}')")
                cur.execute(f"UPDATE {table} SET n = n + 1, amount = amount + 1 WHERE id = "
                            f"{rng.randint(2, next_id[table] - 1)}")
                conn.commit()
                self.commits.append(time.time())
                self.latencies.append(time.monotonic() - t0)
                i += 1
        except Exception as exc:  # the benchmark reports the workload's failure and goes on
            self.error = f"workload: {exc}"
        finally:
            conn.close()

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def markers(self) -> None:
        """One delete in ``wk`` and one in ``w``, after the workload stopped: the last
        upstream transactions (the workload never deletes)."""
        conn = self.upstream.connect()
        try:
            for table in ("wk", "w"):
                cur = conn.cursor()
                cur.execute(f"DELETE FROM {table} WHERE id = 1")
                conn.commit()
        finally:
            conn.close()


def p99_between(commits: list[float], latencies: list[float], start: float, end: float) -> float:
    """The 99th percentile latency (seconds) of the transactions committed in [start, end)."""
    return float(percentile(sorted(lat for t, lat in zip(commits, latencies, strict=False) if start <= t < end), 0.99))


def rate_between(commits: list[float], start: float, end: float) -> float:
    """Commits/s in [start, end) (0 for an empty interval)."""
    if end <= start:
        return 0.0
    return sum(1 for t in commits if start <= t < end) / (end - start)


# -- the Pumps, seen through `binlake ctl dump` ----------------------------------------

@dataclasses.dataclass
class PumpView:
    """What ``binlake ctl dump`` lines have shown so far: the tables' ids by name (from
    the DDL lines), the snapshot tables' rows and when the last of them committed, the
    first workload transaction of ``wk`` and the markers."""

    rows_wanted: int
    names: dict[int, str] = dataclasses.field(default_factory=dict)
    snapshot_rows: int = 0
    rows_done_ts: int = 0
    followup_ts: int = 0
    markers: dict[str, int] = dataclasses.field(default_factory=dict)
    transactions: int = 0

    def feed(self, line: dict[str, Any]) -> None:
        self.transactions += 1
        table = line.get("ddl_table")
        if table:
            self.names[int(table.get("tableId", 0))] = str(table.get("name", ""))
            return
        for m in line.get("mutations", []):
            name = self.names.get(int(m.get("table_id", 0)), "")
            if re.fullmatch(r"t\d+", name):
                self.snapshot_rows += int(m.get("inserts", 0))
                if not self.rows_done_ts and self.snapshot_rows >= self.rows_wanted:
                    self.rows_done_ts = int(line["commit_ts"])
            elif name in ("w", "wk"):
                if name == "wk" and m.get("updates") and not self.followup_ts:
                    self.followup_ts = int(line["commit_ts"])
                if m.get("deletes"):
                    self.markers[name] = int(line["commit_ts"])

    @property
    def snapshot_done_ts(self) -> int:
        """The commit_ts by which the snapshot's rows and the follow-up were both at the Pumps (0: not yet)."""
        return max(self.rows_done_ts, self.followup_ts) if self.rows_done_ts and self.followup_ts else 0

    @property
    def marker_ts(self) -> int:
        return max(self.markers.values()) if len(self.markers) == 2 else 0


# -- processes and their memory ----------------------------------------------------------

class RssSampler:
    """Peak RSS per role (a process and its children, summed) while each stage ran,
    sampled every ``SAMPLE_S`` in a thread."""

    def __init__(self) -> None:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        self._psutil = psutil
        self.pids: dict[str, int] = {}
        self.stage = ""
        self.peaks: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def watch(self, role: str, pid: int | None) -> None:
        with self._lock:
            if pid is None:
                self.pids.pop(role, None)
            else:
                self.pids[role] = pid

    def _tree_rss(self, pid: int) -> int:
        ps = self._psutil
        try:
            p = ps.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except ps.Error:
            return 0
        total = 0
        for q in procs:
            with contextlib.suppress(ps.Error):
                total += int(q.memory_info().rss)
        return total

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            with self._lock:
                pids, stage = dict(self.pids), self.stage
            for role, pid in pids.items():
                rss = self._tree_rss(pid)
                with self._lock:
                    peaks = self.peaks.setdefault(stage, {})
                    peaks[role] = max(peaks.get(role, 0), rss)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def set_stage(self, stage: str) -> None:
        with self._lock:
            self.stage = stage

    def peak(self, role: str, stages: tuple[str, ...] | None = None) -> int:
        with self._lock:
            return max((p.get(role, 0) for s, p in self.peaks.items() if stages is None or s in stages), default=0)


# -- the ingest loop -------------------------------------------------------------------

@dataclasses.dataclass
class IngestWindow:
    start_ts: int
    end_ts: int
    end_wall: float  # the wall time of end_ts
    done_wall: float = 0.0  # when its ingest ended
    run_s: float = 0.0  # the successful ingest run's seconds
    rows: int = 0  # row changes it wrote
    job_s: float = 0.0  # the ingest job's own seconds (its --json elapsed_s: without the start of Spark)
    refusals: int = 0
    failures: int = 0  # runs that failed otherwise, run again

    @property
    def freshness_s(self) -> float:
        return self.done_wall - self.end_wall


def overlaps(w: IngestWindow, start_wall: float, end_wall: float) -> bool:
    """Whether window ``w`` covers part of [start_wall, end_wall)."""
    from binlake import tso

    return tso.physical_ms(w.start_ts) / 1000 < end_wall and w.end_wall > start_wall


class IngestLoop:
    """``binlake ingest`` of consecutive windows [previous end, now), each at least
    ``window_s`` long, a refused one retried every second with the same bounds."""

    def __init__(self, lake: pathlib.Path, registry: str, master: str | None, first_ts: int, window_s: float,
                 sampler: RssSampler, log: pathlib.Path) -> None:
        self.lake, self.registry, self.master = lake, registry, master
        self.next_ts = first_ts
        self.window_s = window_s
        self.sampler = sampler
        self.log = log
        self.windows: list[IngestWindow] = []
        self.until_ts = 0  # stop once a window ending past this is in (0: go on)
        self.error = ""
        self.current: subprocess.Popen[bytes] | None = None  # the ingest running now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-loop", daemon=True)

    def _ingest(self, w: IngestWindow) -> bool:
        cmd = binlake_cmd("ingest", "--start-ts", str(w.start_ts), "--end-ts", str(w.end_ts), "--lake",
                          str(self.lake), "--registry", self.registry, "--json",
                          *(["--master", self.master] if self.master else []))
        began = time.monotonic()
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
            self.current = proc
            self.sampler.watch("ingest", proc.pid)
            out, _ = proc.communicate()
            self.sampler.watch("ingest", None)
            self.current = None
        if proc.returncode == 0:
            w.run_s = time.monotonic() - began
            w.done_wall = time.time()
            with contextlib.suppress(ValueError, IndexError):
                result = json.loads(out.decode().strip().splitlines()[-1])
                w.rows = int(result.get("rows", 0) or 0)
                w.job_s = float(result.get("elapsed_s", 0.0) or 0.0)
            return True
        if proc.returncode != 2:
            # A run that failed otherwise (its JVM not starting on a loaded machine) runs
            # again: a rerun of a window replaces exactly its rows.
            w.failures += 1
            if w.failures > INGEST_RETRIES:
                raise RuntimeError(f"binlake ingest exited {proc.returncode} {w.failures} times; see {self.log}")
            return False
        w.refusals += 1
        return False

    def _run(self) -> None:
        from binlake import tso

        try:
            while not self._stop.is_set():
                end_wall = time.time()
                if tso.compose(int(end_wall * 1000)) <= self.next_ts:
                    # The first window, begun in this very millisecond: an empty window is refused
                    # (exit 2, as a refusal), and retried with the same bounds it never would pass.
                    self._stop.wait(0.01)
                    continue
                w = IngestWindow(self.next_ts, tso.compose(int(end_wall * 1000)), end_wall)
                while not self._ingest(w):
                    if self._stop.wait(1.0):
                        return
                self.windows.append(w)
                self.next_ts = w.end_ts
                if self.until_ts and w.end_ts > self.until_ts:
                    return
                self._stop.wait(max(0.0, end_wall + self.window_s - time.time()))
        except Exception as exc:  # the benchmark reports the loop's failure
            self.error = str(exc)

    def start(self) -> IngestLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop now: an ingest still running is ended (a rerun of its window
        replaces exactly its rows)."""
        self._stop.set()
        proc = self.current
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        self._thread.join(60)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait_windows(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.windows) < count:
            if self.error or time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"ingest loop: {self.error or 'no window within the time allowed'}")
            time.sleep(0.5)


# -- the run of one database ---------------------------------------------------------------

@dataclasses.dataclass
class Stage:
    name: str
    seconds: float | None
    rows: int = 0
    nbytes: int = 0
    rss: dict[str, int] = dataclasses.field(default_factory=dict)
    note: str = ""


@dataclasses.dataclass
class DbResult:
    kind: str
    rows: int
    nbytes: int
    stages: list[Stage]
    rate_alone: float = 0.0
    rate_snapshot: float = 0.0
    p99_alone: float = 0.0  # seconds
    p99_snapshot: float = 0.0
    fresh_alone: float = 0.0
    fresh_snapshot: float = 0.0
    diff_ok: bool = False
    error: str = ""

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)


def watch_pumps(registry: str, view: PumpView, start_ts: int, until: Callable[[PumpView], bool],
                timeout_s: float, log: pathlib.Path) -> None:
    """Feed ``view`` the Pumps' transactions from ``start_ts`` on, with ``binlake ctl dump
    --wait`` of [previous end, now) every second, until ``until(view)``."""
    from binlake import tso

    deadline = time.monotonic() + timeout_s
    a = start_ts
    while not until(view):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Pumps did not show it within {timeout_s:.0f}s; see {log}")
        time.sleep(1.0)
        b = tso.compose(int(time.time() * 1000))
        with open(log, "ab") as err:
            res = subprocess.run(binlake_cmd("ctl", "dump", "--registry", registry, "--start-ts", str(a),
                                             "--end-ts", str(b), "--wait"), stdout=subprocess.PIPE, stderr=err,
                                 timeout=max(60.0, deadline - time.monotonic()))
        if res.returncode != 0:
            # A Pump whose safe ts stays below the end for --wait's time (the whole snapshot
            # on a protocol that holds it), or too busy to answer: the same window again, from
            # where the last complete read ended, until the deadline.
            continue
        for text in res.stdout.decode().splitlines():
            if text.startswith("{"):
                view.feed(json.loads(text))
        a = b


def start_source(up: Upstream, which: str, tables: list[str], registry: str, root: pathlib.Path,
                 batch_rows: int, max_rows_per_s: float = 0.0) -> subprocess.Popen[bytes]:
    args = binlake_cmd("source", *up.source_args(which, tables), "--registry", registry, "--start", "snapshot",
                       "--snapshot-batch-rows", str(batch_rows), "--snapshot-max-rows-per-s", str(max_rows_per_s),
                       "--data-dir", str(root / f"source-{which}"))
    with open(root / f"source-{which}.log", "ab") as log:  # the child has its own copy of the descriptor
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_proc(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def timed_run(cmd: list[str], sampler: RssSampler | None, role: str, log: pathlib.Path,
              stdout: Any = subprocess.DEVNULL) -> tuple[float, int]:
    """Run ``cmd`` to its end: (seconds, exit status), its tree's RSS sampled as ``role``."""
    began = time.monotonic()
    with open(log, "ab") as err:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=err, start_new_session=True)
        if sampler is not None:
            sampler.watch(role, proc.pid)
        proc.wait()
        if sampler is not None:
            sampler.watch(role, None)
    return time.monotonic() - began, proc.returncode


def run_db(kind: str, args: argparse.Namespace, root: pathlib.Path) -> DbResult:
    from binlake import tso
    from binlake.stack.localdb import LocalPostgres
    from binlake.testing.devcluster import DevCluster

    up = UPSTREAMS[kind](root)
    names = table_names(args.tables)
    snap_tables = [*names, "wk", "w"]
    res = DbResult(kind, args.rows, 0, [])
    cluster: DevCluster | None = None
    sources: list[subprocess.Popen[bytes]] = []
    workload: Workload | None = None
    loop: IngestLoop | None = None
    restored: LocalPostgres | None = None  # the restores' PostgreSQL: a second server, not the upstream
    sampler = RssSampler().start()

    def say(message: str) -> None:
        print(f"[{kind} {time.strftime('%H:%M:%S')}] {message}", flush=True)

    try:
        up.start()
        say(f"loading {args.rows:,} rows into {args.tables} tables ...")
        began = time.monotonic()
        up.load(args.tables, args.rows)
        res.nbytes = up.data_bytes(names)
        res.stages.append(Stage("load (the server's INSERT ... SELECT)", time.monotonic() - began, args.rows,
                                res.nbytes))
        say(f"loaded in {res.stages[-1].seconds:.0f}s, {res.nbytes / MIB:,.0f} MiB of table data")
        up.source_args("snapshot", snap_tables)  # the dump's tables
        secs, rc = timed_run(up.dump_command(), None, "", root / "dump.log")
        name = "floor: mariadb-dump --single-transaction" if kind == "mariadb" else "floor: pg_dump"
        res.stages.append(Stage(name, secs if rc == 0 else None, args.rows, res.nbytes,
                                note="" if rc == 0 else f"exit {rc}, see dump.log"))
        say(f"{name}: {secs:.1f}s")
        up.prepare_sources(snap_tables)

        cluster = DevCluster(root / "cluster", pumps=2).start()
        for node_id, svc in cluster.pumps.items():
            sampler.watch(node_id, svc.proc.pid if svc.proc else None)
        first_ts = tso.compose(int(time.time() * 1000))
        sampler.set_stage("alone")
        workload = Workload(up, args.rate).start()
        loop = IngestLoop(root / "lake", cluster.registry_addr, args.master, first_ts, args.window_s, sampler,
                          root / "ingest.log").start()
        say(f"cluster up; workload at {args.rate:g} txn/s; waiting for {ALONE_WINDOWS} windows alone ...")
        alone_start_wall = time.time()
        loop.wait_windows(ALONE_WINDOWS, 900)

        sampler.set_stage("snapshot")
        snap_start_wall = time.time()
        src = start_source(up, "snapshot", snap_tables, cluster.registry_addr, root, args.batch_rows,
                           args.max_rows_per_s)
        sources.append(src)
        sampler.watch("source", src.pid)
        say("snapshot source started ...")
        view = PumpView(args.rows)
        watch_pumps(cluster.registry_addr, view, first_ts,
                    lambda v: bool(v.snapshot_done_ts) or src.poll() is not None, 6 * 3600, root / "dump.log")
        if not view.snapshot_done_ts:
            raise RuntimeError(f"the snapshot's source exited {src.returncode}; see {root / 'source-snapshot.log'}")
        snap_end_wall = tso.physical_ms(view.snapshot_done_ts) / 1000
        snap_s = snap_end_wall - snap_start_wall
        res.stages.append(Stage("snapshot -> 2 Pumps", snap_s, args.rows, res.nbytes,
                                note=f"{view.snapshot_rows:,} rows at the Pumps"))
        say(f"snapshot at the Pumps after {snap_s:.1f}s")

        sampler.set_stage("follow-up")
        seen = len(loop.windows)
        follow_began = time.time()
        loop.wait_windows(seen + FOLLOW_WINDOWS, 1800)
        workload.stop()
        workload.markers()
        follow_txns = sum(1 for t in workload.commits if t >= snap_end_wall)
        watch_pumps(cluster.registry_addr, view, tso.compose(int(snap_end_wall * 1000)),
                    lambda v: bool(v.marker_ts), 600, root / "dump.log")
        ts = view.marker_ts
        res.stages.append(Stage("follow-up stream (workload)", time.time() - follow_began, follow_txns,
                                note="upstream txns after the snapshot"))
        say(f"workload stopped; markers at ts {ts} ({tso.iso(ts, millis=True)})")
        sampler.set_stage("ingest")
        loop.until_ts = ts
        if not loop.join(1800):
            raise RuntimeError("the ingest loop did not pass the markers within 30 minutes")
        if loop.error:
            raise RuntimeError(f"ingest loop: {loop.error}")
        res.rate_alone = rate_between(workload.commits, alone_start_wall, snap_start_wall)
        res.rate_snapshot = rate_between(workload.commits, snap_start_wall, snap_end_wall)
        res.p99_alone = p99_between(workload.commits, workload.latencies, alone_start_wall, snap_start_wall)
        res.p99_snapshot = p99_between(workload.commits, workload.latencies, snap_start_wall, snap_end_wall)
        # Normal: the windows after the snapshot, the workload streaming through the source.
        normal = [w for w in loop.windows if tso.physical_ms(w.start_ts) / 1000 >= snap_end_wall
                  and w.end_ts <= ts]
        during = [w for w in loop.windows if overlaps(w, snap_start_wall, snap_end_wall)]
        res.fresh_alone = sum(w.freshness_s for w in normal) / max(1, len(normal))
        res.fresh_snapshot = max((w.freshness_s for w in during), default=0.0)
        big = [w for w in loop.windows if w.end_wall > snap_start_wall]
        res.stages.append(Stage("ingest (windows from the snapshot on)", sum(w.run_s for w in big),
                                sum(w.rows for w in big), res.nbytes,
                                note=f"{len(big)} windows, {sum(w.refusals for w in big)} refusals retried; "
                                     f"the jobs alone (without Spark's start) {sum(w.job_s for w in big):.1f}s"))
        print_windows(kind, loop.windows, snap_start_wall, snap_end_wall)

        sampler.set_stage("restore")
        root.chmod(0o755)
        restored = LocalPostgres(root / "restored-pg").start()
        restored_url = restored.create_database(f"restored_{kind}")
        secs, rc = timed_run(binlake_cmd("restore", "--lake", str(root / "lake"), "--ts", str(ts), "--target",
                                         restored_url, "--json", *(["--master", args.master] if args.master else [])),
                             sampler, "restore", root / "restore.log")
        res.stages.append(Stage("restore at T -> PostgreSQL", secs if rc == 0 else None, args.rows, res.nbytes,
                                note="" if rc == 0 else f"exit {rc}, see restore.log"))
        say(f"restore: {secs:.1f}s (exit {rc})")
        sampler.set_stage("diff")
        tables = ",".join(snap_tables)
        with open(root / "diff.out", "wb") as out:
            secs, rc = timed_run(binlake_cmd("diff", up.url(), restored_url, "--tables", tables), None, "",
                                 root / "diff.log", stdout=out)
        res.diff_ok = rc == 0
        res.stages.append(Stage("diff upstream vs restored", secs, args.rows, res.nbytes,
                                note="equal" if rc == 0 else f"NOT equal (exit {rc}), see diff.out"))
        say(f"diff: {secs:.1f}s, {'equal' if rc == 0 else 'NOT equal'}")
        stage_of = {"snapshot -> 2 Pumps": ("snapshot",), "follow-up stream (workload)": ("follow-up",),
                    "ingest (windows from the snapshot on)": ("snapshot", "follow-up", "ingest"),
                    "restore at T -> PostgreSQL": ("restore",)}
        for s in res.stages:
            if s.name in stage_of:
                s.rss = {r: sampler.peak(r, stage_of[s.name]) for r in ROLES}
    except Exception as exc:  # the benchmark reports what failed and goes on to the next database
        res.error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
        say(f"FAILED: {res.error}")
    finally:
        if workload is not None:
            workload.stop()
            if workload.error and not res.error:
                res.error = workload.error
        if loop is not None:
            loop.stop()
        for p in sources:
            stop_proc(p)
        if cluster is not None:
            cluster.stop()
        sampler.stop()
        if restored is not None:
            restored.stop()
        up.stop()
    return res


# -- report ------------------------------------------------------------------------------

def print_windows(kind: str, windows: list[IngestWindow], snap_start: float, snap_end: float) -> None:
    print(f"\n{kind}: ingest windows (freshness = its ingest's end - its end)")
    print("| window | seconds long | during the snapshot | refusals | ingest s | job s | row changes | freshness s |")
    print("|---:|---:|:---:|---:|---:|---:|---:|---:|")
    from binlake import tso

    for i, w in enumerate(windows):
        length = w.end_wall - tso.physical_ms(w.start_ts) / 1000
        print(f"| {i} | {length:.1f} | {'yes' if overlaps(w, snap_start, snap_end) else ''} | {w.refusals} | "
              f"{w.run_s:.1f} | {w.job_s:.1f} | {w.rows:,} | {w.freshness_s:.1f} |")
    print(flush=True)


def _mib(n: int) -> str:
    return f"{n / MIB:,.0f}" if n else "-"


def stage_table(r: DbResult) -> list[str]:
    head = "| stage | seconds | rows/s | MiB/s | " + " | ".join(f"peak RSS {role} MiB" for role in ROLES) + " | note |"
    lines = [head, "|---|" + "---:|" * (3 + len(ROLES)) + "---|"]
    for s in r.stages:
        if s.seconds is None:
            lines.append(f"| {s.name} | - | - | - | " + " | ".join("-" for _ in ROLES) + f" | {s.note} |")
            continue
        sec = max(s.seconds, 1e-9)
        rows_s = f"{s.rows / sec:,.0f}" if s.rows else "-"
        mib_s = f"{s.nbytes / MIB / sec:,.1f}" if s.nbytes else "-"
        lines.append(f"| {s.name} | {s.seconds:.1f} | {rows_s} | {mib_s} | "
                     + " | ".join(_mib(s.rss.get(role, 0)) for role in ROLES) + f" | {s.note} |")
    return lines


def targets(r: DbResult) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for one database's run."""
    out: list[tuple[str, str, bool]] = []
    snap, floor = r.stage("snapshot -> 2 Pumps"), next((s for s in r.stages if s.name.startswith("floor")), None)
    if snap and floor and snap.seconds and floor.seconds:
        ratio = (r.rows / snap.seconds) / (r.rows / floor.seconds)
        out.append(("snapshot rows/s >= 0.5 x the dump's", f"{ratio:.2f}", ratio >= 0.5))
    if r.fresh_alone:
        ratio = r.fresh_snapshot / r.fresh_alone
        out.append(("freshness during the snapshot <= 2 x after it",
                    f"{r.fresh_snapshot:.1f}s / {r.fresh_alone:.1f}s = {ratio:.2f}", ratio <= 2.0))
    if r.rate_alone:
        ratio = r.rate_snapshot / r.rate_alone
        out.append(("upstream txn/s during the snapshot >= 0.8 x alone",
                    f"{r.rate_snapshot:.0f} / {r.rate_alone:.0f} = {ratio:.2f} (p99 commit "
                    f"{r.p99_snapshot * 1000:.0f} ms / {r.p99_alone * 1000:.0f} ms)", ratio >= 0.8))
    for role in ROLES:
        peak = max((s.rss.get(role, 0) for s in r.stages), default=0)
        if peak:
            out.append((f"peak RSS {role} <= {bound_of(role):,} MiB", f"{peak / MIB:,.0f} MiB",
                        peak <= bound_of(role) * MIB))
    out.append(("restore at T equals the upstream (binlake diff)", "equal" if r.diff_ok else "not equal", r.diff_ok))
    return out


def report(results: list[DbResult], args: argparse.Namespace) -> None:
    print(f"\n`binlake bench snapshot --rows {args.rows} --tables {args.tables} --rate {args.rate:g} "
          f"--batch-rows {args.batch_rows} --max-rows-per-s {args.max_rows_per_s:g} --db {args.db}` "
          f"(load average {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores)")
    for r in results:
        print(f"\n{r.kind}: {r.rows:,} rows, {r.nbytes / MIB:,.0f} MiB of table data" +
              (f" — FAILED: {r.error}" if r.error else ""))
        print()
        print("\n".join(stage_table(r)))
        print()
        print("| target | measured | |")
        print("|---|---|---|")
        for name, measured, ok in targets(r):
            print(f"| {name} | {measured} | {'PASS' if ok else 'MISS'} |")


def main(args: argparse.Namespace) -> int:
    from binlake import errors

    try:
        import psutil  # noqa: F401
    except ImportError:
        raise errors.FailedPrecondition("bench snapshot samples memory with psutil: pip install psutil") from None
    kinds = ["mariadb", "postgres"] if args.db == "both" else [args.db]
    from binlake.stack.localdb import LocalMariaDB, LocalPostgres

    if "mariadb" in kinds and not LocalMariaDB.available():
        raise errors.FailedPrecondition("bench snapshot --db mariadb needs MariaDB: apt-get install mariadb-server")
    if not LocalPostgres.available():
        raise errors.FailedPrecondition("bench snapshot restores into PostgreSQL: apt-get install postgresql")
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="snapshot-bench-", dir=pathlib.Path(__file__).parent))
    root.mkdir(parents=True, exist_ok=True)
    print(f"scratch: {root}", flush=True)
    results = []
    try:
        for kind in kinds:
            d = root / kind
            d.mkdir(parents=True, exist_ok=True)
            results.append(run_db(kind, args, d))
        report(results, args)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if all(not r.error for r in results) else 1
