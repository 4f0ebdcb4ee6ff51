"""Source benchmark: row changes/s the MariaDB row-binlog source decodes and
writes to one Pump (with the native row decoder and forced onto the Python
path, same binlog), against ``mysqlbinlog --verbose`` decoding the same binlog
files in the same run (the decoding limit), and the upstream's own throughput
with the source following it versus not (its overhead on the application).

Setup per run: a throwaway MariaDB (log-bin, ROW, FULL images), a registry,
one Pump and the source, each a child process (``binlake registry``,
``binlake pump``, ``binlake source mysql``) as in a deployment, so none of
them shares an interpreter (a GIL) with the workload's client in this
process. The data: a sysbench-like table filled by ``INSERT ... SELECT`` in
transactions of ``--rows-per-txn`` rows until ``--rows`` row changes are in
the binlog.

The bulk case runs the source three ways: natively framed (``_framec``) with
the native row decoder (the default when built), on mysql-replication's own
stream framing with the native rows (``BINLAKE_NATIVE_FRAMING=0``), and on the
Python path for both. Each bulk time runs from the source's spawn to its
checkpoint at the binlog's end, so it includes the process's start-up once;
the same run also times that start-up alone (the source started at the
binlog's end, twice) and reports each bulk case after it too. The headline
is the steady rate: row changes/s from the first group of the binlog's
transactions its Pump acknowledged (the step that decides it, seen in the
source's journal as it is written) to the last, over the rows of every group
after the first: how fast the source decodes, sends and has stored
(fsync'ed) a production stream once running, whatever its start-up. The
floor, ``mysqlbinlog --verbose``, writes to /dev/null (timed, faster of two)
and its rows are counted in a third, untimed run. ``--bulk-only`` stops
after the bulk cases; a larger ``--rows`` (1-2 M) amortises the start-up
in the whole-process figure. The live case runs four times in the same run, natively
framed each time: paced with the adaptive step (the default), at a fixed pace
(``--max-step-ms`` equal to ``--step-ms``: the pipeline before the adaptive
step) and unpaced (``--step-ms 0``: a step as soon as the one before ends, the
pipeline before the pace existed); and adaptive with its reads not in bursts
(``BINLAKE_READ_BURST_MS=0``: a wake-up per arriving transaction, as before
``source.readburst``); once more per ``--also-step-ms`` at that pace. It sets the whole chain's CPU per transaction
against that of ``mysqlbinlog`` following as a replica. ``--postgres`` runs its
live case adaptive, fixed and unpaced the same way, and paced with its tuples decoded in
Python (``BINLAKE_NATIVE_PGOUTPUT=0``) against the native decoder (``_pgoutc``);
``--pgoutput-only`` measures that decoding alone, in process, without a server.

The live case also reports what following the upstream costs the source:
its CPU seconds (from /proc) per upstream transaction, and the Pump's and
the registry's; how long after the workload stopped the source's checkpoint
reached the server's last position (its lag then, the catch-up time); and the
transactions/s it kept up with (upstream transactions over the time from the
workload's start to that catch-up).

Run: ``binlake bench source --rows 1000000`` (results in bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchkit import cpu_seconds

ROOT = pathlib.Path(__file__).resolve().parent.parent
# ``--nice``: the niceness the registry, Pump and source run at (0: the benchmark's own).
_NICE = [0]
# ``--step-ms``: the paced live cases' pace (None: the source's default).
_STEP: list[str | None] = [None]
# ``--max-step-ms``: the adaptive live cases' longest step (None: the source's default).
_MAX_STEP: list[str | None] = [None]
# ``--also-step-ms``: one more paced live case per entry ("step<MS>").
_ALSO: list[str] = []
# ``--pinned``: the upstream (server and the workload's client, this process) on CPU 0,
# every follower (registry, Pump, source, the C replica) on CPU 1.
_PIN = [False]


def _cleanup(procs: list[subprocess.Popen[Any]], server: Any, base: pathlib.Path, args: Any) -> None:
    """Stop what a run started (newest first), its database server, and its scratch
    directory unless the user named it with --dir."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    server.stop()
    if not getattr(args, "dir", None):
        shutil.rmtree(base, ignore_errors=True)

def _niced() -> None:
    if _NICE[0]:
        os.nice(_NICE[0])
    if _PIN[0]:
        os.sched_setaffinity(0, {1})


def _pace_args(mode: str) -> tuple[str, ...]:
    """The source's --step-ms/--max-step-ms options for a live case: ``unpaced``, ``step<MS>``
    (an ``--also-step-ms`` case), ``fixed`` (paced at ``--step-ms``, no adaptive step) or
    paced and adaptive at ``--step-ms``/``--max-step-ms`` (the source's defaults without them)."""
    if mode == "unpaced":
        return ("--step-ms", "0")
    if mode.startswith("step"):
        return ("--step-ms", mode[4:])
    pace = ("--step-ms", _STEP[0]) if _STEP[0] is not None else ()
    if mode == "fixed":  # the pace without the adaptive step (the pipeline before it)
        from binlake.source.pipeline import PACE_S

        ms = _STEP[0] if _STEP[0] is not None else f"{PACE_S * 1000:g}"
        return ("--step-ms", ms, "--max-step-ms", ms)
    return pace + (("--max-step-ms", _MAX_STEP[0]) if _MAX_STEP[0] is not None else ())


