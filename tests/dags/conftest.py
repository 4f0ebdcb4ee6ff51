"""Airflow for the DAG tests: a private AIRFLOW_HOME, this project's dags/ and plugins/.

The environment is set by ``airflowkit`` (tests/airflowkit.py), imported here at
collection, before any test module imports Airflow (which reads its configuration
once, when first imported).

The DAG runs' in-process tasks build their Spark through ``build_spark``, which
hands them the test run's session (``spark`` in tests/conftest.py) when a test
asked for it first: one JVM for the DAG runs and the test's own reads.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from airflowkit import AIRFLOW_HOME  # importing it sets Airflow's environment (see its docstring)


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[pathlib.Path]:
    """A migrated SQLite metadata database in the session's AIRFLOW_HOME."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True,
                   env=os.environ.copy(), timeout=180)
    yield AIRFLOW_HOME / "airflow.db"
