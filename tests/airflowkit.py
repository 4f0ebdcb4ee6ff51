"""A private Airflow for the tests: its own AIRFLOW_HOME, this project's dags/ and plugins/.

Airflow reads its configuration once, when ``airflow`` is first imported, so the
environment is set when this module is first imported, before any test imports
Airflow: ``tests/dags/conftest.py`` imports it at collection, and a test elsewhere
that calls Airflow code imports it before its own ``import airflow`` (the same
setup whichever comes first; Python runs this module once). Every test process
gets its own home (SQLite metadata, logs), removed at exit, so a developer's own
``~/airflow`` or ``AIRFLOW_HOME`` is never touched.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import sys
import tempfile

from binlake.stack.supervisor import local_airflow

ROOT = pathlib.Path(__file__).resolve().parents[1]
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"

if "airflow" in sys.modules:  # pragma: no cover - a guard for future test layouts
    raise RuntimeError(
        "airflow was imported before tests/airflowkit.py could point AIRFLOW_HOME at a temporary "
        "directory; import airflowkit first, and airflow lazily"
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
