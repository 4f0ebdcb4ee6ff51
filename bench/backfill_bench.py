"""A day of windows backfilled: ``airflow backfill create`` of WINDOWS windows of
``binlake_ingest`` against ``binlake up`` with the always-on Spark (Spark Connect).

Starts ``binlake up`` (registry, two Pumps, the Spark Connect server, Airflow) in
a temporary directory with a SCHEDULE-long ingest window (default 5 minutes),
mode ``connect``, and the DAG's start date far ahead (no scheduled run competes
with the backfill). While Airflow starts, a workload of ROWS row changes is
recorded by the Pumps (``ingest_bench.produce``: sysbench-like rows written with
the Pump API). Then the WINDOWS windows that closed last (the newest holds the
workload; the Pumps hold nothing before they started, so older windows are
empty but must still be planned, waited for, ingested into the ledger and
published, as a backfill of a quiet period is) are backfilled with::

    . <state>/airflow/env.sh
    airflow backfill create --dag-id binlake_ingest --from-date A --to-date B \\
        --max-active-runs C

With ``--rows-per-window N`` every backfilled window holds rows instead: a day's
workload recorded in minutes, N row changes in each of the windows that closed
last, written to the Pumps with start/commit ts back-dated into their windows
(``produce_spread``), before the backfill reads any of them.

Reported, from the stack's Airflow database: the backfill's wall time (the
command to its last run's end), windows a minute, the runs' own durations
(median, max) and the ingest task's; from the lake's ledger (delta-rs): its
rows for the backfilled windows (one each) and the row changes they hold.

Run: ``python bench/backfill_bench.py [--windows 288] [--schedule 5m] [--max-active-runs 4]
[--rows-per-window 1000]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
# Far ahead of any run of this bench: the scheduler makes no run of its own.
START_DATE = "2100-01-01T00:00:00+00:00"
_UNITS = {"s": 1, "m": 60, "h": 3600}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seconds(text: str) -> int:
    if len(text) < 2 or text[-1] not in _UNITS or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration such as 30s, 5m or 1h")
    return int(text[:-1]) * _UNITS[text[-1]]


class _Pumps:
    """What ``ingest_bench.produce`` needs of a cluster: the registry and the Pumps' addresses."""

    def __init__(self, registry: str) -> None:
        from binlake.registry.client import RegistryClient

        self.registry_addr = registry
        with RegistryClient(registry) as reg:
            nodes, _ = reg.list_nodes("pump")
        self.pump_addrs = {n.node_id: n.addr for n in nodes}


