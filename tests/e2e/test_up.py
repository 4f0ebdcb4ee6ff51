"""``binlake up`` (and ``make up``): the always-on stack starts, reports where it
is, and Ctrl-C stops all of it.

The stack runs as a real ``binlake up`` child process on free ports; the tests
talk to it the way a user would (registry, Pumps, Airflow's REST API), then
send SIGINT as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from pumpkit import free_port
from upkit import BINLAKE, PUMP_ARGS, binlake_up, port_open, read_json

from binlake import cli
from binlake.registry.client import RegistryClient


def test_up_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["up", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--data-dir", "--pumps", "--no-airflow", "--airflow-port", "--registry-addr", "--pump-port-base"):
        assert flag in out
    assert "Ctrl-C" in out and "binlake up --no-airflow" in out


def test_up_without_airflow_starts_and_stops_the_cluster(tmp_path: pathlib.Path) -> None:
    registry = f"127.0.0.1:{free_port()}"
    with binlake_up(["--no-airflow", "--data-dir", "state", "--registry-addr", registry,
                     "--pump-port-base", "0", PUMP_ARGS], tmp_path) as up:
        up.wait_for("Press Ctrl-C", timeout=60)
        assert f"registry     {registry}" in up.output
        assert "Airflow      not started (--no-airflow)" in up.output
        with RegistryClient(registry) as reg:
            nodes, _ = reg.list_nodes("pump")
        assert sorted(n.node_id for n in nodes) == ["pump1", "pump2", "pump3"]
        assert all(n.state == "online" and n.safe_ts > 0 for n in nodes)
        pumps = [n.addr for n in nodes]
        assert all(port_open(a) for a in pumps)

        assert up.ctrl_c() == 0
        assert "binlake up: stopped" in up.output
    assert not port_open(registry)
    assert not any(port_open(a) for a in pumps)
    state = tmp_path / "state"
    assert {p.name for p in state.iterdir()} >= {"registry", "pump1", "pump2", "pump3", "logs"}
    assert (state / "logs" / "pump1.log").stat().st_size > 0


def test_up_refuses_a_busy_port(tmp_path: pathlib.Path) -> None:
    with contextlib.closing(socket.socket()) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = f"127.0.0.1:{busy.getsockname()[1]}"
        done = subprocess.run([*BINLAKE, "up", "--no-airflow", "--data-dir", "state", "--registry-addr", addr],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # Nothing was started: the refusal comes before any child process.
    assert not (tmp_path / "state").exists()
    assert done.returncode == 2
    assert f"registry address {addr} is not free" in done.stderr
    assert "another `binlake up`" in done.stderr


def _wait_states(get: Any, until: str, timeout: float) -> list[str]:
    """The states the probe run's wait task goes through, up to ``until`` (or a final state)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tis = {t["task_id"]: t["state"] for t in
               get("/dags/binlake_ingest/dagRuns/probe/taskInstances")["task_instances"]}
        state = tis.get("wait")
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in (until, "success", "failed", "upstream_failed"):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"the wait task did not reach {until} in {timeout:g}s: {seen}")


