"""Ingest benchmark: row changes/s from three Pumps into the Delta change table,
against the same rows written by the same Spark session from a local Parquet
file to Delta (the limit of Spark + Delta on this machine).

Setup: a registry and three Pumps as processes. ROWS row changes (70 %
inserts, 20 % updates with before and after images - each changing one column,
``k`` or ``c``, as sysbench's index and non-index updates -, 10 % deletes) of one
sysbench-like table are written straight to the Pumps with the Pump API in
transactions of ROWS_PER_TXN rows, round-robin over the Pumps (no SQL: the
upstream is not what is measured). Then, RUNS times each, alternating:

* ingest: ``ingest_window`` of the whole window into a fresh lake (plan, scan,
  read + decode in the data source, Delta write, counts, windows row);
* baseline: the rows that ingest wrote, exported once to a local Parquet file,
  read and written to a fresh Delta table with the same partitioning.

Reported: the best run of each, row changes/s, the ratio ingest/baseline, and
peak memory sampled every 50 ms during the ingest runs: the driver's Python
process RSS and the whole process tree's (driver Python + JVM + Python
workers).

Run: ``binlake bench ingest`` (or ``make bench``).

``--lake s3://BUCKET/PREFIX`` adds a third case to every run: the same ingest into
a fresh lake under that S3 prefix (endpoint and keys from AWS_* / [lake.s3]),
reported beside the local-disk ingest of the same run (ratio S3/local).
``--seaweedfs`` starts a throwaway SeaweedFS on loopback for it
(``binlake.testing.s3server``) instead of using a configured endpoint.

``--decode-only`` measures just the decoding step instead (no Pumps, no Spark):
CPU time of ``ChangeDecoder.add`` per row change on the same rows, with the
pure-Python path and with the native extension (``binlake.lake.decoding._imagec``),
alone and followed by the Arrow batch the data source builds. CPU time
(``time.process_time``), best of ``--runs``, so other load on the machine
matters less than for wall-clock figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import pathlib
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
POOL = 4096  # distinct row bodies; every row still gets its own primary key


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: tag byte, length, payload."""
    return bytes([tag]) + _varint(len(payload)) + payload


def bench_table() -> Any:
    from binlake.sql.schema import ColumnDef, new_table

    cols = [ColumnDef("id", "int", False), ColumnDef("k", "int", False), ColumnDef("c", "string", False, length=120),
            ColumnDef("pad", "string", True, length=60), ColumnDef("price", "decimal", False, precision=12, scale=2),
            ColumnDef("ts", "datetime", False), ColumnDef("note", "string", True), ColumnDef("doc", "json", True)]
    return new_table(100, "bench", "sbtest", cols, ["id"], None, 1)


