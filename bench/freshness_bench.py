"""Freshness of the lake under ``binlake up``: a window's close to its asset event.

Starts ``binlake up`` (registry, Pumps, the always-on Spark Connect server,
Airflow) in a temporary directory with a short ingest schedule and the DAG's
start date a little ahead, lets the scheduled runs ingest WINDOWS windows,
then reads from the stack's Airflow database, for every run: the data
interval's end (the window's close), the ``publish`` task's end and the asset
event's timestamp. Freshness = asset event - window close. The ``ingest``
step's duration is reported too (the part Spark costs).

Run: ``python bench/freshness_bench.py [--schedule 30s] [--windows 6] [--mode connect]``
(``--mode spark-submit`` measures the same with a Spark application per window).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="30s", help="ingest schedule (default 30s)")
    parser.add_argument("--windows", type=int, default=6, help="scheduled windows to measure (default 6)")
    parser.add_argument("--mode", default="connect", choices=("connect", "spark-submit", "inprocess"))
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be >= 1")

    root = pathlib.Path(tempfile.mkdtemp(prefix="freshness-bench-"))
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)).replace(second=0, microsecond=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BINLAKE_"))}
    env.update({"BINLAKE_INGEST_SCHEDULE": args.schedule, "BINLAKE_INGEST_START_DATE": start.isoformat(),
                "BINLAKE_INGEST_MODE": args.mode, "BINLAKE_SAFE_TS_POLL_S": "1"})
    up = subprocess.Popen(
        [sys.executable, "-m", "binlake.cli", "up", "--data-dir", str(root / "state"), "--pumps", "2",
         "--registry-addr", f"127.0.0.1:{_free_port()}", "--pump-port-base", "0",
         "--airflow-port", str(_free_port()), "--spark-connect-port", str(_free_port()),
         "--pump-args=--fake-binlog-interval-s 0.5 --stop-write-at-free-bytes 0"],
        cwd=ROOT, env=env, stdout=(root / "up.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    db = root / "state" / "airflow" / "airflow.db"
    rows: list[tuple[str, str, str, str]] = []
    try:
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline and up.poll() is None:
            time.sleep(5)
            if not db.exists():
                continue
            try:
                rows = _rows(db, "ingest" if args.mode == "spark-submit" else "ingest_inprocess")
            except sqlite3.Error:
                continue
            if len(rows) >= args.windows:
                break
        if up.poll() is not None:
            print(f"binlake up exited {up.returncode}; see {root / 'up.log'}", file=sys.stderr)
            return 1
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    if len(rows) < args.windows:
        print(f"only {len(rows)} windows published in {args.timeout_s:g}s; see {root}", file=sys.stderr)
        return 1
    fresh, ingest = [], []
    print("| window close (UTC) | ingest s | asset event after close s |")
    print("|---|---:|---:|")
    for end, ing_start, ing_end, event in rows[: args.windows]:
        close = _ts(end)
        f = (_ts(event) - close).total_seconds()
        i = (_ts(ing_end) - _ts(ing_start)).total_seconds()
        fresh.append(f)
        ingest.append(i)
        print(f"| {close:%H:%M:%S} | {i:.1f} | {f:.1f} |")
    print(f"\nmode {args.mode}, schedule {args.schedule}: freshness median {statistics.median(fresh):.1f}s, "
          f"max {max(fresh):.1f}s; ingest step median {statistics.median(ingest):.1f}s")
    shutil.rmtree(root, ignore_errors=True)
    return 0


def _ts(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _rows(db: pathlib.Path, task: str) -> list[tuple[str, str, str, str]]:
    """(data interval end, ingest start, ingest end, asset event time) of every published scheduled run."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(
            """
            SELECT r.data_interval_end, ti.start_date, ti.end_date, e.timestamp
            FROM dag_run r
            JOIN task_instance ti ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id
                 AND ti.task_id = ? AND ti.state = 'success'
            JOIN task_instance p ON p.dag_id = r.dag_id AND p.run_id = r.run_id
                 AND p.task_id = 'publish' AND p.state = 'success'
            JOIN asset_event e ON e.source_dag_id = r.dag_id AND e.source_run_id = r.run_id
            WHERE r.dag_id = 'binlake_ingest' AND r.run_type = 'scheduled'
            ORDER BY r.data_interval_end
            """, (task,)).fetchall()


if __name__ == "__main__":
    raise SystemExit(main())
