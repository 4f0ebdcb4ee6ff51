"""A real run of the ``binlake_apply`` DAG (``dag.test`` against the session's
SQLite metadata database): a small lake of two windows, two task files (one
with a diff against a reference database), mapped apply tasks, the diff task.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from typing import Any

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DAGS = pathlib.Path(__file__).resolve().parents[2] / "dags"


def _image(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def small_lake(spark: SparkSession, lake: str) -> tuple[Any, list[tuple[int, int]]]:
    """items(id, name): window 1 inserts 1..4, window 2 updates 2 and deletes 3."""
    from binlake import tso
    from binlake.lake import ingest
    from binlake.lake.decoding import decode
    from binlake.lake.store import location
    from binlake.sql import schema as sc

    info = sc.new_table(100, "main", "items", [sc.ColumnDef("id", "int", False), sc.ColumnDef("name", "string")],
                        ["id"], None, 1)
    base = tso.from_datetime(dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC))
    ms = 1 << 18
    spark.createDataFrame([{
        "commit_ts": base + 1, "start_ts": base, "schema_version": 1, "db": "main", "tbl": "items", "table_id": 100,
        "previous_table_id": 0, "dropped": False, "query": "CREATE TABLE items", "table_info": info.SerializeToString(),
        "table_json": decode.table_json(info)}], decode.DDL_HISTORY_DDL).write.format("delta").save(
        location.table_path(lake, location.DDL_HISTORY))
    changes = [(base + 2 * ms, "insert", None, {"id": i, "name": f"n{i}"}) for i in range(1, 5)]
    changes += [(base + 12 * ms, "update", {"id": 2, "name": "n2"}, {"id": 2, "name": "two"}),
                (base + 13 * ms, "delete", {"id": 3, "name": "n3"}, None)]
    rows = [{"commit_ts": ts, "start_ts": ts - 1, "seq": i, "commit_date": decode.commit_date(ts), "db": "main",
             "tbl": "items", "table_id": 100, "op": op, "keys": _image({"id": (a or b)["id"]}),
             "before": _image(b) if b else None, "after": _image(a) if a else None, "schema_version": 1,
             "pump": "pump1"} for i, (ts, op, b, a) in enumerate(changes)]
    spark.createDataFrame(rows, decode.CHANGES_DDL).write.format("delta").partitionBy("commit_date").save(
        location.table_path(lake, location.CHANGES))
    windows = [(base, base + 10 * ms), (base + 10 * ms, base + 20 * ms)]
    spark.createDataFrame(
        [(a, b, ["pump1"], {"pump1": n}, {"main.items:x": n}, n, n, d, "done", dt.datetime(2026, 11, 20, 9))
         for (a, b), n, d in zip(windows, (4, 2), (1, 0), strict=True)],
        ingest.WINDOWS_DDL).write.format("delta").save(location.table_path(lake, location.WINDOWS))
    return info, windows


def test_apply_dag_run_applies_every_task_file_and_diffs(
        airflow_db: pathlib.Path, spark: SparkSession, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from binlake.replicate import checkpoint
    from binlake.sql.url import open_target

    lake = str(tmp_path / "lake")
    info, windows = small_lake(spark, lake)
    reference = f"sqlite:///{tmp_path / 'reference.db'}"
    with open_target(reference) as ref:
        ref.create_table(info)
        ref.bulk_load(info, [{"id": 1, "name": "n1"}, {"id": 2, "name": "two"}, {"id": 4, "name": "n4"}])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    targets = {}
    for name, mode, extra in (("a", "consistent", f'diff_source = "{reference}"\n'), ("b", "parallel", "")):
        targets[name] = f"sqlite:///{tmp_path / f'{name}.db'}"
        (tasks / f"{name}.toml").write_text(f'name = "{name}"\nlake = "{lake}"\ntarget = "{targets[name]}"\n'
                                            f'mode = "{mode}"\n{extra}')
    monkeypatch.setenv("BINLAKE_APPLY_TASKS", str(tasks))
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags["binlake_apply"].test()
    assert str(dr.state) == "success"
    with create_session() as session:
        tis = session.scalars(sa.select(TaskInstance).where(TaskInstance.dag_id == "binlake_apply",
                                                            TaskInstance.run_id == dr.run_id)).all()
        states = sorted((ti.task_id, ti.map_index, str(ti.state)) for ti in tis)
    assert states == [("apply", 0, "success"), ("apply", 1, "success"), ("diff", 0, "success"),
                      ("diff", 1, "success"), ("task_files", -1, "success"), ("until", -1, "success")]
    for url in targets.values():
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert sorted(conn.exec_driver_sql("SELECT id, name FROM items").all()) == [
                (1, "n1"), (2, "two"), (4, "n4")]
            assert checkpoint.read(conn, pathlib.Path(url).stem).ts == windows[-1][1]
        engine.dispose()
