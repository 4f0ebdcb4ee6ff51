"""Ingest decoding: the C image decoder against the pure-Python one, on the same binlogs.

A Spark standalone cluster's executors import binlake from the zip the driver
ships them (docs/how-to/hosts/spark.md), and a zip cannot hold a C extension
that Python loads, so unless binlake is installed on the workers they decode
row images with the pure-Python path (``image.TablePlan.mutation_py``). This
measures what that costs: ``ChangeDecoder.add`` over the same transactions (a
table of 8 columns: int key, int, decimal, two strings, datetime, float,
bool; inserts then updates of every row), natively and in Python, best of
``--runs``, row changes per second and the Python/C ratio. It measures one core
of this machine; an ingest's executors run one decoder per task.

    python bench/decode_bench.py --rows 20000 --runs 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import sys
import time

from binlake import codec, tso
from binlake.lake.decoding.change_decoder import ChangeDecoder
from binlake.lake.decoding.native import native_available
from binlake.lake.decoding.schema_history import SchemaHistory
from binlake.proto import binlog_pb2

ROWS_PER_TXN = 10


def _table() -> binlog_pb2.TableInfo:
    cols = [("id", "int"), ("n", "int"), ("amount", "decimal"), ("name", "string"), ("note", "string"),
            ("at", "datetime"), ("ratio", "float"), ("ok", "bool")]
    return binlog_pb2.TableInfo(
        table_id=100, db="app", name="orders", schema_version=1, primary_key=[1],
        columns=[binlog_pb2.ColumnInfo(id=i, name=name, type=codec.type_code(kind), nullable=True)
                 for i, (name, kind) in enumerate(cols, start=1)])


def _row(i: int, v: int) -> dict[str, object]:
    return {"id": i, "n": i * 1_000_003 + v, "amount": decimal.Decimal(f"{i % 100_000}.{v % 100:02d}"),
            "name": f"customer-{i:08d}", "note": f"order {i} version {v}: é" + "x" * (i % 40),
            "at": dt.datetime(2026, 11, 26, 8, 0) + dt.timedelta(seconds=i + v), "ratio": i / 7.0,
            "ok": bool((i + v) % 2)}


def transactions(rows: int) -> list[binlog_pb2.Binlog]:
    """Inserts of ``rows`` rows, then an update of each, ROWS_PER_TXN row changes per transaction."""
    info = _table()
    ts = tso.compose(1_795_000_000_000)
    out = []
    for phase in ("insert", "update"):
        for first in range(0, rows, ROWS_PER_TXN):
            ids = range(first, min(rows, first + ROWS_PER_TXN))
            if phase == "insert":
                m = binlog_pb2.TableMutation(table_id=100, inserted_rows=[codec.encode_row(_row(i, 0), info)
                                                                         for i in ids],
                                             sequence=[binlog_pb2.INSERT] * len(ids))
            else:
                m = binlog_pb2.TableMutation(table_id=100, updated_rows=[
                    codec.encode_update(_row(i, 0), _row(i, 1), info) for i in ids],
                    sequence=[binlog_pb2.UPDATE] * len(ids))
            value = binlog_pb2.PrewriteValue(schema_version=1, mutations=[m])
            ts += 4
            out.append(binlog_pb2.Binlog(tp=binlog_pb2.COMMIT, start_ts=ts - 1, commit_ts=ts,
                                         prewrite_value=value.SerializeToString()))
    return out


def decode_rate(txns: list[binlog_pb2.Binlog], history: SchemaHistory, native: bool, runs: int) -> float:
    """Row changes per second of ``ChangeDecoder.add`` + ``take`` (best of ``runs``)."""
    best = float("inf")
    total = 0
    for _ in range(runs):
        decoder = ChangeDecoder(history, "pump1", native=native)
        began = time.perf_counter()
        total = sum(decoder.add(t) for t in txns)
        decoder.take()
        best = min(best, time.perf_counter() - began)
    return total / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows inserted then updated (default 20000)")
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs (default 3)")
    args = parser.parse_args(argv)
    if args.rows < ROWS_PER_TXN or args.runs < 1:
        parser.error(f"--rows must be at least {ROWS_PER_TXN} and --runs at least 1")
    if not native_available():
        print("the C decoder (binlake.lake.decoding._imagec) is not built: make setup", file=sys.stderr)
        return 2
    txns = transactions(args.rows)
    history = SchemaHistory.from_tables([_table()])
    c_rate = decode_rate(txns, history, True, args.runs)
    py_rate = decode_rate(txns, history, False, args.runs)
    print(f"{2 * args.rows:,} row changes in {len(txns):,} transactions, best of {args.runs}")
    print(f"| decoder | row changes/s | ratio to C |\n|---|---:|---:|\n| C (_imagec) | {c_rate:,.0f} | 1.00 |\n"
          f"| pure Python (a shipped zip) | {py_rate:,.0f} | {py_rate / c_rate:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
