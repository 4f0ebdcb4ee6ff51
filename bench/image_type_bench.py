"""Image type benchmark: before/after images as JSON strings vs Spark 4 VARIANT.

The same change rows (ROWS row changes of the ingest benchmark's sysbench-like
table: 70 % inserts, 20 % updates, 10 % deletes, decoded by binlake's decoder)
are written to two Delta tables: images as the JSON text the decoder makes,
and images converted with ``parse_json`` to VARIANT. Measured (best of RUNS,
after one warm-up): write time from a local Parquet file, size on disk, and
typical reads:

* point: the change rows of one key (``keys = '{"id":N}'``), one field of the
  after image extracted;
* scan: one field extracted from every after image and aggregated (what an
  expression filter or a per-column check does over a window);
* python: 20,000 after images collected into Python dicts (what an apply
  task does with a window's final images).

Run: ``python bench/image_type_bench.py [--rows 200000]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import shutil
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent


def make_rows(rows: int, path: pathlib.Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(ROOT / "bench"))
    from ingest_bench import POOL, RowFactory, bench_table

    from binlake import tso
    from binlake.lake.decoding.arrow_batches import changes_batch
    from binlake.lake.decoding.change_decoder import ChangeDecoder
    from binlake.lake.decoding.schema_history import SchemaHistory
    from binlake.proto import binlog_pb2

    table = bench_table()
    factory = RowFactory(table, 7)
    history = SchemaHistory.from_tables([table])
    decoder = ChangeDecoder(history, "pump1")
    rng = random.Random(7)
    ts = tso.compose(int(time.time() * 1000))
    batches = []
    key = 0
    for t in range(rows // 1000):
        m = binlog_pb2.TableMutation(table_id=table.table_id)
        for _ in range(1000):
            r = rng.random()
            key += 1
            if r < 0.7:
                m.inserted_rows.append(factory.row(key, rng.randrange(POOL)))
                m.sequence.append(binlog_pb2.INSERT)
            elif r < 0.9:
                m.updated_rows.append(factory.update(rng.randrange(1, key), rng.randrange(POOL),
                                                    "k" if rng.random() < 0.5 else "c"))
                m.sequence.append(binlog_pb2.UPDATE)
            else:
                m.deleted_rows.append(factory.row(rng.randrange(1, key), rng.randrange(POOL)))
                m.sequence.append(binlog_pb2.DELETE_ROW)
        value = binlog_pb2.PrewriteValue(schema_version=1, mutations=[m])
        decoder.add(binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=ts + 2 * t, commit_ts=ts + 2 * t + 1,
                                      prewrite_value=value.SerializeToString()))
        if len(decoder) >= 50_000:
            batches.append(changes_batch(decoder.take()))
    if len(decoder):
        batches.append(changes_batch(decoder.take()))
    pq.write_table(pa.Table.from_batches(batches), path)


def best(runs: int, fn: Any) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def size_of(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    if args.rows < 1000 or args.runs < 1:
        print("image type bench: --rows must be >= 1000 and --runs >= 1", file=sys.stderr)
        return 2
    from pyspark.sql import functions as F

    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark

    root = pathlib.Path(tempfile.mkdtemp(prefix="image-type-", dir=ROOT / "bench"))
    try:
        src = root / "rows.parquet"
        make_rows(args.rows, src)
        spark = build_spark("binlake-bench-image-type", args.master, extra_conf=LAKE_CONF)
        spark.sparkContext.setLogLevel("ERROR")
        source = spark.read.parquet(str(src))
        as_variant = (source.withColumn("before", F.parse_json("before"))
                      .withColumn("after", F.parse_json("after")))
        out: dict[str, dict[str, Any]] = {}
        counter = iter(range(1000))
        for name, df in (("JSON string", source), ("VARIANT", as_variant)):
            path = root / name.split()[0].lower()

            def write(df: Any = df, path: pathlib.Path = path) -> None:
                target = path / str(next(counter))
                df.write.format("delta").partitionBy("commit_date").save(str(target))

            write_s = best(args.runs, write)
            table = str(sorted(path.iterdir())[0])
            out[name] = {"write_s": write_s, "size": size_of(pathlib.Path(table))}
            delta = spark.read.format("delta").load(table)
            key = '{"id":' + str(args.rows // 2) + "}"
            if name == "VARIANT":
                field = F.variant_get("after", "$.c", "string")
                price = F.variant_get("after", "$.price", "decimal(12,2)")
            else:
                field = F.get_json_object("after", "$.c")
                price = F.get_json_object("after", "$.price").cast("decimal(12,2)")
            out[name]["point_s"] = best(args.runs, lambda d=delta, f=field, k=key: d.where(F.col("keys") == k)
                                        .select(f).collect())
            out[name]["scan_s"] = best(args.runs, lambda d=delta, p=price: d.where("op != 'delete'")
                                       .agg(F.sum(p)).collect())
            if name == "VARIANT":
                def to_python(d: Any = delta) -> None:
                    [r["after"].toPython() for r in d.where("op != 'delete'").select("after").limit(20_000).collect()]
            else:
                def to_python(d: Any = delta) -> None:
                    [json.loads(r["after"]) for r in d.where("op != 'delete'").select("after").limit(20_000).collect()]
            out[name]["python_s"] = best(args.runs, to_python)
            print(f"  {name}: {out[name]}", flush=True)
        spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"| images ({args.rows:,} row changes) | write s | size on disk | point read s | scan + extract s | "
          "20k images to Python s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in out.items():
        print(f"| {name} | {r['write_s']:.2f} | {r['size'] / 2**20:.1f} MiB | {r['point_s']:.2f} | "
              f"{r['scan_s']:.2f} | {r['python_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "include"))
    raise SystemExit(main())
