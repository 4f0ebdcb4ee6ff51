"""Spark on a cluster and Airflow's metadata database: the settings and the pieces
that need no JVM (the binlake zip shipped to executors, the [spark] section, the
choice between PostgreSQL and SQLite, the cluster fixture's argument checks)."""

from __future__ import annotations

import os
import pathlib
import sys
import zipfile

import pytest

from binlake import config, errors
from binlake.lake.sparkenv import session as lake_spark
from binlake.stack import airflow_db
from binlake.stack.localdb import LocalPostgres
from binlake.stack.sparkcluster import SparkCluster


def test_code_zip_holds_this_binlake_and_is_reused(tmp_path: pathlib.Path) -> None:
    import binlake

    first = lake_spark.code_zip(tmp_path)
    root = pathlib.Path(binlake.__file__).resolve().parent
    with zipfile.ZipFile(first) as z:
        names = set(z.namelist())
        # The very files this process runs, under binlake/ (what an executor imports).
        assert z.read("binlake/lake/pumps/datasource.py") == (root / "lake" / "pumps" / "datasource.py").read_bytes()
    assert "binlake/__init__.py" in names and not any("__pycache__" in n or n.endswith(".so") for n in names)
    # Same contents, same file; no temporary left behind.
    assert lake_spark.code_zip(tmp_path) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    # The zip imports binlake in a fresh interpreter (nothing else on its path).
    import subprocess

    out = subprocess.run([sys.executable, "-S", "-c", "import binlake.lake.pumps.read_options as m; print(m.__file__)"],
                         env={"PYTHONPATH": str(first), "PATH": os.environ.get("PATH", "")},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(str(first)), out.stderr


@pytest.mark.parametrize(("master", "cluster"), [
    ("local[*]", False), ("local[2]", False), ("sc://127.0.0.1:15002", False),
    ("spark://127.0.0.1:7077", True), ("yarn", True), ("k8s://https://k:6443", True),
])
def test_is_cluster(master: str, cluster: bool) -> None:
    assert lake_spark.is_cluster(master) is cluster


def test_spark_section_from_file_env_and_bad_values(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BINLAKE_SPARK_MASTER", raising=False)
    monkeypatch.delenv("BINLAKE_SPARK_SHIP_CODE", raising=False)
    f = tmp_path / "c.toml"
    f.write_text('[spark]\nmaster = "spark://h1:7077"\nship_code = false\n')
    s = config.load(config.SparkSettings, f)
    assert (s.master, s.ship_code) == ("spark://h1:7077", False)
    monkeypatch.setenv("BINLAKE_SPARK_MASTER", "local[2]")
    assert config.load(config.SparkSettings, f).master == "local[2]"  # env beats file
    monkeypatch.delenv("BINLAKE_SPARK_MASTER")
    f.write_text('[spark]\nmaster = "spark:/h1"\n')
    with pytest.raises(errors.InvalidArgument, match=r"master.*not a Spark master URL"):
        config.load(config.SparkSettings, f)


def test_airflow_db_choice(tmp_path: pathlib.Path) -> None:
    home = tmp_path / "airflow"
    assert airflow_db.choose("sqlite", home) == ("sqlite", "--airflow-db sqlite")
    problem = LocalPostgres(airflow_db.postgres_dir(home)).startable()
    backend, why = airflow_db.choose("auto", home)
    # auto: PostgreSQL exactly when its server can start here, else SQLite saying why.
    assert (backend, why) == (("postgres", "") if not problem else ("sqlite", problem))
    if problem:
        with pytest.raises(errors.FailedPrecondition, match="--airflow-db postgres: "):
            airflow_db.choose("postgres", home)
    # A stack whose metadata is in SQLite already stays there under auto.
    home.mkdir()
    (home / "airflow.db").touch()
    assert airflow_db.choose("auto", home)[0] == "sqlite"
    with pytest.raises(ValueError, match="requested must be one of"):
        airflow_db.choose("mysql", home)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"workers": 0}, "workers"), ({"cores": 0}, "cores"), ({"memory": "lots"}, "memory"),
    ({"master_port": 70000}, "master_port"),
])
def test_spark_cluster_arguments(tmp_path: pathlib.Path, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        SparkCluster(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_up_with_a_spark_cluster_points_airflow_at_it(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from binlake.stack.supervisor import Stack, StackConfig

    for name in ("BINLAKE_INGEST_MODE", "BINLAKE_SPARK_REMOTE", "BINLAKE_SPARK_MASTER"):
        monkeypatch.delenv(name, raising=False)
    stack = Stack(StackConfig(data_dir=tmp_path, spark_cluster=True, spark_master_port=7177))
    env = stack.airflow_env()
    # Every window a spark-submit application of the cluster; no Connect server beside it.
    assert (env["BINLAKE_SPARK_MASTER"], env["BINLAKE_INGEST_MODE"]) == ("spark://127.0.0.1:7177", "spark-submit")
    assert stack.spark_remote is None and "BINLAKE_SPARK_REMOTE" not in env
    plain = Stack(StackConfig(data_dir=tmp_path))
    assert plain.spark_master is None and plain.spark_remote is not None
