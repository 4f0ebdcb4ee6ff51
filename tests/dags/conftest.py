"""Airflow for the DAG tests: a private AIRFLOW_HOME, this project's dags/ and plugins/.

Airflow reads its configuration once, when ``airflow`` is first imported, so
the environment is set here, at import time, before any test module imports
it. Every test session gets its own home (SQLite metadata, logs), removed at
exit, so a developer's own ``~/airflow`` is never touched.

The DAG runs' in-process tasks build their Spark through ``build_spark``, which
hands them the test run's session (``spark`` in tests/conftest.py) when a test
asked for it first: one JVM for the DAG runs and the test's own reads.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from binlake.stack.supervisor import local_airflow

ROOT = pathlib.Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"

if "airflow" in sys.modules:  # pragma: no cover - a guard for future test layouts
    raise RuntimeError(
        "airflow was imported before tests/dags/conftest.py could point AIRFLOW_HOME at a temporary "
        "directory; import it lazily in other test packages"
    )

AIRFLOW_HOME = pathlib.Path(tempfile.mkdtemp(prefix="binlake-airflow-tests-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)
os.environ.update({
    **local_airflow(AIRFLOW_HOME, DAGS, PLUGINS),
    # The DAG's parse-time settings, pinned so a developer's environment cannot change the tests.
    "BINLAKE_INGEST_SCHEDULE": "5m",
    "BINLAKE_INGEST_START_DATE": "2026-11-01T00:00:00",
})
# Airflow appends plugins/ to sys.path itself once configured; tests import
# binlake_airflow directly too, possibly before that.
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[pathlib.Path]:
    """A migrated SQLite metadata database in the session's AIRFLOW_HOME."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True,
                   env=os.environ.copy(), timeout=180)
    yield AIRFLOW_HOME / "airflow.db"
