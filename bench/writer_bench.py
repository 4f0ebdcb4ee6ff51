"""Writer benchmark: committed transactions/s through TxnWriter (binlog on)
against the same transactions on the same database without binlog.

Each transaction updates one row by primary key and inserts one row (an OLTP
write). "binlog on" adds what TxnWriter does: a TSO at begin, reading every
changed row back, the prewrite (acknowledged after a Pump fsync), a TSO for
commit_ts, the status row, the commit binlog. Measured on SQLite (a file),
PostgreSQL and MariaDB (local servers started for the run), with 1 and 8
clients; the plain and binlog databases live in the same server.

Run: ``binlake bench writer`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa
from benchkit import percentile, run_threads

ROOT = pathlib.Path(__file__).resolve().parent.parent
ROWS = 1000


def _columns():
    from binlake.sql.schema import ColumnDef

    return [ColumnDef("id", "int"), ColumnDef("k", "int"), ColumnDef("c", "string", length=120),
            ColumnDef("pad", "string", length=60)]


def _plain_setup(url: str) -> sa.Engine:
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_size": 16}
    engine = sa.create_engine(url, **kwargs)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE plain (id BIGINT PRIMARY KEY, k BIGINT, c VARCHAR(120), pad VARCHAR(60))")
        conn.execute(sa.text("INSERT INTO plain VALUES (:id, :k, :c, :p)"),
                     [{"id": i, "k": i, "c": "x" * 100, "p": "p" * 50} for i in range(ROWS)])
    return engine


def _measure(clients: int, seconds: float, one_txn: Callable[[int, int], None]) -> tuple[float, float, float]:
    """Run ``one_txn(client, n)`` from ``clients`` threads for ``seconds``: (txn/s, p50 ms, p99 ms)."""
    lat: list[list[float]] = [[] for _ in range(clients)]

    def loop(c: int, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            one_txn(c, n)
            lat[c].append(time.perf_counter() - t0)
            n += 1

    elapsed = run_threads(clients, seconds, loop)
    allv = sorted(x for xs in lat for x in xs)
    return len(allv) / elapsed, percentile(allv, 0.5) * 1000, percentile(allv, 0.99) * 1000


def run_db(name: str, url_plain: str, url_binlog: str, registry: str, clients_list: list[int],
           seconds: float) -> list[dict]:
    from binlake.writer.txn_writer import TxnWriter

    rows = []
    plain = _plain_setup(url_plain)
    writer = TxnWriter(url_binlog, registry=registry).start()
    writer.create_table("bench", _columns(), ["id"])
    with writer.transaction() as txn:
        txn.insert_many("bench", [{"id": i, "k": i, "c": "x" * 100, "pad": "p" * 50} for i in range(ROWS)])
    lock = threading.Lock() if name == "sqlite" else None
    ids = itertools.count(10**9)  # next() on a count is atomic in CPython

    def new_id() -> int:
        return next(ids)

    def plain_txn(c: int, n: int) -> None:
        key = (c * 7919 + n) % ROWS
        nid = new_id() * 100 + c

        def body() -> None:
            with plain.begin() as conn:
                conn.execute(sa.text("UPDATE plain SET k = k + 1 WHERE id = :id"), {"id": key})
                conn.execute(sa.text("INSERT INTO plain VALUES (:id, :k, :c, :p)"),
                             {"id": nid, "k": n, "c": "y" * 100, "p": f"p{nid}"})

        if lock is not None:
            with lock:
                body()
        else:
            body()

    def binlog_txn(c: int, n: int) -> None:
        key = (c * 7919 + n) % ROWS
        nid = new_id() * 100 + c
        with writer.transaction() as txn:
            txn.update_where("bench", lambda t: t.c.id == key, {"k": sa.literal_column("k") + 1})
            txn.insert("bench", {"id": nid, "k": n, "c": "y" * 100, "pad": f"p{nid}"})

    for clients in clients_list:
        p = _measure(clients, seconds, plain_txn)
        b = _measure(clients, seconds, binlog_txn)
        rows.append({"db": name, "clients": clients, "plain": p, "binlog": b})
        print(f"  {name:<10} clients={clients}: without binlog {p[0]:8.0f} txn/s (p50 {p[1]:.2f} ms)   "
              f"with binlog {b[0]:8.0f} txn/s (p50 {b[1]:.2f} ms)   ratio {b[0] / p[0]:.2f}", flush=True)
    writer.close()
    plain.dispose()
    return rows


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--seconds", type=float, default=5.0)
        parser.add_argument("--clients", default="1,8")
        args = parser.parse_args()
    try:
        clients = [int(x) for x in args.clients.split(",") if x]
    except ValueError:
        print("bench writer: --clients takes comma-separated integers, e.g. 1,8", file=sys.stderr)
        return 2
    if not clients or min(clients) < 1 or args.seconds <= 0:
        print("bench writer: --clients and --seconds must be positive", file=sys.stderr)
        return 2
    from binlake.stack import localdb
    from binlake.testing.devcluster import DevCluster

    root = pathlib.Path(tempfile.mkdtemp(prefix="writer-bench-", dir=ROOT / "bench"))
    cluster = DevCluster(root / "cluster", pumps=1, pump_args=["--stop-write-at-free-bytes", "0"])
    results = []
    pg = None
    my = None
    try:
        cluster.start()
        results += run_db("sqlite", f"sqlite:///{root}/plain.db", f"sqlite:///{root}/binlog.db",
                          cluster.registry_addr, clients, args.seconds)
        if localdb.LocalPostgres.available():
            # PostgreSQL runs as its own user, who must be able to reach its dir.
            pg_root = pathlib.Path(tempfile.mkdtemp(prefix="writer-bench-pg-"))
            pg_root.chmod(0o755)
            pg = localdb.LocalPostgres(pg_root / "pg").start()
            results += run_db("postgresql", pg.create_database("plain"), pg.create_database("binlog"),
                              cluster.registry_addr, clients, args.seconds)
        else:
            print("  postgresql: server binaries not found; skipped (apt-get install postgresql)")
        if localdb.LocalMariaDB.available():
            my_root = pathlib.Path(tempfile.mkdtemp(prefix="writer-bench-my-"))
            my_root.chmod(0o755)
            my = localdb.LocalMariaDB(my_root / "my").start()
            results += run_db("mariadb", my.create_database("plain"), my.create_database("binlog"),
                              cluster.registry_addr, clients, args.seconds)
        else:
            print("  mariadb: server binaries not found; skipped (apt-get install mariadb-server)")
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.root_dir.parent, ignore_errors=True)
        if my is not None:
            my.stop()
            shutil.rmtree(my.root_dir.parent, ignore_errors=True)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("| database | clients | without binlog txn/s | p50 ms | with binlog txn/s | p50 ms | p99 ms | ratio "
          "| added p50 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p, b = r["plain"], r["binlog"]
        print(f"| {r['db']} | {r['clients']} | {p[0]:.0f} | {p[1]:.2f} | {b[0]:.0f} | {b[1]:.2f} | {b[2]:.2f} | "
              f"{b[0] / p[0]:.2f} | {b[1] - p[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "include"))
    raise SystemExit(main())
