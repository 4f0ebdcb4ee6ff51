"""``bench pump`` bookkeeping: ``--rounds`` reports the median round and the
median of each round's own ratio, and the ``floor-fsync`` storage flushes
exactly where the Pump's durability rule does (a batch holding a prewrite)."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import pytest

from binlake.cli import benchmarks
from binlake.proto import binlog_pb2 as bp
from binlake.pump.storage import Entry


@pytest.fixture
def pump_bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the module puts bench/ on the path
    return benchmarks.bench_module("pump")


def _row(variant: str, rnd: int, txn_s: float, writers: int = 1, **extra: Any) -> dict[str, Any]:
    return {"variant": variant, "replicas": 1, "tso": "block", "commit": "sync", "writers": writers,
            "size": 1024, "round": rnd, "txn_s": txn_s, **extra}


def test_the_median_round_is_reported_with_its_own_figures(pump_bench: Any) -> None:
    rows = [_row("new", 0, 600, p99_ms=3.0), _row("floor", 0, 1000), _row("new", 1, 500, p99_ms=9.0),
            _row("floor", 1, 900), _row("new", 2, 700, p99_ms=1.0), _row("floor", 2, 1300),
            _row("new", 0, 4000, writers=16)]
    out = pump_bench.median_rows(rows)
    assert [(r["variant"], r["writers"]) for r in out] == [("new", 1), ("floor", 1), ("new", 16)]
    new = out[0]
    assert (new["txn_s"], new["p99_ms"], new["rounds"]) == (600, 3.0, 3)  # the middle round, whole
    assert (out[1]["txn_s"], out[2]["rounds"]) == (1000, 1)


def test_a_ratio_is_the_median_of_each_rounds_own_ratio(pump_bench: Any) -> None:
    # Round 2's machine was fast for the floor alone: its ratio is the outlier, not the median.
    rows = [_row("new", 0, 700), _row("floor", 0, 1000), _row("new", 1, 640), _row("floor", 1, 900),
            _row("new", 2, 580), _row("floor", 2, 1350), _row("new", 0, 4000, writers=16)]
    new = pump_bench.median_rows(rows)[0]
    assert pump_bench.round_ratio(rows, new, "floor") == pytest.approx(0.7)
    # The medians of the two paths taken apart would say 640 / 1000.
    assert pump_bench.round_ratio(rows, new, "floor-fsync") is None  # no such floor
    sixteen = pump_bench.median_rows(rows)[2]
    assert pump_bench.round_ratio(rows, sixteen, "floor") is None  # no floor row at 16 writers
    # An even count of paired rounds: the mean of the middle two.
    two = rows[:4]
    assert pump_bench.round_ratio(two, pump_bench.median_rows(two)[0], "floor") == pytest.approx((0.7 + 640 / 900) / 2)


def test_the_replicas_cost_is_the_median_of_each_rounds_own_ratio(pump_bench: Any) -> None:
    rows = []
    for rnd, (one, two, p99_one, p99_two) in enumerate([(4000, 2800, 5.0, 6.0), (3000, 2400, 4.0, 10.0),
                                                        (2500, 1000, 8.0, 9.0)]):
        rows += [_row("new", rnd, one, writers=16, p99_ms=p99_one),
                 _row("new", rnd, two, writers=16, p99_ms=p99_two, replicas=2)]
    rows.append(_row("noflush", 0, 4000, writers=16, p99_ms=1.0))  # another path: never paired with new
    two = next(r for r in pump_bench.median_rows(rows) if r["replicas"] == 2)
    assert pump_bench.replica_ratio(rows, two, "txn_s") == pytest.approx(0.7)  # of 0.7, 0.8, 0.4
    assert pump_bench.replica_ratio(rows, two, "p99_ms") == pytest.approx(1.2)  # of 1.2, 2.5, 1.125
    noflush = next(r for r in pump_bench.median_rows(rows) if r["variant"] == "noflush")
    assert pump_bench.replica_ratio(rows, {**noflush, "replicas": 2}, "txn_s") is None


def test_the_flush_floor_flushes_a_batch_only_when_it_holds_a_prewrite(
    pump_bench: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    flushes: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (flushes.append(fd), real(fd))[1])
    storage = pump_bench._FsyncOnlyStorage(str(tmp_path / "log"))
    answers: list[tuple[Any, Any]] = []

    def entry(tp: int, start: int) -> Entry:
        b = bp.Binlog(tp=tp, start_ts=start, commit_ts=start + 1 if tp == bp.COMMIT else 0)
        return Entry(b, b.SerializeToString())

    batches = [[entry(bp.PREWRITE, 10)], [entry(bp.COMMIT, 10)], [entry(bp.COMMIT, 12), entry(bp.PREWRITE, 14)],
               [entry(bp.ROLLBACK, 14)]]
    for batch in batches:
        storage.submit_cb(batch, lambda res, exc: answers.append((res, exc)))
    unary = entry(bp.PREWRITE, 16)
    assert storage.submit([unary]).result() == [None]  # the unary RPCs' way in
    assert len(flushes) == 3  # the first batch, the third and the unary one
    assert answers == [([None], None), ([None], None), ([None, None], None), ([None], None)]
    assert (tmp_path / "log").read_bytes() == b"".join(e.payload for batch in [*batches, [unary]] for e in batch)
