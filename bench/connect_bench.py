"""Per-window cost of the ingest task: one Spark application per window
(spark-submit) against the always-on Spark (a Spark Connect server).

Setup: a registry and two Pumps as processes, ROWS row changes written to them
with the Pump API (``ingest_bench.produce``) for each window the runs need, an
empty window of EMPTY_S seconds after them, and one Spark Connect server
started as ``binlake up`` starts it (``binlake.lake.sparkenv.connect_server``). Then,
RUNS times, alternating, for the empty window, the first ROWS window (which
holds the table's DDL) re-ingested into the same lake (the lake exists, the
window replaces itself) and a ROWS window new to the lake each time (what a
scheduled or backfill run ingests):

* ``spark-submit``: the command the ingest DAG's ``ingest`` task runs
  (``spark-submit jobs/ingest.py`` with the Delta jars), a process per window;
* ``connect``: what the ``ingest_inprocess`` task runs in mode ``connect``
  (``ingest_tasks.ingest_window_task``) in a new Python process, as an Airflow
  task process is: interpreter start, imports, a Connect session, the job;
* floor: ``ingest_window`` in this process on a warm Connect session (the
  window's work alone: nothing started).

Optionally (``--backfill N``) N consecutive windows of the ROWS workload are
ingested with ``ingest_window_task`` by ``--concurrency`` workers, as
``airflow backfill create --max-active-runs C`` runs them (without Airflow's
own scheduling delays): once a window per Spark job, once with each task
given the windows after its own as the plan task gives them (``--batch``).

Reported: the best and the median wall time of each, and the ratio to the floor.

Run: ``python bench/connect_bench.py [--rows 30000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
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

_TASK = """
import datetime, json, sys
started = datetime.datetime.now(datetime.UTC)
sys.path.insert(0, {plugins!r})
from binlake_airflow import ingest_tasks
print(json.dumps(ingest_tasks.ingest_window_task(json.loads(sys.argv[1]), progress=lambda m: None,
                                                 run_started=started).get("rows")))