def _pin_upstream(server_pid: int) -> None:
    """The server's threads (new ones inherit it) and this process onto CPU 0."""
    for tid in os.listdir(f"/proc/{server_pid}/task"):
        os.sched_setaffinity(int(tid), {0})
    os.sched_setaffinity(0, {0})
BINLAKE = pathlib.Path(sys.executable).parent / "binlake"


def _sql(port: int, *stmts: str, db: str | None = None) -> list[Any]:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True, database=db)
    out: list[Any] = []
    try:
        with conn.cursor() as cur:
            for s in stmts:
                cur.execute(s)
                out = list(cur.fetchall())
    finally:
        conn.close()
    return out


def _checkpoint(data_dir: pathlib.Path) -> tuple[str, int]:
    try:
        pos = json.loads((data_dir / "state.json").read_text()).get("position") or ["", 0]
    except (OSError, ValueError):
        return "", 0
    return str(pos[0]), int(pos[1])


def _source(port: int, registry: str, data_dir: pathlib.Path, start: str, log: pathlib.Path,
            native: bool = True, framed: bool = True, extra: tuple[str, ...] = (),
            env_extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    from binlake.source.mysql.framing import NATIVE_FRAMING_ENV
    from binlake.source.mysql.rowsplan import NATIVE_ROWS_ENV

    env = {**os.environ, "PYTHONUNBUFFERED": "1", NATIVE_ROWS_ENV: "1" if native else "0",
           NATIVE_FRAMING_ENV: "1" if framed else "0", **(env_extra or {})}
    with log.open("ab") as f:
        return subprocess.Popen(
            [str(BINLAKE), "source", "mysql", "--dsn", f"mysql://root@127.0.0.1:{port}", "--server-id", "4242",
             "--registry", registry, "--data-dir", str(data_dir), "--start", start, "--tables", "bench.*", *extra],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=_niced,
        )


def _spawn(args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen([str(BINLAKE), *args], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=_niced)


def _start_cluster(base: pathlib.Path, log: pathlib.Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """A registry and one Pump (node p1) as child processes; returns the registry address."""
    from binlake import errors
    from binlake.net import free_port
    from binlake.registry.client import RegistryClient
    from binlake.registry.model import NodeState

    reg_addr = f"127.0.0.1:{free_port()}"
    procs = [_spawn(["registry", "--data-dir", str(base / "registry"), "--addr", reg_addr], log)]
    procs.append(_spawn(["pump", "--registry", reg_addr, "--data-dir", str(base / "pump"),
                         "--addr", f"127.0.0.1:{free_port()}", "--node-id", "p1",
                         "--stop-write-at-free-bytes", "0"], log))
    deadline = time.monotonic() + 60
    while True:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"registry or pump exited; log {log}")
        try:
            with RegistryClient(reg_addr, timeout_s=0.5) as reg:
                nodes, _rev = reg.list_nodes("pump")
            if any(n.node_id == "p1" and n.state is NodeState.ONLINE for n in nodes):
                return reg_addr, procs
        except errors.BinlakeError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"registry and pump did not come up within 60s; log {log}")
        time.sleep(0.1)


def _wait_at(data_dir: pathlib.Path, end: tuple[str, int], proc: subprocess.Popen[bytes], log: pathlib.Path,
             timeout: float) -> float:
    t0 = time.monotonic()
    while _checkpoint(data_dir) < end:
        if proc.poll() is not None:
            raise SystemExit(f"source exited with {proc.returncode}; log {log}")
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"source did not reach {end} within {timeout:g}s; log {log}")
        time.sleep(0.05)
    return time.monotonic()


class _JournalWatch:
    """Reads a source's journal.log as it grows: the time each step's line with decisions
    (``"m"``: a group whose prewrites its Pump acknowledged, fsync'ed) appeared, and how
    many upstream transactions of the binlog (keys ``FILE:POS``, not the start-up's
    ``init:`` definitions or a DDL's ``FILE:POS#i``) it decided."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._offset = 0
        self._tail = b""
        self.decided: list[tuple[float, int]] = []  # (seen at, transactions decided)

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        if not data:
            return
        now = time.monotonic()
        self._offset += len(data)
        *lines, self._tail = (self._tail + data).split(b"\n")
        for line in lines:
            rec = json.loads(line)
            n = sum(1 for k, _c, _p in rec.get("m", ()) if not k.startswith("init:") and "#" not in k)
            if n:
                self.decided.append((now, n))


def _wait_bulk(data_dir: pathlib.Path, end: tuple[str, int], proc: subprocess.Popen[bytes], log: pathlib.Path,
               timeout: float) -> tuple[float, _JournalWatch]:
    """``_wait_at`` for a bulk run, watching the journal meanwhile (every 5 ms)."""
    watch = _JournalWatch(data_dir / "journal.log")
    t0 = time.monotonic()
    while _checkpoint(data_dir) < end:
        watch.poll()
        if proc.poll() is not None:
            raise SystemExit(f"source exited with {proc.returncode}; log {log}")
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"source did not reach {end} within {timeout:g}s; log {log}")
        time.sleep(0.005)
    done = time.monotonic()
    watch.poll()
    return done, watch


def _steady(watch: _JournalWatch, per_txn: int, rows: int) -> float | None:
    """Row changes/s once running: from the first group of the binlog's transactions
    acknowledged by the Pump (its decision journaled) to the last, over the rows of
    every group after the first; None with fewer than three groups (no interval to speak of)."""
    if len(watch.decided) < 3:
        return None
    (t_first, first), (t_last, _n) = watch.decided[0], watch.decided[-1]
    after = min(rows, sum(n for _t, n in watch.decided) * per_txn) - first * per_txn
    return after / (t_last - t_first) if t_last > t_first else None


def _workload(port: int, seconds: float, count: list[int] | None = None) -> float:
    """One client: update one row by key + insert one row per transaction; txn/s
    (the number of transactions is appended to ``count``)."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=False, database="bench")
    n = 0
    base = 50_000_000 + int(time.time() * 1000) % 1_000_000 * 100
    try:
        with conn.cursor() as cur:
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                cur.execute("UPDATE sbtest SET k = k + 1 WHERE id = %s", (n % 1000 + 1,))
                cur.execute("INSERT INTO sbtest VALUES (%s, %s, %s, %s)", (base + n, n, "c" * 120, "p" * 60))
                conn.commit()
                n += 1
            if count is not None:
                count.append(n)
            return n / (time.monotonic() - t0)
    finally:
        conn.close()


