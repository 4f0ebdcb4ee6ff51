"""Benchmark of ``binlake source mysql --start snapshot``: how long the initial
snapshot of a table takes to reach a Pump (prewrites, the all-or-none group
decision, commits), against two baselines measured in the same run on the same
table: ``mariadb-dump --single-transaction`` to /dev/null (C, the usual way to
copy a consistent snapshot) and a bare ``SELECT *`` through PyMySQL (the read
alone, the floor for a Python reader).

    python bench/snapshot_bench.py --rows 100000
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000, help="rows in the table (default 100000)")
    ap.add_argument("--batch", type=int, default=10_000, help="rows per snapshot transaction (default 10000)")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.batch < 1:
        print("--rows and --batch must be positive", file=sys.stderr)
        return 2
    import pymysql
    import pymysql.cursors

    from binlake import config
    from binlake.pump.node import PumpNode
    from binlake.registry.server import RegistryServer
    from binlake.source.mysql.source import MySQLSource
    from binlake.stack.localdb import LocalMariaDB

    if not LocalMariaDB.available():
        print("MariaDB is not installed (apt-get install mariadb-server): nothing to measure", file=sys.stderr)
        return 2
    base = pathlib.Path(tempfile.mkdtemp(prefix="snapshot-"))  # scratch, removed below
    server = LocalMariaDB(base / "mariadb", binlog=True).start()
    try:
        conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("CREATE TABLE bench.sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c CHAR(120) NOT NULL, "
                        "pad CHAR(60) NOT NULL)")
            for a in range(0, args.rows, 10_000):
                cur.execute("INSERT INTO bench.sbtest VALUES " + ",".join(
                    f"({i}, {i * 7 % 100000}, '{i:0>120}', '{i:x>60}')" for i in range(a, min(args.rows, a + 10_000))))
        results: list[tuple[str, float]] = []
        dump = shutil.which("mariadb-dump") or shutil.which("mysqldump")
        if dump:
            t0 = time.perf_counter()
            subprocess.run([dump, "-h127.0.0.1", f"-P{server.port}", "-uroot", "--single-transaction", "bench"],
                           stdout=subprocess.DEVNULL, check=True)
            results.append(("mariadb-dump --single-transaction (C, to /dev/null)", time.perf_counter() - t0))
        t0 = time.perf_counter()
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute("SELECT * FROM bench.sbtest")
            n = sum(1 for _ in cur)
        assert n == args.rows
        results.append(("SELECT * via PyMySQL (read only)", time.perf_counter() - t0))
        conn.close()
        reg = RegistryServer(config.load(config.RegistrySettings, data_dir=base / "registry",
                                         addr="127.0.0.1:0")).start()
        pump = PumpNode(config.load(config.PumpSettings, registry=reg.addr, data_dir=base / "pump",
                                    addr="127.0.0.1:0", node_id="p1", stop_write_at_free_bytes=0)).start()
        try:
            src = MySQLSource(f"mysql://root@127.0.0.1:{server.port}", server_id=77, registry=reg.addr,
                              data_dir=str(base / "src"), tables="bench.*", start="snapshot",
                              snapshot_batch_rows=args.batch)
            th = threading.Thread(target=src.run, daemon=True)
            t0 = time.perf_counter()
            th.start()
            if not src.ready.wait(3600):
                print("the snapshot did not finish within an hour", file=sys.stderr)
                return 1
            results.append((f"binlake snapshot -> 1 Pump ({args.batch} rows/txn, fsync'ed)", time.perf_counter() - t0))
            src.stop()
            th.join(60)
        finally:
            pump.stop(grace=0.5)
            reg.stop(grace=0.5)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    first = results[0][1]
    print(f"| reader | rows | seconds | rows/s | time ratio to {results[0][0].split(' ')[0]} |")
    print("|---|---:|---:|---:|---:|")
    for name, s in results:
        print(f"| {name} | {args.rows} | {s:.2f} | {args.rows / s:,.0f} | {s / first:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
