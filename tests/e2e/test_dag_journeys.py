"""Every binlake DAG triggered the way the Airflow UI triggers it, against one real
``binlake up`` stack (registry, a Pump, the always-on Spark Connect server, API
server, scheduler, DAG processor, triggerer) for the whole module. As in a
user's stack, the DAGs' Spark jobs are clients of the Connect server (a task's
job costs its work, not a JVM start of its own; tests/dags runs the DAGs with
sessions of their own).

Runs are created through Airflow's REST API (``POST /api/v2/dags/{dag_id}/dagRuns``)
with the conf the trigger form sends: every param at its declared default (read
back from the API), with the fields a user fills on top. Each test waits for the
run's terminal state and looks at every task's state, try number, log and XCom:
the documented combinations succeed and produce what they say (restored tables
equal the upstream, verify's summary in its XCom), the bad ones fail at their
first task, on the first try (no retries), with a message naming the param.

The last test drives the restore form itself in headless Chromium (selenium).

The stack's ingest schedule is one hour starting when the module starts, so no
scheduled window competes with the runs here; the one window the restores read
is ingested by a manual run with an explicit data interval around a small
workload written through the stack's Pump.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime as dt
import json
import math
import pathlib
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hookkit import Webhook
from pumpkit import free_port
from upkit import BINLAKE, PUMP_ARGS, Up, binlake_up, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TERMINAL = ("success", "failed")


@dataclasses.dataclass
class Stack:
    up: Up
    root: pathlib.Path
    port: int
    registry: str
    lake: pathlib.Path
    upstream: str
    window: tuple[dt.datetime, dt.datetime]
    hook: Webhook

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- REST
    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.ui}/api/v2{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=90) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body

    def form_conf(self, dag_id: str, **filled: Any) -> dict[str, Any]:
        """What the trigger form sends: every param at its default, then the filled fields."""
        params = self.get(f"/dags/{dag_id}/details")["params"]
        conf = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in params.items()}
        unknown = set(filled) - set(conf)
        assert not unknown, f"{dag_id} has no params {unknown}"
        return {**conf, **filled}

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None, *,
                logical_date: dt.datetime | None = None,
                interval: tuple[dt.datetime, dt.datetime] | None = None) -> tuple[int, Any]:
        body: dict[str, Any] = {"dag_run_id": run_id, "conf": conf if conf is not None else {},
                                "logical_date": logical_date.isoformat() if logical_date else None}
        if interval is not None:
            body["data_interval_start"], body["data_interval_end"] = (d.isoformat() for d in interval)
        return self.call("POST", f"/dags/{dag_id}/dagRuns", body)

    def run(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None, **kw: Any) -> None:
        status, body = self.trigger(dag_id, run_id, conf, **kw)
        if status >= 500 and self.call("GET", f"/dags/{dag_id}/dagRuns/{_q(run_id)}")[0] == 404:
            # Seen once: a "Database error" (500) creating a run while the scheduler was busy
            # with the DAG's previous one; no run was made, so asking again is the same trigger.
            time.sleep(2)
            status, body = self.trigger(dag_id, run_id, conf, **kw)
        assert status == 200, (status, body)

    def wait(self, dag_id: str, run_id: str, timeout: float = 480) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.get(f"/dags/{dag_id}/dagRuns/{_q(run_id)}")["state"]
            if state in TERMINAL:
                return str(state)
            time.sleep(0.5)
        raise AssertionError(f"{dag_id} {run_id} not finished after {timeout:g}s: {self.tasks(dag_id, run_id)}")

    def tasks(self, dag_id: str, run_id: str) -> dict[str, tuple[str | None, int]]:
        """task_id (``[i]`` for mapped ones) -> (state, try number)."""
        tis = self.get(f"/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances")["task_instances"]
        return {t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else ""): (t["state"], t["try_number"])
                for t in tis}

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        body = self.get(f"/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/{task_id}/logs/{try_number}")
        content = body.get("content") if isinstance(body, dict) else body
        if not isinstance(content, list):
            return str(content)
        lines = []
        for e in content:
            if not isinstance(e, dict):
                lines.append(str(e))
                continue
            lines.append(str(e.get("event", "")))
            # A task's exception is structured: its message is the error detail's exc_value.
            lines += [str(d.get("exc_value", "")) for d in e.get("error_detail") or [] if isinstance(d, dict)]
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> Any:
        value = self.get(f"/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/{task_id}/xcomEntries/return_value"
                         f"?deserialize=true&map_index={map_index}")["value"]
        if isinstance(value, str):
            for parse in (json.loads, ast.literal_eval):
                with contextlib.suppress(ValueError, SyntaxError):
                    return parse(value)
        return value

    def set_variable(self, key: str, value: str | None) -> None:
        if value is None:
            self.call("DELETE", f"/variables/{key}")
            return
        status, body = self.call("POST", "/variables", {"key": key, "value": value})
        if status == 409:
            status, body = self.call("PATCH", f"/variables/{key}", {"key": key, "value": value})
        assert status in (200, 201), (status, body)

    def fails_first(self, dag_id: str, run_id: str, task_id: str, *messages: str) -> None:
        """The run failed, at ``task_id``, on its first try, with every one of ``messages`` in its log."""
        assert self.wait(dag_id, run_id) == "failed"
        tasks = self.tasks(dag_id, run_id)
        assert tasks[task_id] == ("failed", 1), tasks
        text = self.log(dag_id, run_id, task_id)
        for m in messages:
            assert m in text, f"{m!r} not in the log of {task_id}:\n{text[-3000:]}"


def _q(run_id: str) -> str:
    """A run id in a URL path (manual runs' ids hold ':' and '+')."""
    return urllib.parse.quote(run_id, safe="")


def _ceil_second(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=0) + dt.timedelta(seconds=1 if moment.microsecond else 0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("journeys")
    port, registry = free_port(), f"127.0.0.1:{free_port()}"
    hook = Webhook()
    start = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    env = {
        # No scheduled window during the module: the first is due an hour after it starts.
        "BINLAKE_INGEST_SCHEDULE": "1h", "BINLAKE_INGEST_START_DATE": start.isoformat(),
        "BINLAKE_INGEST_DEADLINE": "1s", "BINLAKE_INGEST_DEADLINE_WEBHOOK": hook.url,
        # A drill's default scratch file goes below this module's directory; a failed one alerts the webhook.
        "BINLAKE_DRILL_SCRATCH_DIR": str(root / "drill-scratch"), "BINLAKE_DRILL_WEBHOOK": hook.url,
    }
    try:
        with binlake_up(["--data-dir", "state", "--registry-addr", registry, "--pumps", "1", "--pump-port-base", "0",
                         "--airflow-port", str(port), "--spark-connect-port", str(free_port()), PUMP_ARGS],
                        root, env) as up:
            up.wait_for("Press Ctrl-C", timeout=300)
            assert "(Spark Connect, always on)" in up.output, up.output
            upstream = f"sqlite:///{root / 'upstream.db'}"
            before = dt.datetime.now(dt.UTC)
            done = subprocess.run([*BINLAKE, "--log-level", "WARNING", "workload", "--registry", registry,
                                   "--upstream", upstream, "--profile", "mixed", "--txns", "120", "--tables", "2",
                                   "--seed", "22", "--clients", "1", "--table-rows", "50", "--accounts", "20",
                                   "--quiet"], cwd=root, env=clean_env(), capture_output=True, text=True,
                                  timeout=180)
            assert done.returncode == 0, done.stderr
            after = dt.datetime.now(dt.UTC)
            window = (before.replace(microsecond=0) - dt.timedelta(seconds=1),
                      _ceil_second(after) + dt.timedelta(seconds=2))
            s = Stack(up, root, port, registry, root / "state" / "lake", upstream, window, hook)
            deadline = time.monotonic() + 120
            while len(s.get("/dags?dag_id_pattern=binlake")["dags"]) < 4:
                assert time.monotonic() < deadline, s.get("/importErrors")
                time.sleep(1)
            # The daily maintenance and drill runs the scheduler starts at once (Spark jobs, and
            # a drill of a lake nothing was ingested into yet) are not what this module tests;
            # stopping them keeps the module's CPU for its own runs.
            daily = ("binlake_maintenance", "binlake_drill")
            deadline = time.monotonic() + 30
            while not all(s.get(f"/dags/{d}/dagRuns")["dag_runs"] for d in daily) and time.monotonic() < deadline:
                time.sleep(1)
            for dag_id in daily:
                for r in s.get(f"/dags/{dag_id}/dagRuns")["dag_runs"]:
                    s.call("PATCH", f"/dags/{dag_id}/dagRuns/{_q(r['dag_run_id'])}", {"state": "failed"})
            s.run("binlake_ingest", "workload", logical_date=window[0], interval=window)
            assert s.wait("binlake_ingest", "workload") == "success", s.tasks("binlake_ingest", "workload")
            yield s
            up.ctrl_c(timeout=120)
    finally:
        hook.close()


def _restored_equal(upstream: str, target: str, tables: list[str] | None = None) -> None:
    from binlake.sql.diff import diff_databases

    report = diff_databases(upstream, target, tables=tables)
    assert report.ok, report.summary()


# ---------------------------------------------------------------- binlake_up and binlake_apply
def test_up_says_where_apply_task_files_go_and_apply_runs_are_skipped(stack: Stack) -> None:
    assert "binlake_apply: no task file yet, its runs are skipped" in stack.up.output
    # The ingest's Asset event already triggered binlake_apply: skipped, not red.
    deadline = time.monotonic() + 60
    while not (runs := stack.get("/dags/binlake_apply/dagRuns")["dag_runs"]):
        assert time.monotonic() < deadline, "the ingest's Asset event triggered no binlake_apply run"
        time.sleep(1)
    for r in runs:
        assert stack.wait("binlake_apply", r["dag_run_id"]) == "success"
        assert stack.tasks("binlake_apply", r["dag_run_id"])["task_files"][0] == "skipped"
    stack.run("binlake_apply", "by-hand", stack.form_conf("binlake_apply"))
    assert stack.wait("binlake_apply", "by-hand") == "success"
    tasks = stack.tasks("binlake_apply", "by-hand")
    assert tasks["task_files"] == ("skipped", 1), tasks
    assert "no replication task configured" in stack.log("binlake_apply", "by-hand", "task_files")
    assert "config/tasks" in stack.log("binlake_apply", "by-hand", "task_files")


def test_apply_bad_settings_fail_the_first_task(stack: Stack) -> None:
    status, body = stack.trigger("binlake_apply", "bad-until", stack.form_conf("binlake_apply", until_ts="soon"))
    assert status == 400 and "until_ts" in json.dumps(body), body  # the form's own check
    stack.set_variable("binlake_apply_tasks", str(stack.root / "no-such-tasks"))
    try:
        stack.run("binlake_apply", "missing-path", stack.form_conf("binlake_apply"))
        stack.fails_first("binlake_apply", "missing-path", "task_files", "no-such-tasks is neither a task file",
                          "binlake_apply_tasks")
    finally:
        stack.set_variable("binlake_apply_tasks", None)


def test_apply_with_a_task_file_applies_and_diffs(stack: Stack) -> None:
    tasks = stack.root / "tasks"
    tasks.mkdir()
    target = f"sqlite:///{stack.root / 'replica.db'}"
    (tasks / "replica.toml").write_text(f'name = "replica"\nlake = "{stack.lake}"\ntarget = "{target}"\n'
                                        f'mode = "consistent"\ndiff_source = "{stack.upstream}"\n')
    stack.set_variable("binlake_apply_tasks", str(tasks))
    try:
        stack.run("binlake_apply", "replica", stack.form_conf("binlake_apply"))
        state = stack.wait("binlake_apply", "replica")
    finally:
        stack.set_variable("binlake_apply_tasks", None)
    assert state == "success", stack.tasks("binlake_apply", "replica")
    assert stack.tasks("binlake_apply", "replica")["apply[0]"] == ("success", 1)
    assert stack.xcom("binlake_apply", "replica", "diff", map_index=0)["diff"] == "OK"
    _restored_equal(stack.upstream, target)


# ---------------------------------------------------------------- binlake_restore
def _at(stack: Stack) -> str:
    """The restore's datetime (UTC): the last second of the ingested window."""
    return (stack.window[1] - dt.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")


def test_restore_with_the_form_defaults_and_verify(stack: Stack) -> None:
    """The issue's journey: datetime + tz, tables left empty, a target, verify."""
    target = f"sqlite:///{stack.root / 'restored.db'}"
    conf = stack.form_conf("binlake_restore", datetime=_at(stack), tz="UTC", target=target, verify=stack.upstream)
    assert conf["tables"] is None and conf["replace"] is False and conf["out"] is None
    stack.run("binlake_restore", "first", conf)
    assert stack.wait("binlake_restore", "first") == "success", stack.tasks("binlake_restore", "first")
    tasks = stack.tasks("binlake_restore", "first")
    assert {t: s for t, (s, _n) in tasks.items()} == dict.fromkeys(
        ("resolve", "check_coverage", "rebuild", "load", "verify"), "success"), tasks
    verified = stack.xcom("binlake_restore", "first", "verify")
    assert verified["ok"] is True and "OK" in verified["summary"].upper(), verified
    loaded = stack.xcom("binlake_restore", "first", "load")["loaded"]
    assert {t["table"].rpartition(".")[2] for t in loaded} == set(verified["tables"]) and len(loaded) >= 2
    _restored_equal(stack.upstream, target)

    # Another run into the same target: refused at check_coverage, naming the tables; nothing rebuilt.
    # (A retry of the same run replaces what it made: tests/dags/test_param_checks.py.)
    stack.run("binlake_restore", "second", conf)
    stack.fails_first("binlake_restore", "second", "check_coverage", "already holds table(s)", "set replace",
                      *verified["tables"])
    assert stack.tasks("binlake_restore", "second")["rebuild"][0] in ("upstream_failed", None)
    _restored_equal(stack.upstream, target)


def test_restore_one_table_to_out_by_commit_ts(stack: Stack) -> None:
    from deltalake import DeltaTable

    from binlake import tso

    engine = sa.create_engine(stack.upstream)
    with engine.connect() as conn:
        name = next(n for n in sa.inspect(conn).get_table_names() if not n.startswith("_binlake_"))
        rows = conn.exec_driver_sql(f'SELECT COUNT(*) FROM "{name}"').scalar_one()
    engine.dispose()
    out = stack.root / "out"
    ts = tso.from_datetime(stack.window[1]) - 1
    stack.run("binlake_restore", "to-out", stack.form_conf("binlake_restore", commit_ts=ts, tables=f"main.{name}",
                                                           out=str(out)))
    assert stack.wait("binlake_restore", "to-out") == "success", stack.tasks("binlake_restore", "to-out")
    tasks = stack.tasks("binlake_restore", "to-out")
    assert tasks["load"][0] == "skipped" and tasks["verify"][0] == "skipped"
    assert DeltaTable(str(out / f"main.{name}")).to_pyarrow_table().num_rows == rows
    assert [p.name for p in out.iterdir() if not p.name.startswith("_")] == [f"main.{name}"]


# One run per kind of check (the rest of resolve's refusals: tests/dags/test_param_checks.py).
BAD_RESTORES = [
    ("nothing", {}, "resolve", ["exactly one of a commit_ts"]),
    ("tz-with-ts", {"commit_ts": 5, "tz": "UTC", "out": "/tmp/x"}, "resolve", ["tz applies to datetime only"]),
    ("bad-zone", {"datetime": "2026-11-21T08:00:00", "tz": "Mars/Base", "out": "/tmp/x"}, "resolve",
     ["unknown time zone 'Mars/Base'"]),
    ("two-destinations", {"commit_ts": 5, "out": "/tmp/x", "target": "sqlite:////tmp/x.db"}, "resolve",
     ["exactly one destination"]),
    ("verify-without-target", {"commit_ts": 5, "out": "/tmp/x", "verify": "sqlite:////tmp/up.db"}, "resolve",
     ["verify compares a target database"]),
    ("unknown-table", {"tables": "nope", "out": "OUT"}, "check_coverage", ["nope"]),
]


def test_restore_bad_params_fail_the_first_task_without_retries(stack: Stack) -> None:
    for run_id, filled, _task, _messages in BAD_RESTORES:
        filled = {**filled, "out": str(stack.root / "never")} if filled.get("out") == "OUT" else filled
        if run_id == "unknown-table":
            filled["datetime"], filled["tz"] = _at(stack), "UTC"
        stack.run("binlake_restore", f"bad-{run_id}", stack.form_conf("binlake_restore", **filled))
    for run_id, _filled, task, messages in BAD_RESTORES:
        stack.fails_first("binlake_restore", f"bad-{run_id}", task, *messages)
    assert not (stack.root / "never").exists()
    # The form's own checks refuse some values before any run exists.
    for filled in ({"datetime": "yesterday"}, {"target": "nope"}, {"tables": "a.b.c"}, {"commit_ts": -1}):
        status, body = stack.trigger("binlake_restore", "refused", stack.form_conf("binlake_restore", **filled))
        assert status == 400, (filled, status, body)


# ---------------------------------------------------------------- binlake_maintenance and binlake_ingest
def test_maintenance_bad_setting_fails_its_first_tasks(stack: Stack) -> None:
    stack.set_variable("binlake_vacuum_retention_hours", "0")
    try:
        stack.run("binlake_maintenance", "bad-retention", stack.form_conf("binlake_maintenance"))
        stack.fails_first("binlake_maintenance", "bad-retention", "snapshot", "binlake_vacuum_retention_hours",
                          "got '0'")
        assert stack.tasks("binlake_maintenance", "bad-retention")["gc_report"] == ("failed", 1)
    finally:
        stack.set_variable("binlake_vacuum_retention_hours", None)


def test_ingest_bad_settings_and_no_window_fail_the_first_task(stack: Stack) -> None:
    stack.run("binlake_ingest", "no-window", {})
    stack.fails_first("binlake_ingest", "no-window", "plan", "no data interval")
    stack.set_variable("binlake_ingest_mode", "fast")
    try:
        stack.run("binlake_ingest", "bad-mode", {}, logical_date=stack.window[1],
                  interval=(stack.window[1], stack.window[1] + dt.timedelta(seconds=5)))
        stack.fails_first("binlake_ingest", "bad-mode", "plan",
                          "Airflow Variable binlake_ingest_mode: 'fast' is not one of")
    finally:
        stack.set_variable("binlake_ingest_mode", None)


def test_a_late_window_runs_the_deadline_callback(stack: Stack) -> None:
    """A run whose window closes in the future (its wait defers) and whose logical date
    is two hours old: its deadline (window length + 1s grace) passed at creation, so
    the triggerer runs binlake's callback, which POSTs to the webhook."""
    future = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=3)
    old = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    stack.run("binlake_ingest", "late", {}, logical_date=old, interval=(future, future + dt.timedelta(minutes=1)))
    try:
        deadline = time.monotonic() + 90
        while not any(b.get("run_id") == "late" for b in stack.hook.bodies):
            assert time.monotonic() < deadline, f"no deadline alert after 90s: {stack.hook.bodies}"
            time.sleep(1)
    finally:
        stack.call("PATCH", "/dags/binlake_ingest/dagRuns/late", {"state": "failed"})
    body = next(b for b in stack.hook.bodies if b.get("run_id") == "late")
    assert body["dag_id"] == "binlake_ingest" and "is not in the lake" in body["text"]
    assert body["window_end"].startswith((future + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M"))


# ---------------------------------------------------------------- freshness
def test_lake_status_reports_the_newest_window_and_its_lag(stack: Stack) -> None:
    from binlake import tso

    args = ["lake", "status", "--lake", str(stack.lake), "--registry", stack.registry]
    started = dt.datetime.now(dt.UTC)
    done = subprocess.run([*BINLAKE, *args, "--json"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    end_ts = tso.from_datetime(stack.window[1])
    assert status["windows"] == 1 and status["newest_end_ts"] == end_ts and status["gaps"] == []
    # The Pump's safe ts follows the clock (its fake binlogs): the lag is the time since the window's end.
    behind = (started - stack.window[1]).total_seconds()
    assert behind - 10 < status["lag_s"] < behind + 30, (behind, status)
    assert status["windows_waiting"] == math.floor(status["lag_s"] / status["newest_window_s"])
    assert [p["pump"] for p in status["pumps"]] == ["pump1"]
    lake_consumers = [c for c in status["consumers"] if str(stack.lake) in c["consumer"]]
    assert lake_consumers and lake_consumers[0]["checkpoint_ts"] == end_ts, status["consumers"]

    human = subprocess.run([*BINLAKE, *args], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert human.returncode == 0, human.stderr
    assert "newest window   ends" in human.stdout and "lag " in human.stdout and "consumer" in human.stdout

    bad = subprocess.run([*BINLAKE, "lake", "status", "--lake", str(stack.root / "nope")], env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_lake_metrics_serve_the_lag(stack: Stack) -> None:
    proc = subprocess.Popen([*BINLAKE, "lake", "metrics", "--lake", str(stack.lake), "--registry", stack.registry,
                             "--addr", "127.0.0.1:0"], env=clean_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split()[3]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), line
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("binlake_lake_")}
    assert values["binlake_lake_up"] == 1 and values["binlake_lake_windows"] == 1
    behind = (dt.datetime.now(dt.UTC) - stack.window[1]).total_seconds()
    assert behind - 15 < values["binlake_lake_lag_seconds"] <= behind + 5, (behind, values)
    assert values["binlake_lake_newest_window_end_seconds"] == stack.window[1].timestamp()


# ---------------------------------------------------------------- binlake_drill
DRILL_RUNS = ("drill-defaults", "drill-every-param")


def _upstream_tables(stack: Stack) -> list[str]:
    engine = sa.create_engine(stack.upstream)
    with engine.connect() as conn:
        names = sorted(n for n in sa.inspect(conn).get_table_names() if not n.startswith("_binlake_"))
    engine.dispose()
    return names


@pytest.fixture(scope="module")
def drill_runs(stack: Stack) -> dict[str, dict[str, Any]]:
    """Two binlake_drill runs, queued at once (the DAG runs one at a time): the form's
    defaults, and every param set. run id -> conf. (Each reason a drill fails, and its
    line: tests/restore/test_drill.py; the failure callback's alert: tests/dags.)"""
    from binlake import tso

    end = tso.from_datetime(stack.window[1])
    names = _upstream_tables(stack)
    confs = {
        "drill-defaults": stack.form_conf("binlake_drill"),
        "drill-every-param": stack.form_conf(
            "binlake_drill", ts=end - 1, tables=",".join(f"main.{n}" for n in names[:2]), count=1, seed=7,
            until_ts=end, target=f"sqlite:///{stack.root / 'drill-target.db'}", upstream=stack.upstream,
            rpo_s=86400, rto_s=600),
    }
    for run_id in DRILL_RUNS:
        stack.run("binlake_drill", run_id, confs[run_id])
    for run_id in DRILL_RUNS:
        stack.wait("binlake_drill", run_id)
    return confs


def _asset_extra(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    events = stack.get(f"/assets/events?source_dag_id=binlake_drill&source_run_id={_q(run_id)}")["asset_events"]
    return [e["extra"] for e in events]


def test_drill_with_the_form_defaults_and_every_param(stack: Stack, drill_runs: dict[str, dict[str, Any]]) -> None:
    from binlake import tso
    from binlake.lake.store import drills

    defaults, full = drill_runs["drill-defaults"], drill_runs["drill-every-param"]
    assert all(v is None for v in defaults.values()), defaults
    recorded = {r["drill_id"]: r for r in drills.read(str(stack.lake))}
    end = tso.from_datetime(stack.window[1])
    for run_id in ("drill-defaults", "drill-every-param"):
        assert stack.wait("binlake_drill", run_id) == "success", (
            stack.tasks("binlake_drill", run_id), stack.log("binlake_drill", run_id, "drill")[-2000:])
        assert stack.tasks("binlake_drill", run_id) == dict.fromkeys(
            ("check", "drill", "report", "verdict"), ("success", 1))
        figures = stack.xcom("binlake_drill", run_id, "drill")
        assert figures["verdict"] == "passed" and figures["failure"] is None and figures["rows"] > 0, figures
        # (b) compared the whole-history path (the stack has no snapshot or history tables yet).
        assert figures["proof_paths"].startswith("passed") and "whole history" in figures["proof_paths"], figures
        assert figures["proof_apply"].startswith("skipped"), figures  # no task file in this stack
        assert figures["until_ts"] == end and 0 < figures["ts"] < end, figures
        assert figures["pump_lag_s"].keys() == {"pump1"}, figures  # the RPO's other half: the Pump's lag
        # The Asset event carries the figures; the drills table holds the drill as passed.
        assert _asset_extra(stack, run_id) == [figures]
        assert recorded[figures["drill_id"]]["verdict"] == "passed"
        assert recorded[figures["drill_id"]]["restore_s"] == figures["restore_s"]

    drawn = stack.xcom("binlake_drill", "drill-defaults", "drill")
    # Drawn: a seed recorded (a replay gives it with until_ts), every table (fewer than [drill] tables),
    # the objectives of [drill], proof (c) not asked for.
    assert drawn["seed"] is not None and drawn["rpo_objective_s"] == 3600 and drawn["rto_objective_s"] == 3600
    assert sorted(t.rpartition(".")[2] for t in drawn["tables"].split(",")) == _upstream_tables(stack), drawn
    assert drawn["proof_upstream"].startswith("skipped"), drawn
    # The default scratch target: a SQLite file below binlake_drill_scratch_dir, removed after the drill.
    log = stack.log("binlake_drill", "drill-defaults", "drill")
    assert f"into sqlite:///{stack.root / 'drill-scratch'}/binlake-drill-" in log, log[-3000:]
    assert list((stack.root / "drill-scratch").iterdir()) == []

    given = stack.xcom("binlake_drill", "drill-every-param", "drill")
    assert given["ts"] == full["ts"] and given["tables"] == full["tables"] and given["seed"] is None, given
    assert given["rpo_objective_s"] == 86400 and given["rto_objective_s"] == 600
    # (c): the tables are unchanged since the ts, so the upstream's checksums now are compared.
    assert given["proof_upstream"].startswith("passed"), given
    _restored_equal(stack.upstream, full["target"], [t.partition(".")[2] for t in full["tables"].split(",")])
    assert not any(b.get("run_id") in ("drill-defaults", "drill-every-param") for b in stack.hook.bodies)


# ---------------------------------------------------------------- the trigger form in a browser
def _chrome() -> Any:
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
    except ImportError:
        pytest.skip("selenium is not installed (pip install -c constraints.txt -e '.[dev]')")
    driver_path = shutil.which("chromedriver")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not driver_path or not binary:
        pytest.skip("Chromium or chromedriver not found (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    try:
        return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    except WebDriverException as exc:
        pytest.skip(f"Chromium cannot start here: {str(exc).splitlines()[0]}")


def test_restore_form_in_a_browser(stack: Stack) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    target = f"sqlite:///{stack.root / 'browser.db'}"
    before = {r["dag_run_id"] for r in stack.get("/dags/binlake_restore/dagRuns")["dag_runs"]}
    driver = _chrome()
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{stack.ui}/dags/binlake_restore")
        wait.until(ec.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Trigger']"))).click()
        # The form: one input per param, with the id element_<param>.
        for name, value in (("datetime", _at(stack)), ("tz", "UTC"), ("target", target), ("verify", stack.upstream)):
            field = wait.until(ec.presence_of_element_located((By.ID, f"element_{name}")))
            driver.execute_script("arguments[0].scrollIntoView(true);", field)
            field.click()
            field.send_keys(value, Keys.TAB)
            if field.get_attribute("value") != value:
                # The UI's keyboard shortcuts swallow some keys typed into its inputs (a "b"
                # after "/" was lost every time): set the value as React expects a change.
                driver.execute_script(
                    "const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;"
                    " set.call(arguments[0], arguments[1]);"
                    " arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", field, value)
                field.send_keys(Keys.TAB)
            assert field.get_attribute("value") == value, (name, field.get_attribute("value"))
        # tables is optional: its label carries no required-field asterisk.
        tables = driver.find_element(By.ID, "element_tables")
        label = driver.execute_script(
            "let e = arguments[0]; while (e && !e.innerText.includes('tables')) e = e.parentElement;"
            " return e ? e.innerText : '';", tables)
        assert label.startswith("tables") and "*" not in label.split("\n")[0], label
        buttons = driver.find_elements(By.XPATH, "//*[@role='dialog']//button[normalize-space()='Trigger']")
        assert buttons, driver.page_source[-2000:]
        buttons[-1].click()
        deadline = time.monotonic() + 30
        while True:
            new = {r["dag_run_id"] for r in stack.get("/dags/binlake_restore/dagRuns")["dag_runs"]} - before
            if new or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(new) == 1, "the form created no run"
    finally:
        driver.quit()
    (run_id,) = new
    conf = stack.get(f"/dags/binlake_restore/dagRuns/{_q(run_id)}")["conf"]
    assert conf["target"] == target and conf["datetime"] == _at(stack) and not conf.get("tables"), conf
    state = stack.wait("binlake_restore", run_id)
    assert state == "success", (stack.tasks("binlake_restore", run_id), conf,
                                stack.log("binlake_restore", run_id, "verify")[-3000:])
    assert stack.xcom("binlake_restore", run_id, "verify")["ok"] is True
    _restored_equal(stack.upstream, target)


def test_the_drill_report_renders_its_plots_in_a_browser(stack: Stack, drill_runs: dict[str, dict[str, Any]]) -> None:
    """The page the DAG wrote (LAKE/drills.html, after the last run) as Chromium renders it:
    both plots drawn, one point per drill placed inside its plot at its value, the failed
    drill red, the objective's dashed line, the verdict history one row per drill."""
    from selenium.webdriver.common.by import By

    from binlake.lake.store import drills

    rows = drills.read(str(stack.lake))
    page = stack.lake / "drills.html"
    assert page.is_file()
    driver = _chrome()
    try:
        driver.get(page.as_uri())
        assert driver.title == "binlake restore drills"
        for metric in ("restore_s", "rpo_s"):
            svg = driver.find_element(By.ID, f"plot-{metric}")
            box = svg.rect
            assert svg.is_displayed() and box["width"] >= 600 and box["height"] >= 200, box
            points = svg.find_elements(By.CSS_SELECTOR, "circle.point")
            want = [r for r in rows if r[metric] is not None]
            assert len(points) == len(want) >= 2, (metric, len(points), len(want))
            assert [float(str(c.get_attribute("data-value"))) for c in points] == pytest.approx(
                [r[metric] for r in want], rel=1e-4)
            seen = []
            for c in points:
                r = c.rect
                assert c.is_displayed() and r["width"] > 0, r
                # Drawn inside the plot's box, the larger value higher up.
                assert box["x"] <= r["x"] and r["x"] + r["width"] <= box["x"] + box["width"], (r, box)
                assert box["y"] <= r["y"] and r["y"] + r["height"] <= box["y"] + box["height"], (r, box)
                seen.append((float(str(c.get_attribute("data-value"))), r["y"], c.get_attribute("data-verdict"),
                             c.get_attribute("fill")))
            for (v1, y1, _a, _b), (v2, y2, _c, _d) in zip(seen, seen[1:], strict=False):
                assert (v1 - v2) * (y2 - y1) >= 0, seen
            assert all(fill == {"passed": "#283", "failed": "#c22"}[str(verdict)] for _v, _y, verdict, fill in seen)
            assert {verdict for _v, _y, verdict, _f in seen} >= {"passed"}
            assert svg.find_elements(By.TAG_NAME, "polyline")
        # The RTO objective (600 s, then 3600 s: far above these restores): a dashed line across
        # the plot, above every point (a horizontal line has no height, so is_displayed says no).
        svg = driver.find_element(By.ID, "plot-restore_s")
        objective = svg.find_element(By.CSS_SELECTOR, "line.objective")
        assert objective.get_attribute("stroke-dasharray") and objective.rect["width"] >= 0.8 * svg.rect["width"]
        assert svg.rect["y"] <= objective.rect["y"] < min(c.rect["y"] for c in svg.find_elements(
            By.CSS_SELECTOR, "circle.point")), (objective.rect, svg.rect)
        verdicts = driver.find_elements(By.CSS_SELECTOR, "#verdicts tbody tr")
        assert len(verdicts) == len(rows)
        assert sum(1 for v in verdicts if v.get_attribute("class") == "failed") == sum(
            1 for r in rows if r["verdict"] == "failed")
        last = driver.find_element(By.CSS_SELECTOR, "p.last")
        assert rows[-1]["verdict"].upper() in last.text and last.is_displayed(), last.text
    finally:
        driver.quit()