def _live(port: int, reg_addr: str, base: pathlib.Path, mode: str, log: pathlib.Path,
          cluster: list[subprocess.Popen[bytes]], procs: list[subprocess.Popen[bytes]],
          seconds: float) -> dict[str, Any]:
    """One client's workload for ``seconds`` with the source (``mode``: native, unpaced
    (native, ``--step-ms 0``), fixed (native, no adaptive step) or libframe; native rows in
    each) following from the
    server's end; its figures."""
    from binlake.source.mysql import rowsplan

    t_end = _sql(port, "SHOW MASTER STATUS")[0]
    d = base / f"live-{mode}"
    from binlake.source.readburst import READ_BURST_ENV

    proc = _source(port, reg_addr, d, f"{t_end[0]}:{t_end[1]}", log, native=rowsplan.available(),
                   framed=mode != "libframe", extra=_pace_args(mode),
                   env_extra={READ_BURST_ENV: "0"} if mode == "noburst" else None)
    procs.append(proc)
    while _checkpoint(d)[0] == "":
        if proc.poll() is not None:
            raise SystemExit(f"source exited with {proc.returncode}; log {log}")
        time.sleep(0.05)
    time.sleep(2.0)  # its start-up (imports, definitions sent, first checkpoint) is not the workload's cost
    watched = {"source": proc.pid, "pump": cluster[1].pid, "registry": cluster[0].pid}
    cpu0 = {k: cpu_seconds(pid) for k, pid in watched.items()}
    count: list[int] = []
    t_start = time.monotonic()
    rate = _workload(port, seconds, count)
    w_end = _sql(port, "SHOW MASTER STATUS")[0]
    t_stop = time.monotonic()
    caught = _wait_at(d, (str(w_end[0]), int(w_end[1])), proc, log, timeout=600)
    cpu = {k: cpu_seconds(pid) - cpu0[k] for k, pid in watched.items()}
    # The source's journal: one line per step; a line's "b" is the group it began.
    begun = [len(json.loads(x).get("b", ())) for x in (d / "journal.log").read_text().splitlines()]
    proc.terminate()
    proc.wait(30)
    return {"rate": rate, "txns": count[0], "cpu": cpu, "catch_up": caught - t_stop,
            "kept_up": count[0] / (caught - t_start), "groups": [n for n in begun if n], "steps": len(begun)}


def _pg_workload(dsn: str, seconds: float, count: list[int]) -> float:
    """The MySQL live case's workload on PostgreSQL: update one row by key + insert one row per transaction."""
    import psycopg

    n = 0
    base = 50_000_000 + int(time.time() * 1000) % 1_000_000 * 100
    with psycopg.connect(dsn) as conn:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            conn.execute("UPDATE sbtest SET k = k + 1 WHERE id = %s", (n % 1000 + 1,))
            conn.execute("INSERT INTO sbtest VALUES (%s, %s, %s, %s)", (base + n, n, "c" * 120, "p" * 60))
            conn.commit()
            n += 1
        count.append(n)
        return n / (time.monotonic() - t0)


