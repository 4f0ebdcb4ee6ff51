"""Drill benchmark: a restore drill of TABLES tables holding ROWS rows in all.

Setup (not timed): a synthetic lake (``restore.synthetic``: no Pumps; ROWS inserts
then ROWS updates spread over TABLES tables, five windows), a snapshot at 90 % of
its history (proven against the whole history when taken) and the history tables; a
lake kept by an earlier run (``--dir DIR --keep``) is reused. Then one ``binlake drill`` of every table at
the lake's last commit_ts into a scratch SQLite file, with proof (b) (the whole
history, the snapshot path and the history tables against the scratch target)
and the RTO and RPO figures.

Reported: the restore's seconds (the RTO), rows/s and GB/h, the drill's seconds,
the seconds spent proving and their ratio to the restore (the target: proving
costs no more than the restore itself). Run: ``binlake bench drill [--tables 10 --rows 100000]``.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
import time


def main(args: argparse.Namespace) -> int:
    from binlake.drill import run as drill_run
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.restore import history, snapshot, synthetic

    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="drill-bench-", dir=pathlib.Path(__file__).parent))
    root.mkdir(parents=True, exist_ok=True)
    lake = str(root / "lake")
    spark = build_spark("binlake-bench-drill", args.master, extra_conf=LAKE_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        began = time.monotonic()
        if (pathlib.Path(lake) / "windows").is_dir() and snapshot.catalog(spark, lake):
            # A lake kept by an earlier run (--dir DIR --keep): its setup is not redone.
            from binlake.lake import freshness

            last = max(e for _s, e in freshness.ledger(lake)) - 1
            print(f"setup: reusing the lake in {root} (its tables and rows, not --tables/--rows)")
        else:
            t0 = int(time.time() * 1000 - 3_600_000) << 18
            last = synthetic.build_lake(spark, lake, args.rows, 2 * args.rows, t0, tables=args.tables)
            s_ts = t0 + int((last - t0) * 0.9)
            took = time.monotonic()
            snapshot.take(spark, lake, s_ts)
            print(f"snapshot at 90 % of the history (proven against the whole history when taken) in "
                  f"{time.monotonic() - took:.0f}s")
            history.update(spark, lake)
            print(f"setup: {args.tables} tables, {args.rows:,} rows, {2 * args.rows:,} changes in "
                  f"{time.monotonic() - began:.0f}s")
        d = drill_run.run(spark, lake, ts=last, tables=None, seed=1, count=args.tables, rpo_objective_s=1e9,
                          rto_objective_s=1e9, progress=lambda m: print(f"  {m}", flush=True))
        print(d.summary())
        print("\n| tables | rows | restore s (RTO) | rows/s | GB/h | proving s | proving ÷ restore | drill s |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(f"| {args.tables} | {d.rows:,} | {d.restore_s:.1f} | {d.rows_per_s:,.0f} | {d.gb_per_h:.3f} | "
              f"{d.proving_s:.1f} | {d.proving_s / d.restore_s:.2f} | {d.drill_s:.1f} |")
    finally:
        spark.stop()
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0