class RowFactory:
    """Serialized Rows with a given primary key, fast: a pool of encoded row
    bodies (every column but ``id``) with the ``id`` column prepended.
    A Row is a sequence of length-delimited Column entries, so concatenation
    of entries is a valid Row."""

    def __init__(self, table: Any, seed: int) -> None:
        from binlake import codec
        from binlake.proto import binlog_pb2

        # The tags of a Row's entries and an UpdatedRow's two rows (binlog.proto's).
        self.row_tag = codec.wire_tag(binlog_pb2.Row, "columns")
        self.old_tag = codec.wire_tag(binlog_pb2.UpdatedRow, "old")
        self.new_tag = codec.wire_tag(binlog_pb2.UpdatedRow, "new")
        rng = random.Random(seed)
        alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 é漢"
        self.bodies: list[bytes] = []
        # The same bodies with one column changed: sysbench's index update (k) and
        # non-index update (c), as an OLTP update changes a column or two, not the row.
        self.bodies_k: list[bytes] = []
        self.bodies_c: list[bytes] = []
        body_cols = [c for c in table.columns if c.name != "id"]
        for _ in range(POOL):
            values = {
                "k": rng.randrange(10**9), "c": "".join(rng.choices(alphabet, k=rng.randint(60, 120))),
                "pad": None if rng.random() < 0.2 else "".join(rng.choices(alphabet, k=40)),
                "price": decimal.Decimal(rng.randrange(10**10)).scaleb(-2),
                "ts": dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.randrange(10**15)),
                "note": None if rng.random() < 0.5 else "".join(rng.choices(alphabet, k=rng.randint(0, 40))),
                "doc": None if rng.random() < 0.3 else {"n": rng.randrange(1000), "tags": ["a", "b"][: rng.randint(0, 2)]},
            }
            for pool, changed in ((self.bodies, {}), (self.bodies_k, {"k": values["k"] + 1}),
                                  (self.bodies_c, {"c": values["c"][::-1]})):
                row = {**values, **changed}
                pool.append(b"".join(
                    _field(self.row_tag, codec_column(c.id, codec.encode_value(row[c.name], c.type, c.name)))
                    for c in body_cols))
        self.id_col = table.columns[0].id

    def row(self, key: int, variant: int, bodies: list[bytes] | None = None) -> bytes:
        from binlake.proto import binlog_pb2

        id_entry = _field(self.row_tag, codec_column(self.id_col, binlog_pb2.Datum(int_value=key)))
        return id_entry + (bodies or self.bodies)[variant % POOL]

    def update(self, key: int, variant: int, column: str) -> bytes:
        """An UpdatedRow of ``key`` changing one column (``k`` or ``c``)."""
        new = self.bodies_k if column == "k" else self.bodies_c
        return _field(self.old_tag, self.row(key, variant)) + _field(self.new_tag, self.row(key, variant, new))


def codec_column(col_id: int, datum: Any) -> bytes:
    from binlake.proto import binlog_pb2

    return binlog_pb2.Column(id=col_id, value=datum).SerializeToString()


def workload(table: Any, factory: RowFactory, rows: int, rows_per_txn: int,
             seed: int = 1) -> tuple[list[Any], dict[str, int]]:
    """The benchmark's transactions as PrewriteValues (one TableMutation each) and
    the count of each kind of row change."""
    from binlake.proto import binlog_pb2

    counts = {"insert": 0, "update": 0, "delete": 0}
    rng = random.Random(seed)
    live: list[int] = []
    next_key = 1
    values: list[Any] = []
    done = 0
    while done < rows:
        size = min(rows_per_txn, rows - done)
        m = binlog_pb2.TableMutation(table_id=table.table_id)
        for _ in range(size):
            r = rng.random()
            if r < 0.7 or len(live) < 100:
                m.inserted_rows.append(factory.row(next_key, rng.randrange(POOL)))
                m.sequence.append(binlog_pb2.INSERT)
                live.append(next_key)
                next_key += 1
                counts["insert"] += 1
            elif r < 0.9:
                key = live[rng.randrange(len(live))]
                m.updated_rows.append(factory.update(key, rng.randrange(POOL), "k" if rng.random() < 0.5 else "c"))
                m.sequence.append(binlog_pb2.UPDATE)
                counts["update"] += 1
            else:
                i = rng.randrange(len(live))
                key = live[i]
                live[i] = live[-1]
                live.pop()
                m.deleted_rows.append(factory.row(key, rng.randrange(POOL)))
                m.sequence.append(binlog_pb2.DELETE_ROW)
                counts["delete"] += 1
        values.append(binlog_pb2.PrewriteValue(schema_version=1, mutations=[m]))
        done += size
    return values, counts