@pytest.mark.slow
def test_up_with_airflow_serves_the_ingest_dag(tmp_path: pathlib.Path) -> None:
    """The whole stack with ``--spark-cluster``: Airflow comes up healthy with
    binlake_ingest parsed and unpaused, a Spark standalone master and worker run,
    a run's wait step defers to the real triggerer and resumes, its ingest is a
    spark-submit application of that cluster, and Ctrl-C stops it all."""
    port = free_port()
    master_port = free_port()
    api = f"http://127.0.0.1:{port}/api/v2"
    # The ingest schedule (5m) starts now, not at the last 5-minute mark (the stack's
    # default): no scheduled window closes while the test runs, so no ingest of its
    # own competes with the probe run for the cluster or holds up the stop.
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    with binlake_up(["--data-dir", "state", "--registry-addr", f"127.0.0.1:{free_port()}", "--pumps", "2",
                     "--pump-port-base", "0", "--airflow-port", str(port), "--spark-cluster",
                     "--spark-master-port", str(master_port), PUMP_ARGS], tmp_path,
                    env={"BINLAKE_INGEST_START_DATE": start.isoformat()}) as up:
        up.wait_for("Press Ctrl-C", timeout=240)
        assert f"Airflow UI   http://127.0.0.1:{port}" in up.output
        found_ui = re.search(rf"Spark standalone cluster spark://127.0.0.1:{master_port} "
                             r"\(master UI (http://127.0.0.1:\d+)", up.output)
        assert found_ui, up.output

        def master_apps() -> list[dict[str, Any]]:
            assert found_ui is not None
            with urllib.request.urlopen(f"{found_ui.group(1)}/json/", timeout=10) as resp:
                status = json.loads(resp.read())
            assert [w["state"] for w in status["workers"]] == ["ALIVE"], status["workers"]
            return list(status.get("completedapps", [])) + list(status.get("activeapps", []))

        def get(path: str) -> dict:
            return dict(read_json(f"{api}{path}", timeout=15))

        def post(path: str, body: dict) -> dict:
            # Retried like a read, and for the same reason. A try that timed out may still
            # have created the run: the retry then gets 409, and the run is read back.
            req = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            for attempt in range(4):
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        return json.loads(resp.read())
                except urllib.error.HTTPError as refused:
                    if refused.code != 409 or attempt == 0:
                        raise
                    return get(f"{path}/{body['dag_run_id']}")
                except (TimeoutError, urllib.error.URLError):
                    if attempt == 3:
                        raise
                    time.sleep(1)
            raise AssertionError("unreachable")

        deadline = time.monotonic() + 120
        while True:
            dags = {d["dag_id"]: d for d in get("/dags")["dags"]}
            if "binlake_ingest" in dags or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert get("/importErrors")["total_entries"] == 0
        assert dags["binlake_ingest"]["is_paused"] is False
        conn = get("/connections/spark_default")
        assert (conn["conn_type"], conn["host"]) == ("spark", "local[*]")  # binlake_spark_master wins over it
        env_sh = (tmp_path / "state" / "airflow" / "env.sh").read_text()
        assert "export AIRFLOW_HOME=" in env_sh and "BINLAKE_REGISTRY" in env_sh

        # A manual run whose window ends just after pump2 is frozen (SIGSTOP: no
        # heartbeats, its safe ts stays below the window end): the wait step must
        # defer to the triggerer, and finish once pump2 runs again.
        found = subprocess.run(["pgrep", "-f", "--", f"--data-dir {tmp_path / 'state' / 'pump2'}"],
                               capture_output=True, text=True)
        (pump2,) = (int(p) for p in found.stdout.split())
        os.kill(pump2, signal.SIGSTOP)
        try:
            end = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=2)
            post("/dags/binlake_ingest/dagRuns", {"dag_run_id": "probe", "logical_date": end.isoformat()})
            seen = _wait_states(get, "deferred", timeout=120)
        finally:
            os.kill(pump2, signal.SIGCONT)
        seen += _wait_states(get, "success", timeout=60)
        assert seen[-1] == "success" and "deferred" in seen, seen
        # The ingest is a spark-submit application of the stack's cluster (a driver and
        # an executor JVM to start: longer than through a running Connect server).
        deadline = time.monotonic() + 300
        while get("/dags/binlake_ingest/dagRuns/probe")["state"] not in ("success", "failed"):
            assert time.monotonic() < deadline, "the probe run did not finish"
            time.sleep(0.5)
        tis = {t["task_id"]: t["state"] for t in get("/dags/binlake_ingest/dagRuns/probe/taskInstances")[
            "task_instances"]}
        assert tis["ingest"] == "success" and tis["ingest_inprocess"] == "skipped", tis
        # (the maintenance DAG's jobs, scheduled at the start, run on it too)
        assert "binlake-ingest" in [a["name"] for a in master_apps()]

        assert up.ctrl_c(timeout=120) == 0
    assert not port_open(f"127.0.0.1:{port}")
