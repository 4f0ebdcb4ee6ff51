"""``binlake bench scale``'s pieces: the wide synthetic table (its width, its types,
a lake that restores to exactly its final rows), the per-process memory sampler,
and the report's tables. (A whole run takes minutes even at 2,000 rows: every
stage starts Spark jobs, so the run itself is not part of the suite.)"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest
from pyspark.sql import SparkSession

from binlake import cli
from binlake.cli import benchmarks
from binlake.restore import restore, synthetic

T0 = 1_800_000_000_000 << 18


@pytest.fixture
def scale() -> Any:
    return benchmarks.bench_module("scale")


def test_the_wide_lake_restores_to_its_final_typed_rows_of_about_300_bytes(
        spark: SparkSession, tmp_path: pathlib.Path, scale: Any) -> None:
    rows = 300
    lake = str(tmp_path / "lake")
    last = synthetic.build_lake(spark, lake, rows, 2 * rows, T0, windows=1, shape="wide")
    typed = synthetic.wide_final_rows(spark, rows, 2 * rows).cache()
    kinds = {f.dataType.simpleString().split("(")[0] for f in typed.schema.fields}
    assert len(typed.columns) >= 10
    assert {"bigint", "string", "decimal", "double", "timestamp_ntz", "date"} <= kinds
    assert 270 <= scale.typed_row_bytes(typed) <= 330
    want = sorted(typed.collect())
    assert 0 < sum(r["note"] is None for r in want) < rows  # the nullable text has nulls, not only
    assert len({r["status"] for r in want}) > 1  # updated rows, not only inserted ones
    r = restore.run(spark, lake, last, out=str(tmp_path / "out"), source="changes")
    assert r.rows == rows
    got = spark.read.format("delta").load(str(tmp_path / "out" / "main.bench")).select(*typed.columns)
    # Every column's image text decodes back to the typed value (updates included).
    assert sorted(got.collect()) == want
    typed.unpersist()


def test_the_narrow_shape_stays_as_it_was() -> None:
    info = synthetic._table_info()
    assert [c.name for c in info.columns] == ["id", "k", "c", "balance"]
    with pytest.raises(ValueError, match="shape"):
        synthetic.build_lake(None, "/nonexistent", 10, 20, T0, shape="tall")


@pytest.mark.parametrize(("name", "cmdline", "kind"), [
    ("java", ["/usr/lib/jvm/java-17/bin/java", "-cp", "pyspark/jars/*"], "jvm"),
    ("python", ["/venv/bin/python", "-m", "pyspark.daemon"], "py-workers"),
    ("postgres", ["/usr/lib/postgresql/16/bin/postgres", "-D", "data"], "postgres"),
    ("weed", ["/venv/bin/weed", "mini"], "seaweedfs"),
    ("bash", ["bash", "/venv/pyspark/bin/spark-class", "org.apache.spark.deploy.SparkSubmit"], None),
    ("python", ["/venv/bin/python", "-c", "pass"], None),
])
def test_each_process_is_counted_as_its_kind(scale: Any, name: str, cmdline: list[str], kind: str | None) -> None:
    assert scale.process_kind(2, 1, name, cmdline) == kind
    assert scale.process_kind(1, 1, name, cmdline) == "driver"


def test_the_sampler_gives_each_stage_its_own_peaks(spark: SparkSession, scale: Any) -> None:
    sampler = scale.ProcessPeaks(interval_s=0.05).start()
    try:
        with sampler.stage() as small:
            pass
        with sampler.stage() as big:
            block = bytearray(200 << 20)
            block[::4096] = b"x" * len(block[::4096])  # touched: resident
            import time

            time.sleep(0.3)
            del block
        with sampler.stage() as after:
            pass
    finally:
        sampler.stop()
    assert small["jvm"].largest > 50 << 20  # the session's JVM, a child of this process
    assert big["driver"].largest - small["driver"].largest >= 150 << 20
    assert after["driver"].largest < big["driver"].largest  # a stage's peak is its own


def _result(scale: Any, stage: str, seconds: float | None, driver_mib: int) -> Any:
    peaks = {"driver": scale.Peak(driver_mib << 20, driver_mib << 20, 1),
             "postgres": scale.Peak(40 << 20, 120 << 20, 3)}
    return scale.StageResult(stage, seconds, peaks, "" if seconds is not None else "failed: MemoryError: boom")


def test_the_report_has_a_line_per_stage_with_its_floor_ratio(scale: Any) -> None:
    results = [_result(scale, s, 10.0, 300) for s in scale.STAGES]
    results[scale.STAGES.index("restore -> PostgreSQL")].seconds = 8.0
    results[scale.STAGES.index("floor: PostgreSQL COPY of a CSV file")].seconds = 4.0
    results[scale.STAGES.index("history")] = _result(scale, "history", None, 300)
    lines = scale.size_table(1_000_000, 300.0, 2, results)
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + len(scale.STAGES)
    assert all(line.count("|") == table[0].count("|") for line in table)
    by_stage = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table[2:]}
    pg = [c.strip() for c in by_stage["restore -> PostgreSQL"]]
    assert pg[0] == "8.0" and pg[1] == "125,000" and pg[-1] == "0.50"
    assert pg[3] == f"{1_000_000 * 300 / (1 << 30) / 8 * 3600:,.1f}"  # GiB/h
    assert "120 (3, max 40)" in pg  # PostgreSQL: its processes summed, their count, the largest
    assert by_stage["history"][0].strip() == "failed: MemoryError: boom"
    scaled = scale.scaling_table({1000: [_result(scale, "snapshot", 1.0, 200)],
                                  10_000: [_result(scale, "snapshot", 2.0, 300)]})
    assert [c.strip() for c in scaled[-1].split("|")[2:4]] == ["1.50", "-"]


def test_sizes_below_the_smallest_are_refused_in_one_line(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["bench", "scale", "--rows", "1000,50"]) == 2
    assert "at least 100 rows" in capsys.readouterr().err