def _pg_follow(dsn: str, reg_addr: str, d: pathlib.Path, slot: str, extra: tuple[str, ...], log: pathlib.Path,
               cluster: list[subprocess.Popen[bytes]], procs: list[subprocess.Popen[bytes]],
               seconds: float, env: dict[str, str]) -> dict[str, Any]:
    """The PostgreSQL source (its own slot ``slot``, options ``extra``, environment
    ``env`` added) following one client's workload for ``seconds``; its figures."""
    with log.open("ab") as f:
        proc = subprocess.Popen(
            [str(BINLAKE), "source", "postgres", "--dsn", dsn, "--slot", slot, "--publication", "binlake",
             "--create", "--registry", reg_addr, "--data-dir", str(d), *extra],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, preexec_fn=_niced)
    procs.append(proc)
    deadline = time.monotonic() + 120
    while not (d / "journal.log").exists() or not (d / "state.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"postgres source did not start; log {log}")
        time.sleep(0.1)
    time.sleep(2.0)  # its start-up is not the workload's cost
    watched = {"source": proc.pid, "pump": cluster[1].pid, "registry": cluster[0].pid}
    cpu0 = {k: cpu_seconds(pid) for k, pid in watched.items()}
    s_count: list[int] = []
    rate = _pg_workload(dsn, seconds, s_count)
    # Caught up: the journal stops growing (no LSN to compare a checkpoint with here).
    t_stop = time.monotonic()
    last, still = -1, 0.0
    while True:
        size = (d / "journal.log").stat().st_size
        if size == last:
            if time.monotonic() - still > 1.0:
                break
        else:
            last, still = size, time.monotonic()
        if proc.poll() is not None:
            raise SystemExit(f"postgres source exited with {proc.returncode}; log {log}")
        time.sleep(0.05)
    cpu = {k: cpu_seconds(pid) - cpu0[k] for k, pid in watched.items()}
    begun = [len(json.loads(x).get("b", ())) for x in (d / "journal.log").read_text().splitlines()]
    proc.terminate()
    proc.wait(30)
    with contextlib.suppress(Exception):  # its slot would hold WAL for the next case
        _pg_sql(dsn, "SELECT pg_drop_replication_slot(%s)", slot)
    return {"rate": rate, "txns": s_count[0], "cpu": cpu, "settle": still - t_stop,
            "groups": [n for n in begun if n], "steps": len(begun)}


def _pg_sql(dsn: str, query: str, *params: Any) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query, params)


def _postgres(args: argparse.Namespace | None, seconds: float) -> int:
    """``--postgres``: the PostgreSQL source (pgoutput) following one client live, against
    ``pg_recvlogical`` (C, pgoutput to /dev/null) following the same publication: the
    upstream's rate in each case and the CPU per upstream transaction of each follower."""
    import psycopg

    from binlake.stack.localdb import LocalPostgres

    tool = shutil.which("pg_recvlogical")
    if not LocalPostgres.available() or tool is None:
        print("PostgreSQL (with pg_recvlogical) is not installed: nothing to measure", file=sys.stderr)
        return 2
    base = pathlib.Path(args.dir) if getattr(args, "dir", None) else pathlib.Path(
        tempfile.mkdtemp(prefix="source-", dir=ROOT / "bench" if (ROOT / "bench").is_dir() else None))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)  # PostgreSQL runs as its own user (it refuses root) and must reach its data dir
    server = LocalPostgres(base / "pg", logical=True).start()
    procs: list[subprocess.Popen[bytes]] = []
    log = base / "source.log"
    try:
        reg_addr, cluster = _start_cluster(base, log)
        procs += cluster
        dsn = server.create_database("bench").replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, "
                         "pad CHAR(60) NOT NULL)")
            conn.execute("ALTER TABLE sbtest REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO sbtest SELECT g, g % 1000, repeat('c', 120), repeat('p', 60) "
                         "FROM generate_series(1, 1000) g")
            conn.execute("CREATE PUBLICATION floor FOR TABLE sbtest")
        count: list[int] = []
        plain = _pg_workload(dsn, seconds, count)
        # The floor: pg_recvlogical (C) decoding nothing itself, pgoutput's bytes to /dev/null.
        conn_args = ["-d", dsn, "--slot", "floor"]
        subprocess.run([tool, *conn_args, "--create-slot", "-P", "pgoutput"], check=True, capture_output=True)
        floor = subprocess.Popen([tool, *conn_args, "--start", "-o", "proto_version=1", "-o",
                                  "publication_names=floor", "-f", "/dev/null"], stderr=subprocess.DEVNULL)
        procs.append(floor)
        time.sleep(1.0)
        c0 = cpu_seconds(floor.pid)
        c_count: list[int] = []
        with_floor = _pg_workload(dsn, seconds, c_count)
        time.sleep(0.5)
        floor_cpu = cpu_seconds(floor.pid) - c0
        floor.terminate()
        floor.wait(30)
        subprocess.run([tool, *conn_args, "--drop-slot"], check=False, capture_output=True)
        paced: dict[str, dict[str, Any]] = {}
        from binlake.source.postgres import pgplan

        cases = [(f"adaptive (--step-ms {_STEP[0] or 'default'}, --max-step-ms {_MAX_STEP[0] or 'default'})",
                  _pace_args("paced"), "1"),
                 ("adaptive, reads not in bursts (BINLAKE_READ_BURST_MS=0)", _pace_args("paced"), "noburst"),
                 ("fixed pace (--max-step-ms = --step-ms)", _pace_args("fixed"), "1"),
                 ("unpaced (--step-ms 0)", _pace_args("unpaced"), "1")]
        if pgplan.available():
            cases.append((f"paced, Python tuple decoding ({pgplan.NATIVE_PGOUTPUT_ENV}=0)", _pace_args("paced"), "0"))
        cases += [(f"paced, --step-ms {m[4:]}", _pace_args(m), "1") for m in _ALSO]
        from binlake.source.readburst import READ_BURST_ENV

        for name, extra, native in cases:
            env = ({pgplan.NATIVE_PGOUTPUT_ENV: "1", READ_BURST_ENV: "0"} if native == "noburst"
                   else {pgplan.NATIVE_PGOUTPUT_ENV: native})
            paced[name] = _pg_follow(dsn, reg_addr, base / f"src-pg-{len(paced)}", f"binlake{len(paced)}", extra,
                                     log, cluster, procs, seconds, env)
    finally:
        _cleanup(procs, server, base, args)
    floor_us = 1e6 * floor_cpu / max(c_count[0], 1)
    print(f"\n| PostgreSQL upstream, 1 client, {seconds:g}s | txn/s | ratio |")
    print("|---|---:|---:|")
    print(f"| nothing following | {plain:,.0f} | 1.00 |")
    print(f"| pg_recvlogical (C, pgoutput to /dev/null) following | {with_floor:,.0f} | {with_floor / plain:.3f} |")
    for name, r in paced.items():
        print(f"| binlake source postgres -> Pump, with its registry, {name} | {r['rate']:,.0f} | "
              f"{r['rate'] / plain:.3f} |")
    print("\n| the source following | " + " | ".join(paced) + " |")
    print("|---|" + "---:|" * len(paced))

    def row(what: str, f: Any) -> None:
        print(f"| {what} | " + " | ".join(f(r) for r in paced.values()) + " |")

    row("upstream transactions", lambda r: f"{r['txns']:,}")
    row("journal settled after the workload stopped (about its lag)", lambda r: f"{r['settle']:.2f} s")
    for k in ("source", "pump", "registry"):
        row(f"{k} CPU per upstream transaction", lambda r, k=k: f"{1e6 * r['cpu'][k] / max(r['txns'], 1):,.0f} us")
    row("whole chain CPU per upstream transaction",
        lambda r: f"{1e6 * sum(r['cpu'].values()) / max(r['txns'], 1):,.0f} us")
    row(f"ratio to pg_recvlogical's CPU per transaction ({floor_us:,.0f} us)",
        lambda r: f"{1e6 * sum(r['cpu'].values()) / max(r['txns'], 1) / max(floor_us, 1e-9):.1f}x")
    row("groups (steps: journal lines)", lambda r: f"{len(r['groups']):,} ({r['steps']:,})")
    row("upstream transactions per group: mean / largest",
        lambda r: f"{sum(r['groups']) / max(len(r['groups']), 1):.1f} / {max(r['groups'], default=0)}")
    return 0


