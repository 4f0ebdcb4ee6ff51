"""Freshness of the lake under ``binlake up``: a window's close to its asset event.

Starts ``binlake up`` (registry, Pumps, the always-on Spark Connect server,
Airflow) in a temporary directory with a short ingest schedule and the DAG's
start date a little ahead, lets the scheduled runs ingest WINDOWS windows,
then reads from the stack's Airflow database, for every run: the data
interval's end (the window's close), the ``publish`` task's end and the asset
event's timestamp. Freshness = asset event - window close. The ``ingest``
step's duration is reported too (the part Spark costs).

With ``--rows-per-window N`` a TxnWriter (SQLite upstream) writes N row
changes per schedule period at an even pace from the DAG's start date on
(transactions of ``--rows-per-txn``), so each scheduled window holds about N
row changes; their ingest task then measures a loaded window through a real
Airflow task (forked by Airflow's supervisor, its imports already done).

Run: ``python bench/freshness_bench.py [--schedule 30s] [--windows 6] [--mode connect] [--rows-per-window 30000]``
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
import threading
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
    parser.add_argument("--rows-per-window", type=int, default=0,
                        help="row changes written into each window by a TxnWriter (default 0: none)")
    parser.add_argument("--rows-per-txn", type=int, default=1000, help="row changes per transaction (default 1000)")
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be >= 1")
    if args.rows_per_window < 0 or not 1 <= args.rows_per_txn <= 100_000:
        parser.error("--rows-per-window must be >= 0 and --rows-per-txn in 1..100000")
    # The ingest DAG's own reading of a duration schedule (its Airflow plugin package).
    sys.path.insert(0, str(ROOT / "plugins"))
    from binlake.config import duration_seconds

    period_s = duration_seconds(args.schedule)
    if not period_s:
        parser.error(f"--schedule {args.schedule!r}: expected a duration such as 30s or 5m")

    root = pathlib.Path(tempfile.mkdtemp(prefix="freshness-bench-"))
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)).replace(second=0, microsecond=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BINLAKE_"))}
    env.update({"BINLAKE_INGEST_SCHEDULE": args.schedule, "BINLAKE_INGEST_START_DATE": start.isoformat(),
                "BINLAKE_INGEST_MODE": args.mode, "BINLAKE_SAFE_TS_POLL_S": "1"})
    registry = f"127.0.0.1:{_free_port()}"
    up = subprocess.Popen(
        [sys.executable, "-m", "binlake.cli", "up", "--data-dir", str(root / "state"), "--pumps", "2",
         "--registry-addr", registry, "--pump-port-base", "0",
         "--airflow-port", str(_free_port()), "--spark-connect-port", str(_free_port()),
         "--pump-args=--fake-binlog-interval-s 0.5 --stop-write-at-free-bytes 0"],
        cwd=ROOT, env=env, stdout=(root / "up.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    db = root / "state" / "airflow" / "airflow.db"
    rows: list[tuple[str, str, str, str]] = []
    stop = threading.Event()
    writer_errors: list[BaseException] = []
    writer = threading.Thread(target=_workload, daemon=True, args=(
        registry, root, start, args.rows_per_window / period_s, args.rows_per_txn, stop, writer_errors))
    if args.rows_per_window:
        writer.start()
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
        stop.set()
        if writer.is_alive():
            writer.join(60)
        up.send_signal(signal.SIGINT)
        try:
            up.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    if writer_errors:
        print(f"the workload failed: {writer_errors[0]}", file=sys.stderr)
        return 1
    if len(rows) < args.windows:
        print(f"only {len(rows)} windows published in {args.timeout_s:g}s; see {root}", file=sys.stderr)
        return 1
    fresh, ingest = [], []
    # The row changes each window holds, from the lake's own ledger (read here with delta-rs).
    from binlake import tso
    from binlake.lake.store import arrowread, location

    ledger = arrowread.small_table_rows(location.table_path(str(root / "state" / "lake"), location.WINDOWS),
                                        ["end_ts", "rows"]) or []
    held = {tso.to_datetime(int(w["end_ts"])): int(w["rows"]) for w in ledger}
    print("| window close (UTC) | row changes | ingest s | asset event after close s |")
    print("|---|---:|---:|---:|")
    for end, ing_start, ing_end, event in rows[: args.windows]:
        close = _ts(end)
        f = (_ts(event) - close).total_seconds()
        i = (_ts(ing_end) - _ts(ing_start)).total_seconds()
        fresh.append(f)
        ingest.append(i)
        print(f"| {close:%H:%M:%S} | {held.get(close, '?')} | {i:.1f} | {f:.1f} |")
    if args.rows_per_window:
        print(f"\n~{args.rows_per_window} row changes per window ({args.rows_per_txn} per transaction)", end="")
    print(f"\nmode {args.mode}, schedule {args.schedule}: freshness median {statistics.median(fresh):.1f}s, "
          f"max {max(fresh):.1f}s; ingest step median {statistics.median(ingest):.1f}s")
    shutil.rmtree(root, ignore_errors=True)
    return 0


def _workload(registry: str, root: pathlib.Path, start: dt.datetime, rows_per_s: float, rows_per_txn: int,
              stop: threading.Event, failed: list[BaseException]) -> None:
    """Insert ``rows_per_s`` row changes a second, in transactions of ``rows_per_txn``,
    from ``start`` (the first window's start) until ``stop``."""
    try:
        from binlake.registry.client import RegistryClient
        from binlake.sql.schema import ColumnDef as C
        from binlake.writer.txn_writer import TxnWriter

        deadline = time.monotonic() + 300
        while True:  # the stack's registry and its Pumps come up first
            try:
                with RegistryClient(registry) as reg:
                    if len(reg.list_nodes("pump")[0]) >= 2:
                        break
            except Exception:
                pass
            if time.monotonic() > deadline or stop.wait(1):
                return
        with TxnWriter(f"sqlite:///{root / 'upstream.db'}", registry=registry) as w:
            w.create_table("items", [C("id", "int", nullable=False), C("name", "string", length=32),
                                     C("qty", "int")], ["id"])
            stop.wait(max(0.0, (start - dt.datetime.now(dt.UTC)).total_seconds()))
            began, next_id = time.monotonic(), 0
            while not stop.is_set():
                due = int((time.monotonic() - began) * rows_per_s)
                if next_id + rows_per_txn > due:
                    stop.wait((next_id + rows_per_txn - due) / rows_per_s)
                    continue
                with w.transaction() as txn:
                    for i in range(next_id, next_id + rows_per_txn):
                        txn.insert("items", {"id": i, "name": f"n{i}", "qty": i})
                next_id += rows_per_txn
    except BaseException as exc:  # reported by main
        failed.append(exc)


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