def produce(cluster: Any, rows: int, rows_per_txn: int, seed: int = 1) -> dict[str, Any]:
    """Write ``rows`` row changes to the cluster's Pumps; return the window and counts."""
    import grpc

    from binlake import rpc
    from binlake.config import GiB
    from binlake.proto import binlog_pb2, pump_pb2, pump_pb2_grpc
    from binlake.registry.client import RegistryClient

    table = bench_table()
    factory = RowFactory(table, seed)
    pumps = sorted(cluster.pump_addrs)
    reg = RegistryClient(cluster.registry_addr)
    channels = {p: grpc.insecure_channel(cluster.pump_addrs[p], options=rpc.client_options(GiB)) for p in pumps}
    stubs = {p: pump_pb2_grpc.PumpStub(ch) for p, ch in channels.items()}

    def write(pump: str, binlog: Any) -> None:
        stubs[pump].WriteBinlog(pump_pb2.WriteBinlogReq(payload=binlog.SerializeToString()), timeout=60)

    def txn(pump: str, value: Any, ddl: tuple[str, Any] | None = None) -> tuple[int, int]:
        start = reg.get_ts()
        pre = binlog_pb2.Binlog(tp=binlog_pb2.PREWRITE, start_ts=start, prewrite_key=b"bench-writer",
                                prewrite_value=value.SerializeToString())
        if ddl is not None:
            pre.ddl_query = ddl[0].encode()
            pre.ddl_table.CopyFrom(ddl[1])
        write(pump, pre)
        commit = reg.get_ts()
        write(pump, binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=start, commit_ts=commit))
        return start, commit

    first, _ = txn(pumps[0], binlog_pb2.PrewriteValue(schema_version=1), ("CREATE TABLE bench.sbtest (...)", table))
    values, counts = workload(table, factory, rows, rows_per_txn, seed)
    plans = [(pumps[n % len(pumps)], value) for n, value in enumerate(values)]

    last = [0]

    def writer(pump: str) -> None:
        for p, value in plans:
            if p == pump:
                _, commit = txn(pump, value)
                last[0] = max(last[0], commit)

    threads = [threading.Thread(target=writer, args=(p,)) for p in pumps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = reg.get_ts()
    reg.close()
    for ch in channels.values():
        ch.close()
    return {"start_ts": first, "end_ts": end, "txns": len(plans) + 1, "counts": counts}


class PeakRSS:
    """Samples the RSS of this process and of its whole process tree."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.driver = 0
        self.tree = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            try:
                own = me.memory_info().rss
                total = own
                for child in me.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                own = total = 0
            self.driver = max(self.driver, own)
            self.tree = max(self.tree, total)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRSS:
        try:
            import psutil  # noqa: F401
        except ImportError:
            return self  # no sampling without psutil; the caller falls back to getrusage
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.driver:
            import resource

            self.driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def decode_only(args: argparse.Namespace) -> int:
    """``--decode-only``: CPU µs per row change of ChangeDecoder.add (and of add +
    the Arrow batch), Python path vs native, on the benchmark's own rows."""
    from binlake.lake.decoding.arrow_batches import BATCH_ROWS, changes_batch
    from binlake.lake.decoding.change_decoder import ChangeDecoder
    from binlake.lake.decoding.native import native_available, native_import_error
    from binlake.lake.decoding.schema_history import SchemaHistory
    from binlake.proto import binlog_pb2
    from binlake.tso import compose

    table = bench_table()
    values, counts = workload(table, RowFactory(table, 1), args.rows, args.rows_per_txn)
    base = compose(1_795_000_000_000)
    txns = [binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=base + 2 * i, commit_ts=base + 2 * i + 1,
                              prewrite_value=v.SerializeToString()) for i, v in enumerate(values)]
    del values
    history = SchemaHistory.from_tables([table])
    modes = [("python", False)]
    if native_available():
        modes.append(("native", True))
    else:
        print(f"  the native decoder is not built ({native_import_error()}): Python path only",
              file=sys.stderr)

    # The two paths must agree before their speed means anything (a sample of transactions).
    sample = txns[: max(1, 20_000 // args.rows_per_txn)]
    outputs = []
    for _, native in modes:
        decoder = ChangeDecoder(history, "pump1", native=native)
        for txn in sample:
            decoder.add(txn)
        outputs.append(decoder.take())
    if any(out != outputs[0] for out in outputs):
        print("bench ingest --decode-only: the native and Python paths disagree", file=sys.stderr)
        return 1

    def run(native: bool, arrow: bool) -> float:
        decoder = ChangeDecoder(history, "pump1", native=native)
        t0 = time.process_time()
        for txn in txns:
            decoder.add(txn)
            if len(decoder) >= BATCH_ROWS:
                cols = decoder.take()
                if arrow:
                    changes_batch(cols)
        cols = decoder.take()
        if arrow and cols["seq"]:
            changes_batch(cols)
        return time.process_time() - t0

    best: dict[tuple[str, bool], float] = {}
    for r in range(args.runs):
        for name, native in modes:
            for arrow in (False, True):
                cpu = run(native, arrow)
                best[name, arrow] = min(best.get((name, arrow), cpu), cpu)
                print(f"  run {r + 1} {name:6s} {'decode + Arrow' if arrow else 'decode':14s} "
                      f"{cpu:6.2f} s CPU, {cpu / args.rows * 1e6:5.2f} µs/row change", flush=True)
    print()
    print(f"{args.rows:,} row changes ({counts}), {len(txns)} transactions; CPU time, best of {args.runs}")
    print()
    print("| path | decode CPU s | decode µs/row change | decode + Arrow batch µs/row change | speed-up (decode) |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in modes:
        cpu = best[name, False]
        print(f"| {name} | {cpu:.2f} | {cpu / args.rows * 1e6:.2f} | {best[name, True] / args.rows * 1e6:.2f} | "
              f"{best['python', False] / cpu:.1f}x |")
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--rows", type=int, default=1_000_000)
        parser.add_argument("--rows-per-txn", type=int, default=2000)
        parser.add_argument("--runs", type=int, default=2)
        parser.add_argument("--master", default=None)
        parser.add_argument("--dir", default=None)
        parser.add_argument("--decode-only", action="store_true")
        parser.add_argument("--lake", default=None)
        parser.add_argument("--seaweedfs", action="store_true")
        args = parser.parse_args()
    if args.rows < 1 or args.rows_per_txn < 1 or args.runs < 1:
        print("bench ingest: --rows, --rows-per-txn and --runs must be positive", file=sys.stderr)
        return 2
    if getattr(args, "decode_only", False):
        return decode_only(args)
    from binlake.lake.ingest import ingest_window
    from binlake.lake.sparkenv.session import build_spark
    from binlake.testing.devcluster import DevCluster

    base = pathlib.Path(args.dir) if args.dir else ROOT / "bench"
    base.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(tempfile.mkdtemp(prefix="ingest-bench-", dir=base))
    s3_lake = getattr(args, "lake", None)
    store = None
    if s3_lake is not None:
        import os

        from binlake.lake.store import location
        from binlake.lake.store import s3 as lake_s3

        where = location.parse(s3_lake, "--lake")
        if not where.is_s3:
            print("bench ingest: --lake must be s3://BUCKET/PREFIX (the local lake is always measured)",
                  file=sys.stderr)
            return 2
        if getattr(args, "seaweedfs", False):
            from binlake.testing.s3server import LocalS3

            store = LocalS3(root / "seaweedfs", buckets=(str(where.bucket),)).start()
            os.environ.update(store.env())
        lake_s3.probe(s3_lake)
    cluster = DevCluster(root / "cluster", pumps=3,
                         pump_args=["--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.5"])
    s3_s: list[float] = []
    try:
        cluster.start()
        t0 = time.perf_counter()
        made = produce(cluster, args.rows, args.rows_per_txn)
        print(f"  wrote {args.rows:,} row changes in {made['txns']} transactions to 3 pumps in "
              f"{time.perf_counter() - t0:.1f}s ({made['counts']})", flush=True)
        _wait_safe(cluster, made["end_ts"])
        spark = build_spark("binlake-bench-ingest", args.master,
                            extra_conf={"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        ingest_s: list[float] = []
        base_s: list[float] = []
        peaks: list[PeakRSS] = []
        parquet = root / "rows.parquet"
        for run in range(args.runs):
            lake = root / f"lake{run}"
            # With an S3 lake, odd runs ingest into it first: neither case always
            # gets the warmer JVM and Pump caches.
            if s3_lake is not None and run % 2 == 1 and not _ingest_s3(spark, s3_lake, run, cluster, made, args, s3_s):
                return 1
            with PeakRSS() as peak:
                t0 = time.perf_counter()
                result = ingest_window(spark, str(lake), cluster.registry_addr, made["start_ts"], made["end_ts"])
                ingest_s.append(time.perf_counter() - t0)
            peaks.append(peak)
            if result.rows != args.rows:
                print(f"bench ingest: the lake holds {result.rows} row changes, expected {args.rows}", file=sys.stderr)
                return 1
            print(f"  ingest run {run + 1}: {ingest_s[-1]:.1f}s, {args.rows / ingest_s[-1]:,.0f} row changes/s, "
                  f"peak RSS driver {_mib(peak.driver)}, process tree {_mib(peak.tree)}", flush=True)
            if s3_lake is not None and run % 2 == 0 and not _ingest_s3(spark, s3_lake, run, cluster, made, args, s3_s):
                return 1
            if run == 0:
                spark.read.format("delta").load(str(lake / "changes")).write.parquet(str(parquet))
            out = root / f"baseline{run}"
            t0 = time.perf_counter()
            spark.read.parquet(str(parquet)).write.format("delta").partitionBy("commit_date").save(str(out))
            base_s.append(time.perf_counter() - t0)
            print(f"  baseline run {run + 1}: {base_s[-1]:.1f}s, {args.rows / base_s[-1]:,.0f} rows/s", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            if run:
                shutil.rmtree(lake, ignore_errors=True)
        size = sum(f.stat().st_size for f in (root / "lake0" / "changes").rglob("*.parquet"))
        spark.stop()
    finally:
        cluster.stop()
        if store is not None:
            store.stop()
        shutil.rmtree(root, ignore_errors=True)
    best_i, best_b = min(ingest_s), min(base_s)
    rate_i, rate_b = args.rows / best_i, args.rows / best_b
    peak_driver = max(p.driver for p in peaks)
    peak_tree = max(p.tree for p in peaks)
    print()
    print("| row changes | pumps | txns | ingest s | row changes/s | Parquet->Delta s | rows/s | ratio | "
          "peak RSS driver | peak RSS tree | changes on disk |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.rows:,} | 3 | {made['txns']} | {best_i:.1f} | {rate_i:,.0f} | {best_b:.1f} | {rate_b:,.0f} | "
          f"{rate_i / rate_b:.2f} | {_mib(peak_driver)} | {_mib(peak_tree)} | {_mib(size)} |")
    if s3_s:
        best_s = min(s3_s)
        print()
        print("| row changes | local-disk lake s | row changes/s | S3 lake s | row changes/s | S3 / local |")
        print("|---:|---:|---:|---:|---:|---:|")
        print(f"| {args.rows:,} | {best_i:.1f} | {rate_i:,.0f} | {best_s:.1f} | {args.rows / best_s:,.0f} | "
              f"{best_i / best_s:.2f} |")
    return 0


def _ingest_s3(spark: Any, s3_lake: str, run: int, cluster: Any, made: dict[str, Any], args: argparse.Namespace,
               seconds: list[float]) -> bool:
    """One ingest of the whole window into a fresh lake under the S3 prefix."""
    from binlake.lake.ingest import ingest_window

    target = f"{s3_lake.rstrip('/')}/run{run}"
    t0 = time.perf_counter()
    result = ingest_window(spark, target, cluster.registry_addr, made["start_ts"], made["end_ts"])
    seconds.append(time.perf_counter() - t0)
    if result.rows != args.rows:
        print(f"bench ingest: the S3 lake holds {result.rows} row changes, expected {args.rows}", file=sys.stderr)
        return False
    print(f"  ingest run {run + 1} into {target}: {seconds[-1]:.1f}s, {args.rows / seconds[-1]:,.0f} row changes/s",
          flush=True)
    return True


def _wait_safe(cluster: Any, ts: int, timeout: float = 60.0) -> None:
    import grpc

    from binlake.proto import pump_pb2, pump_pb2_grpc

    deadline = time.monotonic() + timeout
    for addr in cluster.pump_addrs.values():
        with grpc.insecure_channel(addr) as ch:
            stub = pump_pb2_grpc.PumpStub(ch)
            while stub.Status(pump_pb2.StatusReq(), timeout=5).safe_ts < ts:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pump at {addr} did not pass ts {ts} within {timeout:g}s")
                time.sleep(0.1)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "include"))
    raise SystemExit(main())