"""


def _spark_submit_args(window: dict[str, Any]) -> list[str]:
    from binlake.lake.sparkenv.connect_server import spark_submit
    from binlake.lake.sparkenv.session import delta_jars

    return [spark_submit(), "--master", "local[*]", "--jars", ",".join(str(p) for p in delta_jars()),
            "--conf", f"spark.pyspark.python={sys.executable}", "--conf", f"spark.pyspark.driver.python={sys.executable}",
            str(ROOT / "jobs" / "ingest.py"), "--start-ts", str(window["start_ts"]), "--end-ts",
            str(window["end_ts"]), "--lake", window["lake"], "--registry", window["registry"]]


def _run(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_000, help="row changes of the full window (default 30000)")
    parser.add_argument("--rows-per-txn", type=int, default=100, help="row changes per transaction (default 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument("--empty-s", type=float, default=3.0, help="length of the empty window in seconds (default 3)")
    parser.add_argument("--backfill", type=int, default=0, help="also ingest this many consecutive windows")
    parser.add_argument("--concurrency", type=int, default=4, help="backfill windows at once (default 4)")
    parser.add_argument("--batch", type=int, default=12,
                        help="the backfill again with each task taking up to this many due windows (default 12)")
    parser.add_argument("--skip-spark-submit", action="store_true", help="measure only the always-on Spark")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.runs < 1 or args.empty_s <= 0 or args.backfill < 0 or args.concurrency < 1:
        parser.error("--rows, --runs, --concurrency must be >= 1, --empty-s > 0, --backfill >= 0")

    from ingest_bench import _wait_safe, produce

    from binlake import tso
    from binlake.lake.ingest import ingest_window
    from binlake.lake.sparkenv import connect
    from binlake.lake.sparkenv.connect_server import ConnectServer, server_env
    from binlake.testing.devcluster import DevCluster, free_port

    root = pathlib.Path(tempfile.mkdtemp(prefix="connect-bench-"))
    cluster = DevCluster(root / "cluster", pumps=2,
                         pump_args=["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.5"])
    server = ConnectServer(free_port(), root / "connect.log")
    env = server_env()
    env[connect.REMOTE_ENV] = server.url
    try:
        cluster.start()
        # A window for the re-ingest case, one new window per case and run, and a
        # spare (the last window cut holds what is left over).
        fresh = args.runs * (2 if args.skip_spark_submit else 3)
        made = produce(cluster, args.rows * (2 + fresh), args.rows_per_txn)
        empty_start = tso.compose(int(time.time() * 1000) + 1000, 0)
        empty_end = tso.compose(int((time.time() + 1 + args.empty_s) * 1000), 0)
        _wait_safe(cluster, max(made["end_ts"], empty_end), timeout=120)
        t0 = time.perf_counter()
        server.start()
        print(f"  Spark Connect server up in {time.perf_counter() - t0:.1f}s", flush=True)
        lake = str(root / "lake")
        cuts = _cuts(cluster, made, args.rows)
        first = {"start_ts": cuts[0], "end_ts": cuts[1]}
        new_windows = [{"start_ts": a, "end_ts": b} for a, b in zip(cuts[1:], cuts[2:], strict=False)][:fresh]
        windows = {"empty": {"start_ts": empty_start, "end_ts": empty_end},
                   f"{args.rows} rows": first}
        for w in [*windows.values(), *new_windows]:
            # As the plan task gives them (its settings ride with the window).
            w.update(lake=lake, registry=cluster.registry_addr, mode="connect", batch_windows=1,
                     batch_max_rows=100_000)
        warm = connect.connect(server.url, "binlake-bench-floor")
        for w in windows.values():  # the lake exists and every window was ingested once
            ingest_window(warm, lake, cluster.registry_addr, w["start_ts"], w["end_ts"])
        new_name = f"{args.rows} rows, new"
        windows[new_name] = new_windows[0]
        times: dict[tuple[str, str], list[float]] = {}
        task = [sys.executable, "-c", _TASK.format(plugins=str(ROOT / "plugins"))]
        for run in range(args.runs):
            for name, w in windows.items():
                cases = [("floor (warm session, no start)", None), ("connect (always-on)", task + [json.dumps(w)])]
                if not args.skip_spark_submit:
                    cases.append(("spark-submit per window", _spark_submit_args(w)))
                for case, command in cases:
                    if name == new_name:  # a window the lake does not hold yet, each time
                        w = new_windows.pop(0)
                        command = None if command is None else (
                            _spark_submit_args(w) if case.startswith("spark-submit") else task + [json.dumps(w)])
                    if command is None:
                        t0 = time.perf_counter()
                        ingest_window(warm, lake, cluster.registry_addr, w["start_ts"], w["end_ts"])
                        elapsed = time.perf_counter() - t0
                    else:
                        elapsed = _run(command, env)
                    times.setdefault((name, case), []).append(elapsed)
                    print(f"  run {run + 1} {name:>12} {case:<32} {elapsed:6.2f}s", flush=True)
        print("\n| window | how | best s | median s | ratio to floor (best) |")
        print("|---|---|---:|---:|---:|")
        for name in windows:
            floor = min(times[(name, "floor (warm session, no start)")])
            for (n, case), values in times.items():
                if n == name:
                    print(f"| {name} | {case} | {min(values):.2f} | {statistics.median(values):.2f} | "
                          f"{min(values) / floor:.1f} |")
        if args.backfill:
            _backfill(args, first, cluster.registry_addr, root, task, env)
        warm.stop()
    finally:
        try:
            server.stop()
        finally:  # the Pumps go whatever the server's stop did
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _cuts(cluster: Any, made: dict[str, Any], rows: int) -> list[int]:
    """Window bounds over the produced transactions, a window every ``rows`` row
    changes (cut at transaction bounds: the planning scan's per-mutation counts)."""
    from binlake.lake.pumps.window_index import index_window

    index = index_window(cluster.pump_addrs, made["start_ts"], made["end_ts"])
    per_ts: dict[int, int] = {}
    for commit_ts, _table, ins, upd, dele in index.mutations:
        per_ts[commit_ts] = per_ts.get(commit_ts, 0) + ins + upd + dele
    cuts, seen = [made["start_ts"]], 0
    for commit_ts in sorted(per_ts):
        if seen >= rows:
            cuts.append(commit_ts)
            seen = 0
        seen += per_ts[commit_ts]
    cuts.append(made["end_ts"])
    return cuts


def _backfill(args: argparse.Namespace, made: dict[str, Any], registry: str, root: pathlib.Path,
              task: list[str], env: dict[str, str]) -> None:
    lake = str(root / "backfill-lake")
    step = (made["end_ts"] - made["start_ts"]) // args.backfill + 1
    bounds = [made["start_ts"] + i * step for i in range(args.backfill)] + [made["end_ts"]]
    windows = [{"start_ts": a, "end_ts": b, "lake": lake, "registry": registry, "mode": "connect",
                "batch_max_rows": 100_000} for a, b in zip(bounds, bounds[1:], strict=False)]
    for batch in sorted({1, max(1, args.batch)}):
        lake = str(root / f"backfill-lake-{batch}")
        for i, w in enumerate(windows):
            w["lake"] = lake
            w["batch_windows"] = batch
            # What the plan task gives a run: the closed windows after its own.
            w["following"] = [[x["start_ts"], x["end_ts"]] for x in windows[i + 1:i + batch]]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(lambda w: _run(task + [json.dumps(w)], env), windows))
        elapsed = time.perf_counter() - t0
        print(f"\nbackfill: {len(windows)} windows ({args.rows} row changes in all), {args.concurrency} at once, "
              f"a task process each, up to {batch} window(s) a Spark job: {elapsed:.1f}s "
              f"({elapsed / len(windows):.2f}s a window)", flush=True)


if __name__ == "__main__":
    # A SIGTERM runs the cleanup (the server and the Pumps are in their own sessions).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise SystemExit(main())