def _framing_only(args: argparse.Namespace | None, rows: int, per_txn: int) -> int:
    """``--framing-only``: the CPU of reading a binlog (``rows`` row changes in bulk
    transactions, then 3,000 one-row updates) to its end, in this process, through the
    native framer and through mysql-replication's reader (rows not decoded either way),
    alternated twice."""
    import pymysql
    from pymysqlreplication import BinLogStreamReader

    from binlake.source.mysql import framing
    from binlake.stack.localdb import LocalMariaDB

    if not LocalMariaDB.available() or not framing.available():
        print("MariaDB or the native framer (_framec) is missing: nothing to measure", file=sys.stderr)
        return 2
    base = pathlib.Path(tempfile.mkdtemp(prefix="framing-"))
    server = LocalMariaDB(base / "mariadb", binlog=True).start()
    results: list[tuple[str, int, float]] = []
    try:
        port = server.port
        _sql(port, "CREATE DATABASE bench", "CREATE TABLE bench.sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, "
             "c CHAR(120) NOT NULL, pad CHAR(60) NOT NULL)")
        f0, p0 = _sql(port, "SHOW MASTER STATUS")[0][:2]
        for done in range(0, rows, per_txn):
            _sql(port, f"INSERT INTO sbtest SELECT seq, seq % 1000, REPEAT('c', 120), REPEAT('p', 60) "
                       f"FROM seq_{done + 1}_to_{min(rows, done + per_txn)}", db="bench")
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True, database="bench")
        with conn.cursor() as cur:
            for i in range(3000):
                cur.execute("UPDATE sbtest SET k = k + 1 WHERE id = %s", (i % rows + 1,))
        conn.close()
        end = int(_sql(port, "SHOW MASTER STATUS")[0][1])
        for n, native in enumerate((True, False, True, False)):
            stream = BinLogStreamReader(
                connection_settings={"host": "127.0.0.1", "port": port, "user": "root", "password": ""},
                server_id=900 + n, blocking=True, only_events=framing.EVENTS, freeze_schema=True,
                slave_heartbeat=1, log_file=f0, log_pos=int(p0), resume_stream=True)
            events = iter(framing.NativeReader(stream)) if native else framing.library_events(stream)
            count, t0 = 0, time.process_time()
            for ev in events:
                count += 1
                if ev[0] == framing.XID and ev[2] >= end:
                    break
            results.append(("native" if native else "mysql-replication", count, time.process_time() - t0))
            stream.close()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n| reading {rows:,} bulk row changes + 3,000 one-row transactions (rows not decoded) | events | "
          "CPU s | us per event |")
    print("|---|---:|---:|---:|")
    for what, count, cpu in results:
        print(f"| {what} | {count:,} | {cpu:.3f} | {1e6 * cpu / max(count, 1):.1f} |")
    return 0


