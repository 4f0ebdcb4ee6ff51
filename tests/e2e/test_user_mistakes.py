"""No traceback for a user mistake, anywhere: every subcommand of ``binlake`` (found
by walking ``binlake.cli.build_parser()``, so commands added later are covered
without touching this file) and ``jobs/ingest.py``, fed malformed values for
each of its options, exits 2 with one line that names the input, and never
prints or logs a traceback.

Values are chosen from the option's type and name: bad numbers and
out-of-range ones, bad addresses and ports in use, missing or unwritable
directories, missing/malformed/unknown-key TOML, bad URL schemes and
unreachable databases, empty strings. Each command starts from a valid baseline
(an in-process registry, scratch directories), so the malformed value is the only
thing wrong. Commands that would serve forever (registry, pump, up) are run up to
the point where they would start serving, then stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import pathlib
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pumpkit import free_port, start_registry

from binlake import cli
from binlake.cli import benchmarks
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOWHERE = "/proc/binlake-no-such-dir/x"  # cannot be created, whoever runs the tests


@dataclasses.dataclass
class Ctx:
    registry: str
    tmp: pathlib.Path
    busy: str  # HOST:PORT something listens on
    free_port: int  # a port nothing listens on
    file: pathlib.Path  # a regular file (not a directory)
    sqlite: str  # URL of an existing SQLite database
    tomls: dict[str, tuple[pathlib.Path, str]]  # name -> (file, what the message must name)
    task: pathlib.Path  # a valid replication task file (the empty lake -> SQLite)
    tasks: dict[str, tuple[pathlib.Path, str]]  # malformed task files -> what the message must name
    dead_port: int  # a port nothing listens on, for unreachable databases


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    tmp = tmp_path_factory.mktemp("mistakes")
    server = start_registry(tmp / "registry")
    with RegistryClient(server.addr) as reg:
        reg.register(NodeRecord(node_id="p0", kind="pump", addr="127.0.0.1:9"))
        reg.update_consumer("c0", 1)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    (tmp / "lake").mkdir()  # an (empty) lake, so lake commands get past --lake
    plain = tmp / "plain.txt"
    plain.write_text("not a directory\n")
    db = tmp / "db.sqlite"
    import sqlite3

    sqlite3.connect(db).execute("CREATE TABLE t (id INTEGER PRIMARY KEY)").connection.close()
    bad_toml = tmp / "bad.toml"
    bad_toml.write_text("[registry\naddr = \n")
    unknown = tmp / "unknown.toml"
    unknown.write_text("[registry]\nbogus_key = 1\n[pump]\nbogus_key = 1\n[security]\nbogus_key = 1\n")
    bad_value = tmp / "value.toml"
    bad_value.write_text("[registry]\ntso_window_ms = -5\n[pump]\ntxn_timeout_s = -5\n")
    lake_dir, replica = tmp / "lake", tmp / "replica.db"
    task_head = f'name = "walk"\nlake = "{lake_dir}"\ntarget = "sqlite:///{replica}"\n'
    task = tmp / "task.toml"
    task.write_text(task_head + 'mode = "consistent"\n')
    task_bad = tmp / "task-bad.toml"
    task_bad.write_text(task_head + 'mode = "consistent\n')
    task_unknown = tmp / "task-unknown.toml"
    task_unknown.write_text(task_head + 'mode = "consistent"\nbogus_key = 1\n')
    task_value = tmp / "task-value.toml"
    task_value.write_text(task_head + 'mode = "sideways"\nbatch_rows = -5\n')
    task_missing_key = tmp / "task-nomode.toml"
    task_missing_key.write_text(task_head)
    yield Ctx(
        registry=server.addr, tmp=tmp, busy=f"127.0.0.1:{listener.getsockname()[1]}", free_port=free_port(),
        file=plain,
        sqlite=f"sqlite:///{db}",
        tomls={"missing": (tmp / "missing.toml", "missing.toml"), "malformed": (bad_toml, "bad.toml"),
               "unknown": (unknown, "bogus_key"), "value": (bad_value, "-5")},
        task=task,
        tasks={"missing": (tmp / "no-task.toml", "no-task.toml"), "malformed": (task_bad, "task-bad.toml"),
               "unknown": (task_unknown, "bogus_key"), "value": (task_value, "sideways"),
               "missing key": (task_missing_key, "mode"), "a directory": (tmp / "lake", "lake")},
        dead_port=free_port(),
    )
    listener.close()
    server.stop(0.5)


# ------------------------------------------------------------------------ baselines
# A valid invocation of each command; the case replaces one option's value.
# Keys are command paths; values map an option (or "#0" for the first positional)
# to its value. A command missing here fails the test: add its baseline.
def baselines(c: Ctx) -> dict[tuple[str, ...], dict[str, str]]:
    reg = {"--registry": c.registry}
    window = {"--start-ts": "1", "--end-ts": "2"}
    lake = str(c.tmp / "lake")
    return {
        (): {**reg},  # top-level options, on `ctl ts`
        ("registry",): {"--data-dir": str(c.tmp / "reg-data"), "--addr": "127.0.0.1:0"},
        ("pump",): {**reg, "--data-dir": str(c.tmp / "pump-data"), "--addr": "127.0.0.1:0", "--node-id": "ptest",
                    "--stop-write-at-free-bytes": "0"},
        ("up",): {"--data-dir": str(c.tmp / "up"), "--pumps": "1", "--registry-addr": "127.0.0.1:0",
                  "--pump-port-base": "0", "--airflow-port": str(c.free_port)},
        ("ctl", "pumps"): {**reg},
        ("ctl", "pause-pump"): {"#0": "p0", **reg},
        ("ctl", "offline-pump"): {"#0": "p0", **reg},
        ("ctl", "ts"): {**reg},
        ("ctl", "dump"): {**reg, **window},
        ("ctl", "checksum"): {"#0": c.sqlite},
        ("ctl", "consumers"): {**reg},
        ("ctl", "remove-consumer"): {"#0": "c-none", **reg},
        ("ctl", "registry"): {**reg},
        ("ctl", "replication"): {**reg},
        ("ctl", "snapshot-progress"): {"--data-dir": str(c.tmp / "src-mysql")},
        ("workload",): {**reg, "--upstream": f"sqlite:///{c.tmp / 'up.db'}", "--txns": "1", "--tables": "1",
                        "--table-rows": "0", "--clients": "1", "--quiet": ""},
        ("ingest",): {**reg, **window, "--lake": lake, "--master": "local[1]"},
        ("lake", "windows"): {"--lake": lake, "--master": "local[1]"},
        ("lake", "changes"): {"--lake": lake, "--master": "local[1]", "--table": "t"},
        ("lake", "status"): {"--lake": lake, **reg},
        ("lake", "metrics"): {"--lake": lake, **reg, "--addr": "127.0.0.1:0"},
        ("bench", "pump"): {"--seconds": "0.1", "--dir": str(c.tmp / "bench")},
        ("bench", "writer"): {"--seconds": "0.1"},
        ("bench", "registry"): {"--runs": "1", "--seconds": "0.1", "--threads": "1"},
        ("bench", "ingest"): {"--rows": "10", "--dir": str(c.tmp / "bench"), "--master": "local[1]"},
        ("bench", "source"): {"--rows": "10", "--seconds": "0.1", "--dir": str(c.tmp / "bench")},
        ("bench", "apply"): {"--changes": "1000", "--windows": "1", "--targets": "sqlite", "--modes": "consistent",
                             "--master": "local[1]"},
        ("bench", "scale"): {"--rows": "1000", "--dir": str(c.tmp / "bench"), "--master": "local[1]",
                             "--parallel": "1"},
        ("bench", "restore"): {"--rows": "10", "--changes": "10", "--dir": str(c.tmp / "bench"),
                               "--master": "local[1]"},
        # The sources' databases are unreachable on purpose (a real server would make
        # the baseline stream forever): every other option is checked before connecting.
        ("source", "mysql"): {"--dsn": f"mysql://root@127.0.0.1:{c.dead_port}", "--server-id": "4001",
                              "--registry": c.registry, "--data-dir": str(c.tmp / "src-mysql"),
                              "--start": "now", "--tables": "app.*", "--status-addr": "127.0.0.1:0"},
        ("source", "postgres"): {"--dsn": f"postgresql://u@127.0.0.1:{c.dead_port}/db", "--slot": "binlake",
                                 "--publication": "binlake", "--registry": c.registry,
                                 "--data-dir": str(c.tmp / "src-pg"), "--status-addr": "127.0.0.1:0"},
        ("apply",): {"#0": "status", "--task": str(c.task), "--lake": lake, "--target": f"sqlite:///{c.tmp / 'replica.db'}",
                     "--master": "local[1]"},
        ("diff",): {"#0": c.sqlite, "#1": c.sqlite, "--tables": "t", "--chunk-size": "100",
                    "--fix-sql": str(c.tmp / "fix.sql")},
        ("snapshot",): {"--lake": lake, "--master": "local[1]", "--tables": "t", "--datetime": "2026-11-21T08:00",
                        "--tz": "UTC"},
        ("history",): {"--lake": lake, "--master": "local[1]", "--tables": "t"},
        ("drill",): {"--lake": lake, "--master": "local[1]", "--ts": "470614378216685568", "--tables": "t",
                     "--count": "1", "--seed": "3", "--until-ts": "470614378216685568",
                     "--target": f"sqlite:///{c.tmp / 'drill.db'}", "--tasks": str(c.task), "--upstream": c.sqlite,
                     "--registry": c.registry, "--rpo-s": "60", "--rto-s": "60", "--report": str(c.tmp / "d.html")},
        ("drill", "report"): {"--lake": lake, "--master": "local[1]", "--html": str(c.tmp / "drills.html")},
        ("bench", "drill"): {"--tables": "1", "--rows": "10", "--dir": str(c.tmp / "bench"), "--master": "local[1]"},
        ("restore",): {"--lake": lake, "--master": "local[1]", "--tables": "t", "--datetime": "2026-11-21T08:00",
                       "--tz": "UTC", "--target": f"sqlite:///{c.tmp / 'restored.db'}", "--verify": c.sqlite},
        ("undo",): {"--lake": lake, "--master": "local[1]", "--start": "2026-11-21T08:00", "--end": "2026-11-21T09:00",
                    "--tz": "UTC", "--tables": "t", "--where": "op = 'update'", "--target": c.sqlite,
                    "--sql": str(c.tmp / "undo.sql"), "--max-conflicts": "5"},
        ("bench", "undo"): {"--changes": "1000", "--dir": str(c.tmp / "bench"), "--master": "local[1]"},
        ("bench", "snapshot"): {"--rows": "100", "--tables": "2", "--db": "mariadb", "--dir": str(c.tmp / "bench"),
                                "--master": "local[1]"},
    }


# ------------------------------------------------------------------------ malformed values
_ADDRS = {"addr", "registry", "registry_addr", "advertise_addr", "metrics_addr", "status_addr"}
_LISTEN = {"addr", "metrics_addr", "registry_addr", "status_addr"}
_DIRS = {"data_dir", "dir", "dags_folder", "plugins_folder", "out", "baseline"}
_URLS = {"upstream", "url", "schema_from", "source", "target", "verify"}
_NAMES = {"slot", "publication"}  # PostgreSQL identifiers
_TIMES = {"until", "datetime"}  # free-form datetimes
_LISTS = {"pumps", "tables", "writers", "sizes", "clients"}
_IDS = {"node_id", "consumer_id", "pump"}
_PEMS = {"ca", "cert", "key"}
# Options whose every value is acceptable (free text), or that are covered elsewhere.
_FREE = {"pump_args_ok"}

_BY_TYPE: dict[str, list[str]] = {
    "positive_int": ["abc", "0", "-3", ""],
    "non_negative_int": ["abc", "-1"],
    "positive_float": ["abc", "0", "nan", "-2"],
    "int_arg": ["abc", "1.5"],
    "window_ts_arg": ["abc", "-1", str(1 << 63)],
    "datetime_arg": ["yesterday", ""],
    "int": ["abc", "-1"],
    "float": ["abc", "-1", "nan"],
    "int_list": ["", ",", "a,b", "0"],
    "_ts": ["abc", "-1", str(1 << 63)],
    "_server_id": ["abc", "0", "-1", str(1 << 32)],
}


def malformed(action: argparse.Action, c: Ctx) -> list[tuple[str, tuple[str, ...]]]:
    """(value, extra strings the message may name instead of the option) for one option."""
    dest = action.dest
    if action.choices is not None:
        return [("bogus-choice", ())]
    type_name = getattr(action.type, "__name__", None)
    if type_name in _BY_TYPE:
        return [(v, ()) for v in _BY_TYPE[type_name]]
    if dest == "config":
        return [(str(path), (named,)) for path, named in c.tomls.values()]
    if dest in _ADDRS:
        values = ["nohost", "127.0.0.1:70000", ""]
        if dest in _LISTEN:
            values.append(c.busy)
        return [(v, ()) for v in values]
    if dest in _DIRS:
        return [(NOWHERE, ()), (str(c.file), ()), ("", ())]
    if dest in _URLS:
        return [("bogus://x", ()), ("", ()), ("postgresql+psycopg://u@127.0.0.1:1/db", ("127.0.0.1",))]
    if dest == "lake":
        return [(NOWHERE, ()), ("", ()), (str(c.file), ())]
    if dest == "master":
        return [("bogus-master", ()), ("", ())]
    if dest == "store":  # the registry's store URL
        return [("bogus://x", ()), ("", ()), ("etcd://127.0.0.1", ()), ("etcd://127.0.0.1:2379,,x:1", ())]
    if dest == "task":
        return [(str(path), (named,)) for path, named in c.tasks.values()]
    if dest == "tasks":  # task files or a directory of them
        return [(str(path), (named,)) for key, (path, named) in c.tasks.items() if key != "a directory"]
    if dest == "dsn":
        # A wrong scheme for one source kind, an unreachable server for the other.
        return [("bogus://x", ()), ("", ()), (f"mysql://root@127.0.0.1:{c.dead_port}", ("127.0.0.1",)),
                (f"postgresql://u@127.0.0.1:{c.dead_port}/db", ("127.0.0.1",))]
    if dest in _NAMES:
        return [("", ()), ("has space", ()), ("1starts_with_digit", ()), ("x" * 64, ())]
    if dest in _TIMES:
        return [("yesterday", ()), ("", ()), ("2026-13-45T99:00", ())]
    if dest == "tz":
        return [("Mars/Olympus", ()), ("", ())]
    if dest == "start":  # a binlog position
        return [("bogus", ()), ("", ()), ("binlog.000001:2", ()), ("gtid:", ())]
    if dest == "end":  # undo's end of a range: a TSO or a datetime
        return [("bogus", ()), ("", ()), ("2026-13-45T99:00", ())]
    if dest == "txn":
        return [("", ()), ("abc", ()), ("1,,x", ())]
    if dest == "where":  # a Spark SQL predicate: only the empty one is refused before the lake is read
        return [("", ()), ("  ", ())]
    if dest in ("fix_sql", "sql", "html", "report"):
        return [(NOWHERE, ()), (str(c.tmp), ()), ("", ())]
    if dest in _LISTS:
        return [("", ()), (",", ())]
    if dest in _IDS:
        return [("", ()), ("has space", ())]
    if dest in _PEMS:
        return [(str(c.tmp / "missing.pem"), ()), (str(c.file), ())]
    if dest == "pump_args":
        return [("--no-such-flag", ("no-such-flag",)), ("'unclosed", ("unclosed",))]
    if dest == "table":
        return [("", ())]
    if action.type is not None:
        return [("", ())]  # a type this table does not know yet: at least the empty string
    raise AssertionError(f"no malformed values known for option {dest!r}: add them to malformed()")


@dataclasses.dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    names: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join(a if a else "''" for a in self.argv)


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...],
                                                                                       argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    # A command with subcommands and flags of its own (``drill`` and ``drill report``)
    # is walked for its flags too; the top level's options are walked below.
    if not subs or (path and _options(parser)):
        yield path, parser
    for s in subs:
        for name, p in s.choices.items():
            yield from _leaves(p, (*path, name))


def _argv(base: dict[str, str], positionals: list[str]) -> list[str]:
    out = [*positionals]
    for opt, value in base.items():
        if opt.startswith("#"):
            continue
        out += [opt] if value == "" and opt in ("--no-airflow", "--quiet") else [opt, value]
    return out


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction)
            and a.nargs != 0]


def cases(c: Ctx, parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[Case]:
    base_of = baselines(c)
    out: list[Case] = []
    top = _options(parser)
    for path, leaf in _leaves(parser, ()):
        if not path:
            continue
        assert path in base_of, f"no baseline for `binlake {' '.join(path)}`: add one to baselines()"
        base = base_of[path]
        positionals = [base[k] for k in sorted(k for k in base if k.startswith("#"))]
        for action in _options(leaf):
            for value, extra in malformed(action, c):
                names = (*action.option_strings, action.dest, action.dest.replace("_", "-"),
                         action.dest.replace("_", " "), action.dest.upper(), *extra)
                if len(value) >= 3:
                    names += (value,)
                if action.option_strings:
                    opt = action.option_strings[-1]
                    # Options exclusive with this one leave the baseline, so argparse's
                    # "not allowed with" is not what reports the value.
                    rivals = {o for g in leaf._mutually_exclusive_groups if action in g._group_actions
                              for a in g._group_actions if a is not action for o in a.option_strings}
                    kept = {k: v for k, v in base.items() if k not in rivals}
                    argv = [*path, *_argv({**kept, opt: value}, positionals)]
                else:
                    index = [a for a in leaf._actions if not a.option_strings].index(action)
                    pos = list(positionals)
                    pos[index] = value
                    argv = [*path, *_argv(base, pos)]
                out.append(Case((*prefix, *argv), names))
    # Top-level options, on a command that needs only them and the registry.
    for action in top:
        if action.dest == "log_level":
            values: list[tuple[str, tuple[str, ...]]] = [("bogus-choice", ())]
        else:
            values = malformed(action, c)
        for value, extra in values:
            names = (*action.option_strings, action.dest, *extra) + ((value,) if len(value) >= 3 else ())
            out.append(Case((*prefix, action.option_strings[-1], value, "ctl", "ts", "--registry", c.registry),
                            names))
    return out


# ------------------------------------------------------------------------ running a case
@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """registry, pump and up stop where they would start serving (everything before,
    including binding ports, opening data dirs and registering, really runs); the
    benchmarks themselves do not run (their arguments are checked before)."""
    from binlake.pump import node
    from binlake.registry import server
    from binlake.stack import supervisor as stack

    def registry_run(settings: Any) -> None:
        server.RegistryServer(settings).start().stop(0)

    def pump_run(settings: Any) -> None:
        node.PumpNode(settings).start(register_timeout_s=5).stop(0)

    def up_run(self: Any) -> int:
        try:
            self._preflight()
        finally:
            self.stop()
        return 0

    class _NoBenchmark:
        # Benchmarks check their arguments before the module runs; running one
        # (clusters, Spark) for an accepted value would only make the case slow.
        @staticmethod
        def main(args: Any) -> int:
            return 0

    monkeypatch.setattr(benchmarks, "bench_module", lambda name: _NoBenchmark)
    monkeypatch.setattr(server, "run", registry_run)
    monkeypatch.setattr(node, "run", pump_run)
    monkeypatch.setattr(stack.Stack, "run", up_run)


CASE_TIMEOUT_S = 60.0


def run_main(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """``main(argv)``'s exit status, in a thread: a case that hangs (a malformed value
    accepted, and a command now waiting or serving) fails instead of stalling the suite."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(_run(main, argv)), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(CASE_TIMEOUT_S)
    if os.environ.get("BINLAKE_TEST_SHOW_CASES"):
        print(f"{time.monotonic() - started:6.2f}s {argv}", file=sys.__stderr__, flush=True)
    if not result:
        print(f"still running after {CASE_TIMEOUT_S:g}s", file=sys.stderr)
        return -1
    return result[0]