def _env_of(env_sh: pathlib.Path) -> dict[str, str]:
    """The variables ``binlake up``'s env.sh exports (the Airflow database among them)."""
    out: dict[str, str] = {}
    for line in env_sh.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export "):].partition("=")
            parts = shlex.split(value)
            out[key] = parts[0] if parts else ""
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=288, help="windows to backfill (default 288: a day of 5m)")
    parser.add_argument("--schedule", type=_seconds, default=300, help="window length (default 5m)")
    parser.add_argument("--max-active-runs", type=int, default=4, help="runs at once (default 4)")
    parser.add_argument("--rows", type=int, default=30_000, help="row changes of the recorded workload")
    parser.add_argument("--rows-per-window", type=int, default=0,
                        help="instead of --rows in the newest window: this many row changes in every window, "
                             "written with commit_ts back-dated into each window (default 0: off)")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    args = parser.parse_args(argv)
    if args.windows < 1 or args.max_active_runs < 1 or args.rows < 0 or args.rows_per_window < 0:
        parser.error("--windows and --max-active-runs must be >= 1, --rows and --rows-per-window >= 0")

    from ingest_bench import _wait_safe, produce

    root = pathlib.Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    root.chmod(0o755)  # the stack's PostgreSQL runs as its own user when this runs as root
    registry = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BINLAKE_"))}
    env.update({"BINLAKE_INGEST_SCHEDULE": f"{args.schedule}s", "BINLAKE_INGEST_START_DATE": START_DATE,
                "BINLAKE_INGEST_MODE": "connect", "BINLAKE_INGEST_MAX_ACTIVE_RUNS": str(args.max_active_runs),
                "BINLAKE_SAFE_TS_POLL_S": "1"})
    up = subprocess.Popen(
        [sys.executable, "-m", "binlake.cli", "up", "--data-dir", str(root / "state"), "--pumps", "2",
         "--registry-addr", registry, "--pump-port-base", "0",
         "--airflow-port", str(_free_port()), "--spark-connect-port", str(_free_port()),
         "--pump-args=--fake-binlog-interval-s 0.5 --stop-write-at-free-bytes 0"],
        cwd=ROOT, env=env, stdout=(root / "up.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    log = root / "up.log"
    try:
        _wait_log(up, log, "preparing Airflow metadata", 180)
        made: dict[str, Any] = {"txns": 0}
        if args.rows_per_window:
            made = produce_spread(_Pumps(registry), args.windows, args.schedule, args.rows_per_window)
            print(f"  recorded {args.rows_per_window} row changes in each of {args.windows} windows "
                  f"({made['txns']} transactions, back-dated)", flush=True)
        elif args.rows:
            made = produce(_Pumps(registry), args.rows, 100)
            print(f"  recorded {args.rows} row changes in {made['txns']} transactions", flush=True)
        _wait_log(up, log, "Press Ctrl-C", 600)
        from binlake import tso

        # The newest window is the one holding the workload's end: wait for it to close
        # and for the Pumps to pass its end.
        step = dt.timedelta(seconds=args.schedule)
        recorded = dt.datetime.now(dt.UTC)
        last_end = made.get("last_end") or dt.datetime.fromtimestamp(
            -(-recorded.timestamp() // args.schedule) * args.schedule, dt.UTC)
        first_start = last_end - args.windows * step
        time.sleep(max(0.0, (last_end - dt.datetime.now(dt.UTC)).total_seconds()))
        _wait_safe(_Pumps(registry), tso.from_datetime(last_end), timeout=120)
        env_sh = root / "state" / "airflow" / "env.sh"
        db_url = _env_of(env_sh)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        _wait_dag(db_url, 180)
        started = dt.datetime.now(dt.UTC)
        done = subprocess.run(
            ["bash", "-c", '. "$0" && exec airflow backfill create "$@"', str(env_sh), "--dag-id", "binlake_ingest",
             "--from-date", first_start.isoformat(), "--to-date", (last_end - step).isoformat(),
             "--max-active-runs", str(args.max_active_runs)],
            cwd=root, env={k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "BINLAKE_"))},
            capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"airflow backfill create exited {done.returncode}:\n{done.stdout}{done.stderr}", file=sys.stderr)
            return 1
        print(f"  backfill created in {(dt.datetime.now(dt.UTC) - started).total_seconds():.1f}s "
              f"({first_start:%H:%M} .. {last_end:%H:%M} UTC)", flush=True)
        runs = _wait_runs(db_url, args.windows, time.monotonic() + args.timeout_s, up)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    if runs is None:
        print(f"the backfill did not finish; see {root}", file=sys.stderr)
        return 1
    _report(args, runs, started, made)
    _report_ledger(root / "state" / "lake", first_start, last_end)
    shutil.rmtree(root, ignore_errors=True)
    return 0


def produce_spread(cluster: _Pumps, windows: int, schedule: int, rows_per_window: int,
                   rows_per_txn: int = 100, seed: int = 1) -> dict[str, Any]:
    """A day's workload recorded in minutes: ``rows_per_window`` row changes in each
    of the ``windows`` windows that will close last (the ones the bench backfills),
    written to the Pumps now with start/commit ts back-dated into their windows
    (transactions spaced evenly through each window, alternating Pumps). A Pump
    stores and serves a transaction by its commit_ts whenever it arrives; nothing
    has read these windows yet, so what they hold is final before the backfill.
    The table's CREATE TABLE comes first, at the first window's start."""
    import grpc
    from ingest_bench import RowFactory, bench_table, workload

    from binlake import rpc, tso
    from binlake.config import GiB
    from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc
    from binlake.registry.client import RegistryClient

    step = dt.timedelta(seconds=schedule)
    now = dt.datetime.now(dt.UTC)
    # Windows that have closed already: no back-dated ts lies ahead of the clock.
    last_end = dt.datetime.fromtimestamp(now.timestamp() // schedule * schedule, dt.UTC)
    first_start = last_end - windows * step
    table = bench_table()
    values, counts = workload(table, RowFactory(table, seed), rows_per_window * windows, rows_per_txn, seed)
    per_window = max(1, -(-rows_per_window // rows_per_txn))
    pumps = sorted(cluster.pump_addrs)
    channels = [grpc.insecure_channel(cluster.pump_addrs[p], options=rpc.client_options(GiB)) for p in pumps]
    stubs = [pump_pb2_grpc.PumpStub(ch) for ch in channels]

    def txn(n: int, at: dt.datetime, value: Any, ddl: tuple[str, Any] | None = None) -> None:
        start = tso.from_datetime(at)
        pre = binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start, prewrite_key=b"bench-writer",
                                prewrite_value=value.SerializeToString())
        if ddl is not None:
            pre.ddl_query = ddl[0].encode()
            pre.ddl_table.CopyFrom(ddl[1])
        stub = stubs[n % len(stubs)]
        stub.WriteBinlog(pump_pb2.WriteBinlogReq(payload=pre.SerializeToString()), timeout=60)
        commit = binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start, commit_ts=start + 1)
        stub.WriteBinlog(pump_pb2.WriteBinlogReq(payload=commit.SerializeToString()), timeout=60)

    try:
        txn(0, first_start + dt.timedelta(milliseconds=1), binlog_pb2.PrewriteValue(schema_version=1),
            ("CREATE TABLE bench.sbtest (...)", table))
        gap = step / (per_window + 1)
        for n, value in enumerate(values):
            w, i = divmod(n, per_window)
            txn(n + 1, first_start + w * step + (i + 1) * gap, value)
    finally:
        for ch in channels:
            ch.close()
    with RegistryClient(cluster.registry_addr) as reg:
        end = reg.get_ts()
    return {"start_ts": tso.from_datetime(first_start), "end_ts": end, "txns": len(values) + 1, "counts": counts,
            "last_end": last_end}


def _report_ledger(lake: pathlib.Path, first: dt.datetime, last: dt.datetime) -> None:
    """What the lake's ledger holds of the backfilled windows (read here with delta-rs):
    one row per window, and the row changes they hold."""
    from binlake import tso
    from binlake.lake.store import arrowread, location

    rows = arrowread.small_table_rows(location.table_path(str(lake), location.WINDOWS),
                                      ["start_ts", "end_ts", "rows"]) or []
    lo, hi = tso.from_datetime(first), tso.from_datetime(last)
    mine = [r for r in rows if lo <= int(r["start_ts"]) and int(r["end_ts"]) <= hi]
    windows = {(int(r["start_ts"]), int(r["end_ts"])) for r in mine}
    counts = sorted(int(r["rows"]) for r in mine)
    print(f"ledger: {len(mine)} rows for {len(windows)} windows, {sum(counts)} row changes "
          f"(a window: min {counts[0] if counts else 0}, max {counts[-1] if counts else 0})")


def _wait_log(up: subprocess.Popen[bytes], log: pathlib.Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if up.poll() is not None:
            raise RuntimeError(f"binlake up exited {up.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"binlake up did not print {text!r} in {timeout:g}s; see {log}")
        time.sleep(1)


def _query(db_url: str, sql: str) -> list[Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql)).fetchall())
    finally:
        engine.dispose()


def _wait_dag(db_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _query(db_url, "SELECT dag_id FROM dag WHERE dag_id = 'binlake_ingest'"):
                return
        except Exception:  # the tables are still being made
            pass
        time.sleep(2)
    raise TimeoutError("the DAG processor did not parse binlake_ingest")


def _wait_runs(db_url: str, windows: int, deadline: float, up: subprocess.Popen[bytes]) -> list[Any] | None:
    """The backfill's runs with their tasks' times, once every run has ended."""
    sql = """
        SELECT r.run_id, r.state, r.start_date, r.end_date, ti.start_date, ti.end_date
        FROM dag_run r LEFT JOIN task_instance ti ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id
             AND ti.task_id = 'ingest_inprocess'
        WHERE r.dag_id = 'binlake_ingest' AND r.run_type = 'backfill'"""
    last_print = 0.0
    while time.monotonic() < deadline and up.poll() is None:
        rows = _query(db_url, sql)
        ended = [r for r in rows if r[1] in ("success", "failed")]
        if time.monotonic() - last_print > 30:
            print(f"  {len(ended)}/{windows} runs ended ({sum(r[1] == 'failed' for r in ended)} failed)", flush=True)
            last_print = time.monotonic()
        if len(rows) >= windows and len(ended) == len(rows):
            return rows
        time.sleep(5)
    return None


def _as_utc(value: Any) -> dt.datetime:
    moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _report(args: argparse.Namespace, runs: list[Any], started: dt.datetime, made: dict[str, Any]) -> None:
    failed = [r for r in runs if r[1] != "success"]
    end = max(_as_utc(r[3]) for r in runs)
    wall = (end - started).total_seconds()
    run_s = [(_as_utc(r[3]) - _as_utc(r[2])).total_seconds() for r in runs if r[2] and r[3]]
    ingest_s = [(_as_utc(r[5]) - _as_utc(r[4])).total_seconds() for r in runs if r[4] and r[5]]
    held = (f"{args.rows_per_window} row changes in each" if args.rows_per_window
            else f"{args.rows} row changes in the newest")
    print(f"\nbackfill of {len(runs)} windows of {args.schedule}s ({held}), "
          f"--max-active-runs {args.max_active_runs}: {wall:.1f}s wall, {len(runs) / wall * 60:.1f} windows a "
          f"minute, {len(failed)} failed")
    print("| what | median s | max s |")
    print("|---|---:|---:|")
    print(f"| a run (plan to publish) | {statistics.median(run_s):.2f} | {max(run_s):.2f} |")
    if ingest_s:
        print(f"| its ingest task | {statistics.median(ingest_s):.2f} | {max(ingest_s):.2f} |")
    per_window = wall / len(runs)
    print(f"\n{per_window:.2f}s a window: {288 * per_window / 60:.1f} min for 288 windows at this rate")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
