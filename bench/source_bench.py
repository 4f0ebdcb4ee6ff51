"""Source benchmark: row changes/s the MariaDB row-binlog source decodes and
writes to one Pump (with the native row decoder and forced onto the Python
path, same binlog), against ``mysqlbinlog --verbose`` decoding the same binlog
files in the same run (the decoding limit), and the upstream's own throughput
with the source following it versus not (its overhead on the application).

Setup per run: a throwaway MariaDB (log-bin, ROW, FULL images), an in-process
registry and Pump, and the source as a child process (``binlake source
mysql``), so it does not share this process's interpreter. The data: a
sysbench-like table filled by ``INSERT ... SELECT`` in transactions of
``--rows-per-txn`` rows until ``--rows`` row changes are in the binlog.

Run: ``binlake bench source --rows 1000000`` (results in bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
            native: bool = True) -> subprocess.Popen[bytes]:
    from binlake.source.mysql.rowsplan import NATIVE_ROWS_ENV

    env = {**os.environ, "PYTHONUNBUFFERED": "1", NATIVE_ROWS_ENV: "1" if native else "0"}
    with log.open("ab") as f:
        return subprocess.Popen(
            [str(BINLAKE), "source", "mysql", "--dsn", f"mysql://root@127.0.0.1:{port}", "--server-id", "4242",
             "--registry", registry, "--data-dir", str(data_dir), "--start", start, "--tables", "bench.*"],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )


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


def _workload(port: int, seconds: float) -> float:
    """One client: update one row by key + insert one row per transaction; txn/s."""
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
            return n / (time.monotonic() - t0)
    finally:
        conn.close()


def main(args: argparse.Namespace | None = None) -> int:
    from binlake import config
    from binlake.pump.node import PumpNode
    from binlake.registry.server import RegistryServer
    from binlake.testing.devdb import LocalMariaDB

    rows = int(getattr(args, "rows", 1_000_000))
    per_txn = int(getattr(args, "rows_per_txn", 1000))
    seconds = float(getattr(args, "seconds", 10.0))
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
    reg = RegistryServer(config.load(config.RegistrySettings, data_dir=base / "registry", addr="127.0.0.1:0")).start()
    pump = PumpNode(config.load(config.PumpSettings, registry=reg.addr, data_dir=base / "pump", addr="127.0.0.1:0",
                                node_id="p1", stop_write_at_free_bytes=0)).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
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
        t0 = time.monotonic()
        out = subprocess.run([tool, "--verbose", "--base64-output=DECODE-ROWS", f"--start-position={p0}",
                              *[str(server.data_dir / f) for f in files]], capture_output=True, check=True)
        tool_s = time.monotonic() - t0
        decoded = out.stdout.count(b"### INSERT INTO")
        events = out.stdout.count(b"\n# at ")

        # 2. The source from the same start position to the end, into one Pump: with the
        #    native row decoder (the default when built) and forced onto the Python path.
        from binlake.source.mysql import rowsplan

        log = base / "source.log"
        modes = ["native", "python"] if rowsplan.available() else ["python"]
        source_s: dict[str, float] = {}
        for mode in modes:
            t0 = time.monotonic()
            proc = _source(port, reg.addr, base / f"src-{mode}", f"{f0}:{p0}", log,
                           native=mode == "native")
            procs.append(proc)
            source_s[mode] = _wait_at(base / f"src-{mode}", end_pos, proc, log, timeout=3600) - t0
            proc.terminate()
            proc.wait(30)

        # 3. Upstream throughput without, then with, the source following it live.
        plain = _workload(port, seconds)
        t_end = _sql(port, "SHOW MASTER STATUS")[0]
        proc = _source(port, reg.addr, base / "src2", f"{t_end[0]}:{t_end[1]}", log, native=rowsplan.available())
        procs.append(proc)
        while _checkpoint(base / "src2")[0] == "":
            time.sleep(0.05)
        lag_box: list[float] = []

        def follow() -> None:
            while proc.poll() is None:
                time.sleep(0.2)

        threading.Thread(target=follow, daemon=True).start()
        with_source = _workload(port, seconds)
        w_end = _sql(port, "SHOW MASTER STATUS")[0]
        t_stop = time.monotonic()
        caught = _wait_at(base / "src2", (str(w_end[0]), int(w_end[1])), proc, log, timeout=600)
        lag_box.append(caught - t_stop)
        proc.terminate()
        proc.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        pump.stop(grace=0.5)
        reg.stop(grace=0.5)
        server.stop()
        if not getattr(args, "dir", None):
            shutil.rmtree(base, ignore_errors=True)

    print(f"\nbinlog: {rows} row changes in transactions of {per_txn} rows, {binlog_bytes / 1e6:.1f} MB, "
          f"{events} events (loaded in {load_s:.1f}s)\n")
    print("| decoder | row changes | seconds | row changes/s | ratio to mysqlbinlog |")
    print("|---|---:|---:|---:|---:|")
    print(f"| mysqlbinlog --verbose (C, to /dev/null) | {decoded} | {tool_s:.2f} | {decoded / tool_s:,.0f} | 1.00 |")
    for mode, secs in source_s.items():
        what = "native row decoder" if mode == "native" else "Python path (BINLAKE_NATIVE_ROWS=0)"
        print(f"| binlake source mysql, {what} -> 1 Pump (fsync'ed, checkpointed) | {rows} | {secs:.2f} | "
              f"{rows / secs:,.0f} | {(rows / secs) / (decoded / tool_s):.3f} |")
    if len(source_s) == 2:
        print(f"\nnative / Python path: {source_s['python'] / source_s['native']:.2f}x row changes/s")
    print(f"\n| upstream, 1 client, {seconds:g}s | txn/s | ratio |")
    print("|---|---:|---:|")
    print(f"| source not running | {plain:,.0f} | 1.00 |")
    print(f"| source following live ({modes[0]} rows) | {with_source:,.0f} | {with_source / plain:.3f} |")
    print(f"\nsource caught up {lag_box[0]:.2f}s after the workload stopped "
          f"(overhead {100 * (1 - with_source / plain):.1f} %; target <= 5 %)")
    return 0