def _run(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:  # what a user would see as a traceback

        traceback.print_exc(file=sys.stderr)
        return 1


def check(case: Case, code: int, out: str, err: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """What is wrong with how ``case`` was reported (empty: nothing)."""
    problems = []
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2:
        problems.append(f"exit {code}, not 2")
    if "Traceback" in out + err or any(r.exc_info for r in caplog.records):
        problems.append("a traceback")
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not 1")
    elif not any(n and n in lines[0] for n in case.names):
        problems.append(f"the line names none of {case.names}")
    if problems:
        return [f"`binlake {case}`: {', '.join(problems)}: {err.strip()[:600]!r}"]
    return []


@pytest.mark.slow
def test_every_subcommand_reports_malformed_values_in_one_line(
    ctx: Ctx, no_serving: None, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Relative paths land here: a value taken as "." must not litter the checkout.
    cwd = ctx.tmp / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    all_cases = cases(ctx, cli.build_parser())
    # One parser for every case (argparse parsers are reusable): building it is most
    # of a rejected case's time, and what is walked is main's handling, not the build.
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert len(all_cases) > 150  # the walk found the commands
    failures: list[str] = []
    for case in all_cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            code = run_main(cli.main, list(case.argv))
        out, err = capsys.readouterr()
        failures += check(case, code, out, err, caplog)
    assert not failures, f"{len(failures)} of {len(all_cases)} cases:\n" + "\n".join(failures)
    assert sorted(p.name for p in cwd.iterdir()) == []


def test_an_unreachable_registry_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert cli.main(["ctl", "ts", "--registry", addr]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and f"registry {addr} is unreachable" in err and "Traceback" not in out + err


def _ingest_job() -> Any:
    spec = importlib.util.spec_from_file_location("binlake_job_ingest", ROOT / "jobs" / "ingest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ingest_job_reports_malformed_values_in_one_line(
    ctx: Ctx, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    job = _ingest_job()
    parser = job.build_parser()
    base = {"--start-ts": "1", "--end-ts": "2", "--lake": str(ctx.tmp / "lake"), "--registry": ctx.registry,
            "--master": "local[1]"}
    failures: list[str] = []
    count = 0
    for action in _options(parser):
        for value, extra in malformed(action, ctx):
            names = (*action.option_strings, action.dest, *extra) + ((value,) if len(value) >= 3 else ())
            case = Case(("jobs/ingest.py", *_argv({**base, action.option_strings[-1]: value}, [])), names)
            caplog.clear()
            code = run_main(job.main, list(case.argv[1:]))
            out, err = capsys.readouterr()
            failures += check(case, code, out, err, caplog)
            count += 1
    assert count > 10 and not failures, "\n".join(failures)


def test_a_command_without_a_baseline_or_known_values_fails_the_walk(ctx: Ctx) -> None:
    # The walk stays generic: a command added later must bring its baseline, and an
    # option of a new kind its malformed values, or the walk says what to add.
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.add_parser("brand-new").add_argument("--anything")
    with pytest.raises(AssertionError, match="no baseline for `binlake brand-new`: add one to baselines"):
        cases(ctx, parser)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["diff"].add_argument("--colour-scheme")
    with pytest.raises(AssertionError, match="no malformed values known for option 'colour_scheme'"):
        cases(ctx, parser)