def _pgoutput_only(rows: int) -> int:
    """``--pgoutput-only``: the CPU of turning ``rows`` pgoutput row changes of the
    benchmark's table (half updates with their old image, half inserts) into the
    source's TableMutations, in this process (``PostgresSource._change``), with the
    native tuple decoder and on the Python path, alternated twice. No server: the
    messages are built here as pgoutput sends them."""
    import struct

    from binlake.proto import binlog_pb2
    from binlake.source.postgres import pgplan, values
    from binlake.source.postgres.source import PostgresSource, _Reader
    from binlake.source.tables import assign_ids

    if not pgplan.available():
        print(f"the native pgoutput decoder (_pgoutc) is not built: {pgplan.import_error()}", file=sys.stderr)
        return 2
    oid = 16384
    attrs = [values.Attr("id", 20, -1), values.Attr("k", 23, -1), values.Attr("c", 1042, 124),
             values.Attr("pad", 1042, 64)]
    table = values.table("public", "sbtest", values.columns("public", "sbtest", attrs), ["id"])
    assign_ids(table, None, 100, 1)

    def tup(i: int, k: int) -> bytes:
        out = struct.pack(">h", 4)
        for text in (str(i), str(k), "c" * 120, "p" * 60):
            out += b"t" + struct.pack(">i", len(text)) + text.encode()
        return out

    msgs: list[tuple[str, bytes]] = []
    for i in range(rows // 2):
        msgs.append(("U", b"U" + struct.pack(">i", oid) + b"O" + tup(i % 1000 + 1, i) + b"N" + tup(i % 1000 + 1, i + 1)))
        msgs.append(("I", b"I" + struct.pack(">i", oid) + b"N" + tup(50_000_000 + i, i)))
    results: list[tuple[str, int, float]] = []
    outs: dict[bool, bytes] = {}
    for native in (True, False, True, False):
        src = PostgresSource.__new__(PostgresSource)
        src.tables, src.oids, src._infos = {oid: table}, {oid: [a.type_oid for a in attrs]}, {}
        src.native, src.native_changes, src.python_changes = native, 0, 0
        txn: dict[int, binlog_pb2.TableMutation] = {}
        t0 = time.process_time()
        for kind, data in msgs:
            r = _Reader(data)
            r.byte()
            src._change(kind, r, txn)
        cpu = time.process_time() - t0
        assert (src.native_changes == len(msgs)) == native
        outs[native] = b"".join(m.SerializeToString() for m in txn.values())
        results.append(("native (_pgoutc)" if native else f"Python ({pgplan.NATIVE_PGOUTPUT_ENV}=0)", len(msgs), cpu))
    if outs[True] != outs[False]:
        print("the native and the Python path built different mutations", file=sys.stderr)
        return 1
    print(f"\n| {len(msgs):,} pgoutput row changes of sbtest (half UPDATE with old image, half INSERT) into "
          "TableMutations | row changes | CPU s | us per row change |")
    print("|---|---:|---:|---:|")
    for what, count, cpu in results:
        print(f"| {what} | {count:,} | {cpu:.3f} | {1e6 * cpu / max(count, 1):.1f} |")
    print("\n(both paths built byte-identical mutations)")
    return 0


def main(args: argparse.Namespace | None = None) -> int:
    from binlake.stack.localdb import LocalMariaDB

    rows = int(getattr(args, "rows", 1_000_000))
    per_txn = int(getattr(args, "rows_per_txn", 1000))
    seconds = float(getattr(args, "seconds", 10.0))
    _NICE[0] = int(getattr(args, "nice", 0) or 0)
    _PIN[0] = bool(getattr(args, "pinned", False))
    step = getattr(args, "step_ms", None)
    _STEP[0] = None if step is None else f"{step:g}"
    max_step = getattr(args, "max_step_ms", None)
    _MAX_STEP[0] = None if max_step is None else f"{max_step:g}"
    also = _ALSO[:] = [f"step{ms:g}" for ms in getattr(args, "also_step_ms", None) or []]
    if _PIN[0] and len(os.sched_getaffinity(0)) < 2:
        print("--pinned needs 2 CPUs this process may run on", file=sys.stderr)
        return 2
    if getattr(args, "postgres", False):
        return _postgres(args, seconds)
    if getattr(args, "framing_only", False):
        return _framing_only(args, rows, per_txn)
    if getattr(args, "pgoutput_only", False):
        return _pgoutput_only(rows)
    if not LocalMariaDB.available():
        print("MariaDB is not installed (apt-get install mariadb-server): nothing to measure", file=sys.stderr)
        return 2
    if shutil.which("mysqlbinlog") is None and shutil.which("mariadb-binlog") is None:
        print("mysqlbinlog is not installed (apt-get install mariadb-client)", file=sys.stderr)
        return 2
    base = pathlib.Path(args.dir) if getattr(args, "dir", None) else pathlib.Path(
        tempfile.mkdtemp(prefix="source-", dir=ROOT / "bench" if (ROOT / "bench").is_dir() else None))
    base.mkdir(parents=True, exist_ok=True)
    server = LocalMariaDB(base / "mariadb", binlog=True).start()
    procs: list[subprocess.Popen[bytes]] = []
    log = base / "source.log"
    try:
        if _PIN[0]:
            assert server.proc is not None
            _pin_upstream(server.proc.pid)
        reg_addr, cluster = _start_cluster(base, log)
        procs += cluster
        port = server.port
        _sql(port, "CREATE DATABASE bench",
             "CREATE TABLE bench.sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, "
             "pad CHAR(60) NOT NULL)")
        f0, p0 = _sql(port, "SHOW MASTER STATUS")[0][:2]
        t0 = time.monotonic()
        done = 0
        while done < rows:
            n = min(per_txn, rows - done)
            _sql(port, f"INSERT INTO sbtest SELECT seq, seq % 1000, REPEAT('c', 120), REPEAT('p', 60) "
                       f"FROM seq_{done + 1}_to_{done + n}", db="bench")
            done += n
        load_s = time.monotonic() - t0
        end = _sql(port, "SHOW MASTER STATUS")[0]
        end_pos = (str(end[0]), int(end[1]))
        files = [r[0] for r in _sql(port, "SHOW BINARY LOGS") if r[0] >= f0]
        binlog_bytes = sum(int(r[1]) for r in _sql(port, "SHOW BINARY LOGS") if r[0] >= f0) - int(p0)

        # 1. mysqlbinlog --verbose over the same files (the decoding limit).
        tool = shutil.which("mysqlbinlog") or shutil.which("mariadb-binlog")
        assert tool is not None
        tool_args = [tool, "--verbose", "--base64-output=DECODE-ROWS", f"--start-position={p0}",
                     *[str(server.data_dir / f) for f in files]]
        # Timed writing to /dev/null (the faster of 2: the first also reads the files into the
        # page cache), counted in a third, untimed run (a pipe into this process would time
        # the pipe and Python's reading too).
        tool_s = float("inf")
        for _ in range(2):
            t0 = time.monotonic()
            subprocess.run(tool_args, stdout=subprocess.DEVNULL, check=True)
            tool_s = min(tool_s, time.monotonic() - t0)
        out = subprocess.run(tool_args, capture_output=True, check=True)
        decoded = out.stdout.count(b"### INSERT INTO")
        events = out.stdout.count(b"\n# at ")
        del out

        # 2. The source from the same start position to the end, into one Pump: with the
        #    native row decoder (the default when built) and forced onto the Python path.
        #    And with the native rows but mysql-replication's own (Python) stream framing.
        from binlake.source.mysql import framing, rowsplan

        modes = ["native", "python"] if rowsplan.available() else ["python"]
        if rowsplan.available() and framing.available():
            modes.insert(1, "libframe")
        source_s: dict[str, float] = {}
        steady: dict[str, float] = {}  # row changes/s between the first and the last group acknowledged
        # The two native modes run twice, alternated (a-b-a-b), and the faster run of each
        # counts: on a shared machine the order otherwise weighs on the comparison.
        # "startup" (twice, first and last): the source started at the binlog's end, so that
        # its time to that checkpoint is its start-up alone (interpreter, imports, the
        # registry, the Pumps, the replica connection), which every bulk run includes once.
        runs = modes[:-1] * 2 + modes[-1:] if len(modes) == 3 else modes
        runs = ["startup", *runs, "startup"]
        for n, mode in enumerate(runs):
            t0 = time.monotonic()
            d = base / f"src-{mode}-{n}"
            at = f"{end_pos[0]}:{end_pos[1]}" if mode == "startup" else f"{f0}:{p0}"
            proc = _source(port, reg_addr, d, at, log, native=mode != "python", framed=mode in ("native", "startup"))
            procs.append(proc)
            done, watch = _wait_bulk(d, end_pos, proc, log, timeout=3600)
            secs = done - t0
            source_s[mode] = min(secs, source_s.get(mode, secs))
            if mode != "startup":
                rate = _steady(watch, per_txn, rows)
                if rate is not None:
                    steady[mode] = max(rate, steady.get(mode, rate))
            proc.terminate()
            proc.wait(30)

        bulk_only = bool(getattr(args, "bulk_only", False))
        # 3. Upstream throughput without, then with, the source following it live.
        plain = 0.0 if bulk_only else _workload(port, seconds)
        live: dict[str, dict[str, Any]] = {}
        c_count: list[int] = [0]
        c_replica_cpu = with_c_replica = 0.0
        if not bulk_only:
            # The cost of any replica to this upstream on this machine: mysqlbinlog (C) connected
            # as a replica, decoding every event as it arrives (to /dev/null), in the same run.
            r_end = _sql(port, "SHOW MASTER STATUS")[0]
            follower = subprocess.Popen(
                [tool, "--read-from-remote-server", "--stop-never", "--stop-never-slave-server-id=4343",
                 "--host=127.0.0.1", f"--port={port}", "--user=root", "--verbose",
                 "--base64-output=DECODE-ROWS", f"--start-position={r_end[1]}", str(r_end[0])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_niced)
            procs.append(follower)
            time.sleep(0.5)
            c0 = cpu_seconds(follower.pid)
            c_count = []
            with_c_replica = _workload(port, seconds, c_count)
            c_replica_cpu = cpu_seconds(follower.pid) - c0
            follower.terminate()
            follower.wait(30)
            # The source following live: natively framed, then (same run) on mysql-replication's framing.
            live_modes = ["native", "noburst", "fixed", "unpaced"] if framing.available() else ["libframe"]
            live_modes += also
            for lm in live_modes:
                live[lm] = _live(port, reg_addr, base, lm, log, cluster, procs, seconds)
    finally:
        _cleanup(procs, server, base, args)

    print(f"\nbinlog: {rows} row changes in transactions of {per_txn} rows, {binlog_bytes / 1e6:.1f} MB, "
          f"{events} events (loaded in {load_s:.1f}s)\n")
    startup = source_s.pop("startup")
    floor = decoded / tool_s
    print("| decoder | row changes | seconds | row changes/s | ratio to mysqlbinlog (whole process) | "
          "seconds after start-up | ratio after start-up | steady row changes/s (first to last group acknowledged) "
          "| **steady ratio** |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| mysqlbinlog --verbose (C, to /dev/null; faster of 2) | {decoded} | {tool_s:.2f} | {floor:,.0f} | 1.00 "
          f"| | | {floor:,.0f} | 1.00 |")
    print(f"| binlake source mysql start-up alone (started at the binlog's end; faster of 2) | 0 | {startup:.2f} "
          "| | | | | | |")
    names = {"native": "native framing + native rows", "libframe": "mysql-replication framing + native rows "
             f"({framing.NATIVE_FRAMING_ENV}=0)", "python": "Python path (BINLAKE_NATIVE_ROWS=0, "
             f"{framing.NATIVE_FRAMING_ENV}=0)", "unpaced": "native, steps unpaced (--step-ms 0)",
             "fixed": "native, fixed pace (--max-step-ms = --step-ms: no adaptive step)",
             "noburst": "native, adaptive step, reads not in bursts (BINLAKE_READ_BURST_MS=0)"}
    if _STEP[0] is not None:
        names["native"] += f" (--step-ms {_STEP[0]})"
    for m in also:
        names[m] = f"native, --step-ms {m[4:]}"
    for mode, secs in source_s.items():
        best = " (best of 2 runs)" if mode != "python" and len(source_s) == 3 else ""
        # Under a tenth of a second past the start-up is within its run-to-run spread: no figure.
        after = secs - startup
        tail = (f"{after:.2f} | {(rows / after) / floor:.3f}" if after >= 0.1
                else f"{after:.2f} | - (within the start-up's spread)")
        rate = steady.get(mode)
        st = f"{rate:,.0f} | **{rate / floor:.3f}**" if rate is not None else "- | - (fewer than 3 groups)"
        print(f"| binlake source mysql, {names[mode]} -> 1 Pump (fsync'ed, checkpointed){best} | {rows} | {secs:.2f} | "
              f"{rows / secs:,.0f} | {(rows / secs) / floor:.3f} | {tail} | {st} |")
    if bulk_only:
        return 0
    c_us = 1e6 * c_replica_cpu / max(c_count[0], 1)
    # The live default case is natively framed with the adaptive step (the bulk cases have no steps to speak of).
    names["native"] += ", adaptive step" + (f" (--max-step-ms {_MAX_STEP[0]})" if _MAX_STEP[0] is not None else "")
    print(f"\n| upstream, 1 client, {seconds:g}s | txn/s | ratio |")
    print("|---|---:|---:|")
    print(f"| source not running | {plain:,.0f} | 1.00 |")
    print(f"| mysqlbinlog (C) as a replica following live, decoding to /dev/null | {with_c_replica:,.0f} | "
          f"{with_c_replica / plain:.3f} |")
    for lm, r in live.items():
        print(f"| source following live ({names[lm]}) | {r['rate']:,.0f} | {r['rate'] / plain:.3f} |")
    if _NICE[0]:
        print(f"\nregistry, Pump and source at nice {_NICE[0]}")
    if _PIN[0]:
        print("\npinned: the server and the workload's client on CPU 0; registry, Pump, source and the C replica "
              "on CPU 1 (bulk cases too)")
    print("\n| the source following live | " + " | ".join(names[lm] for lm in live) + " |")
    print("|---|" + "---:|" * len(live))

    def row(what: str, f: Any) -> None:
        print(f"| {what} | " + " | ".join(f(r) for r in live.values()) + " |")

    row("upstream transactions", lambda r: f"{r['txns']:,}")
    row("caught up after the workload stopped (its lag then)", lambda r: f"{r['catch_up']:.2f} s")
    row("upstream transactions/s it kept up with", lambda r: f"{r['kept_up']:,.0f}")
    for k in ("source", "pump", "registry"):
        row(f"{k} CPU per upstream transaction", lambda r, k=k: f"{1e6 * r['cpu'][k] / max(r['txns'], 1):,.0f} us")
    row("whole chain CPU per upstream transaction",
        lambda r: f"{1e6 * sum(r['cpu'].values()) / max(r['txns'], 1):,.0f} us")
    row("ratio to the C replica's CPU per transaction "
        f"({c_us:,.0f} us)", lambda r: f"{1e6 * sum(r['cpu'].values()) / max(r['txns'], 1) / max(c_us, 1e-9):.1f}x")
    row("groups (steps: journal lines)", lambda r: f"{len(r['groups']):,} ({r['steps']:,})")
    row("upstream transactions per group: mean / largest",
        lambda r: f"{sum(r['groups']) / max(len(r['groups']), 1):.1f} / {max(r['groups'], default=0)}")
    return 0
