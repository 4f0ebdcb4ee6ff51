"""Pure parts of the sources: DDL tracking with sqlglot, the TSO journal and
checkpoint, and the CLI's one-line refusals (no servers needed)."""

from __future__ import annotations

import decimal
import json
import pathlib
import struct

import pytest

from binlake import cli, errors
from binlake.proto import binlog_pb2
from binlake.source.journal import SourceState
from binlake.source.mysql.tables import Catalog, TableFilter
from binlake.source.tables import assign_ids
from binlake.writer import txn_status

WANT = TableFilter("app.*")


def track(c: Catalog, sql: str, db: str = "app", version: int = 1, table_id: int = 100) -> list[object]:
    changes = c.apply(sql, db, WANT)
    for ch in changes:
        if ch.before is not None:
            c.remove(ch.before.db, ch.before.name)
        if ch.after is not None:
            assign_ids(ch.after, ch.before, ch.before.table_id if ch.before else table_id, version)
            c.put(ch.after)
    return changes


def test_create_alter_rename_keep_column_ids() -> None:
    c = Catalog(db_charsets={"app": "latin1"})
    track(c, "CREATE TABLE t (id BIGINT UNSIGNED NOT NULL, a VARCHAR(10), b DECIMAL(40,20), "
             "s SET('x','y'), PRIMARY KEY (id), UNIQUE KEY ua (a)) DEFAULT CHARSET=utf8mb4")
    t = c.get("app", "t")
    assert t is not None
    assert [(x.name, x.kind) for x in t.columns] == [("id", "uint"), ("a", "string"), ("b", "decimal"),
                                                       ("s", "string")]
    assert t.columns[1].charset == "utf8mb4" and t.columns[2].precision == 40 and t.columns[3].values == ["x", "y"]
    assert t.primary_key == ["id"] and t.unique_keys == {"ua": ["a"]}
    track(c, "ALTER TABLE t CHANGE a name VARCHAR(20), DROP COLUMN b, ADD COLUMN b INT FIRST", version=2)
    t = c.get("app", "t")
    assert t is not None
    assert [x.name for x in t.columns] == ["b", "id", "name", "s"]
    assert t.column_ids == {"id": 1, "name": 2, "s": 4, "b": 5}  # rename keeps 2; re-added b gets a new id
    assert t.unique_keys == {"ua": ["name"]}
    track(c, "RENAME TABLE t TO u", version=3)
    assert c.get("app", "t") is None and c.get("app", "u") is not None


def test_untracked_and_unparseable_statements() -> None:
    c = Catalog()
    assert c.apply("CREATE TABLE other.x (id INT PRIMARY KEY)", "app", WANT) == []
    assert c.apply("GRANT SELECT ON *.* TO 'u'@'%'", "app", WANT) == []
    assert c.apply("ALTER TABLE other.x ADD SPATIAL INDEX (g)", "app", WANT) == []
    with pytest.raises(errors.FailedPrecondition, match="app.g.p has type geometry"):
        c.apply("CREATE TABLE g (id INT PRIMARY KEY, p GEOMETRY)", "app", WANT)
    with pytest.raises(errors.FailedPrecondition, match="cannot follow DDL"):
        c.apply("CREATE TABLE h (id INT PRIMARY KEY, p POINT)", "app", WANT)  # beyond the parser: refused
    (ch,) = c.apply("CREATE TABLE nopk (a INT)", "app", WANT)
    with pytest.raises(errors.FailedPrecondition, match="no primary key"):
        assign_ids(ch.after, None, 100, 1)  # type: ignore[arg-type]


def test_journal_survives_a_torn_tail_and_rolls_back_orphans(tmp_path: pathlib.Path) -> None:
    st = SourceState(tmp_path)
    info = binlog_pb2.TableInfo(table_id=7, name="t")
    st.begin("f:10", 100, [info])
    st.decide("f:10", 105, "p1")
    st.begin("f:20", 110)  # prewrite may be out; no commit_ts minted
    assert st.txn_status(100) == (txn_status.COMMITTED, 105)
    assert st.txn_status(110) == (txn_status.RUNNING, 0)
    st.save(position=["f", 10])
    st.close()
    with (tmp_path / "journal.log").open("a") as f:
        f.write('{"k": "f:30", "s"')  # killed mid-write
    again = SourceState(tmp_path)
    d = again.decision("f:10")
    assert d is not None and (d.start_ts, d.commit_ts, d.pump) == (100, 105, "p1")
    assert d.ddl is not None and d.ddl[0].table_id == 7
    assert again.decision("f:20") is None
    assert again.txn_status(110) == (txn_status.ROLLED_BACK, 0)  # the orphan, rolled back at start
    assert again.txn_status(999) == (txn_status.ROLLED_BACK, 0)
    assert again.state["position"] == ["f", 10]
    assert json.loads((tmp_path / "state.json").read_text())["position"] == ["f", 10]
    again.close()


def test_a_forgotten_decision_is_never_answered_rolled_back(tmp_path: pathlib.Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pump may ask about a commit it acknowledged and then lost (a power loss
    before its fsync) long after: a decision the journal dropped is answered
    RUNNING (the Pump keeps waiting), never ROLLED_BACK (the Pump would drop a
    committed transaction); across restarts too."""
    from binlake.source import journal

    monkeypatch.setattr(journal, "KEEP_DECIDED", 2)
    st = SourceState(tmp_path)
    for i in range(5):
        st.begin(f"f:{i}", 100 + i)
        st.decide(f"f:{i}", 200 + i, "p1")
    # Five decided, more than 2 * KEEP_DECIDED: the oldest two were dropped from memory.
    assert st.txn_status(100) == (txn_status.RUNNING, 0)
    assert st.txn_status(104) == (txn_status.COMMITTED, 204)
    assert st.txn_status(999) == (txn_status.ROLLED_BACK, 0)  # above everything: never minted here
    st.close()
    # The next start reads all five from the file, then compacts it to the newest two
    # with a line saying what it dropped; the start after that knows only those two.
    again = SourceState(tmp_path)
    assert again.txn_status(100) == (txn_status.COMMITTED, 200)
    again.close()
    for _ in range(2):
        again = SourceState(tmp_path)
        assert [again.txn_status(100 + i) for i in range(5)] == [(txn_status.RUNNING, 0)] * 3 + [
            (txn_status.COMMITTED, 203), (txn_status.COMMITTED, 204)]
        assert again.txn_status(999) == (txn_status.ROLLED_BACK, 0)
        again.close()


def test_a_group_decision_is_all_or_none(tmp_path: pathlib.Path) -> None:
    st = SourceState(tmp_path)
    st.begin("snap:a", 10)
    st.begin("snap:b", 11)
    with pytest.raises(ValueError, match="never begun"):
        st.decide_many([("snap:zz", 20, "p1")])
    st.decide_many([("snap:a", 20, "p1"), ("snap:b", 21, "p2")])
    st.begin("snap2:a", 30)
    st.begin("snap2:b", 31)
    st.close()
    with (tmp_path / "journal.log").open("a") as f:
        f.write('{"m": [["snap2:a", 40, "p1"], ["snap2:b", 4')  # killed mid-write: none decided
    again = SourceState(tmp_path)
    assert again.txn_status(20 - 10) == (txn_status.COMMITTED, 20)
    assert again.txn_status(11) == (txn_status.COMMITTED, 21)
    d = again.decision("snap:b")
    assert d is not None and d.pump == "p2"
    assert again.txn_status(30) == (txn_status.ROLLED_BACK, 0)
    assert again.txn_status(31) == (txn_status.ROLLED_BACK, 0)
    again.close()
    third = SourceState(tmp_path)  # the compacted journal keeps the group's decisions
    assert third.txn_status(11) == (txn_status.COMMITTED, 21) and third.txn_status(31) == (txn_status.ROLLED_BACK, 0)
    third.close()


def test_a_group_begin_is_one_line_and_a_torn_one_began_nothing(tmp_path: pathlib.Path) -> None:
    st = SourceState(tmp_path)
    st.begin_many([("f:1", 10), ("f:2", 11)])
    st.decide_many([("f:1", 20, "p1"), ("f:2", 21, "p1")])
    st.begin_many([("f:3", 30), ("f:4", 31)])  # crashed before its decision line
    st.begin_many([("f:3", 40)])  # re-read in the same process: the old start_ts is rolled back
    assert st.txn_status(30) == (txn_status.ROLLED_BACK, 0) and st.txn_status(40) == (txn_status.RUNNING, 0)
    st.close()
    assert len((tmp_path / "journal.log").read_text().splitlines()) == 4
    with (tmp_path / "journal.log").open("a") as f:
        f.write('{"b": [["f:5", 50], ["f:6"')  # killed mid-write
    again = SourceState(tmp_path)
    d = again.decision("f:2")
    assert d is not None and (d.start_ts, d.commit_ts) == (11, 21)
    for ts in (30, 31, 40):
        assert again.txn_status(ts) == (txn_status.ROLLED_BACK, 0)
    assert again.decision("f:3") is None and again.decision("f:5") is None
    again.close()


def test_one_source_per_data_dir(tmp_path: pathlib.Path) -> None:
    first = SourceState(tmp_path)
    with pytest.raises(errors.FailedPrecondition, match="another source is running"):
        SourceState(tmp_path)
    first.close()
    SourceState(tmp_path).close()  # released on close (and by the kernel on kill -9)


@pytest.mark.parametrize("argv,message", [
    (["source", "mysql", "--dsn", "foo", "--server-id", "3"], "is not a MySQL URL"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--start", "binlog.1:x"],
     "expected now, FILE:POS"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--start", "snapshot",
      "--snapshot-batch-rows", "0"], "must be a positive number"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--tables", "nodot"],
     "must be DB.TABLE"),
    (["source", "postgres", "--dsn", "mysql://x", "--slot", "s", "--publication", "p"], "not a PostgreSQL URL"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--step-ms", "2000"],
     "expected milliseconds in 0..1000, got 2000"),
    (["source", "postgres", "--dsn", "postgresql://x@h/d", "--slot", "s", "--publication", "p", "--step-ms", "x"],
     "expected milliseconds in 0..1000, got 'x'"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--max-step-ms", "5000"],
     "expected milliseconds in 0..4000, got 5000"),
    (["source", "postgres", "--dsn", "postgresql://x@h/d", "--slot", "s", "--publication", "p", "--step-ms", "50",
      "--max-step-ms", "10"], "--max-step-ms 10 is below the step pace (50 ms, --step-ms)"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--snapshot-max-rows-per-s", "-5"],
     "expected rows/s in 0..1000000000.0, got -5"),
    (["source", "postgres", "--dsn", "postgresql://x@h/d", "--slot", "s", "--publication", "p",
      "--snapshot-max-rows-per-s", "nan"], "expected rows/s in 0..1000000000.0, got nan"),
    (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3", "--snapshot-max-rows-per-s",
      "lots"], "expected rows/s in 0..1000000000.0, got 'lots'"),
])
def test_cli_refuses_bad_input_in_one_line(argv: list[str], message: str, tmp_path: pathlib.Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.main([*argv, "--data-dir", str(tmp_path / "d")])
    except SystemExit as exc:  # a flag argparse refuses (its error is our one line, too)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("value", ["abc", "150", "-1"])
def test_a_bad_read_burst_setting_is_refused_in_one_line(value: str, tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """BINLAKE_READ_BURST_MS (source.readburst) is read when a source starts: a value it
    cannot use stops the start with one line naming it, before any connection."""
    from binlake.source import readburst

    monkeypatch.setenv(readburst.READ_BURST_ENV, value)
    for argv in (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3"],
                 ["source", "postgres", "--dsn", "postgresql://x@127.0.0.1:1/d", "--slot", "s", "--publication", "p"]):
        assert cli.main([*argv, "--data-dir", str(tmp_path / argv[1])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "[source] read_burst_ms / BINLAKE_READ_BURST_MS: " in err[0], err
        assert f"(got '{value}')" in err[0], err
    monkeypatch.setenv(readburst.READ_BURST_ENV, "0")
    assert readburst.read_burst_s() == 0.0
    monkeypatch.delenv(readburst.READ_BURST_ENV)
    assert readburst.read_burst_s() == readburst.READ_BURST_S


@pytest.mark.parametrize("text", ["abc", "", "1.5.5", "NaN", "-Infinity"])
def test_pgoutput_numeric_text_it_cannot_read_is_one_clear_error(text: str) -> None:
    """NUMERIC text the Python pgoutput path cannot carry (PostgreSQL never prints the first
    three; binlake carries finite NUMERICs only) is a FailedPrecondition naming the column,
    not decimal's raw InvalidOperation; the native decoder declines the same tuple, so the
    source reports it the same way on either path."""
    from binlake.source.postgres import pgplan, values
    from binlake.source.postgres.source import _Reader

    t = values.table("public", "t", values.columns("public", "t", [values.Attr("id", 23, -1),
                                                                   values.Attr("n", 1700, -1)]), ["id"])
    assign_ids(t, None, 100, 1)
    data = (struct.pack(">h", 2) + b"t" + struct.pack(">i", 1) + b"1"
            + b"t" + struct.pack(">i", len(text)) + text.encode())
    with pytest.raises(errors.FailedPrecondition, match=r"^public\.t\.n: value .* cannot be carried: not a"):
        values.decode_row(t, [23, 1700], _Reader(data).tuple_data())
    assert values.decode_row(t, [23, 1700], [b"1", b"-12.50"]) == {"id": 1, "n": decimal.Decimal("-12.50")}
    if pgplan.available():
        plan = pgplan.build_plan(t, [23, 1700], t.to_info())
        assert plan is not None and plan.row(data, 0) is None


def test_every_registered_source_builds_a_source(tmp_path: pathlib.Path) -> None:
    """``binlake source KIND`` offers exactly the sources in ``commands.SOURCES``, and each
    one's command builds a ``base.Source`` of its kind (no connection: ``run`` is not called)."""
    import importlib

    from binlake.source import commands
    from binlake.source.base import Source

    parser = cli.build_parser()
    names = []
    for module in commands.SOURCES:
        cmd = importlib.import_module(module).COMMAND
        names.append(cmd.name)
        extra = {"mysql": ["--server-id", "3"], "postgres": ["--slot", "s", "--publication", "p"]}[cmd.name]
        dsn = {"mysql": "mysql://root@127.0.0.1:1", "postgres": "postgresql://u@127.0.0.1:1/d"}[cmd.name]
        args = parser.parse_args(["source", cmd.name, "--dsn", dsn, *extra, "--data-dir", str(tmp_path / cmd.name)])
        assert args.data_dir == str(tmp_path / cmd.name) and args.snapshot_batch_rows == 10_000
        source = cmd.build(args, 0.025, None)
        try:
            assert isinstance(source, Source) and source.kind == cmd.name and not source.ready.is_set()
        finally:
            source.state.close()
    assert names == ["mysql", "postgres"]


def test_a_source_reads_the_registry_from_the_environment_as_every_client_does(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --registry a source takes [cluster] registry / BINLAKE_REGISTRY (as the docs
    say of every client): a value there that is no address is refused naming it, before
    any connection; --registry still wins over it."""
    monkeypatch.setenv("BINLAKE_REGISTRY", "not an address")
    for argv in (["source", "mysql", "--dsn", "mysql://root@127.0.0.1:1", "--server-id", "3"],
                 ["source", "postgres", "--dsn", "postgresql://x@127.0.0.1:1/d", "--slot", "s", "--publication", "p"]):
        assert cli.main([*argv, "--data-dir", str(tmp_path / argv[1])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "BINLAKE_REGISTRY" in err[0], err
        assert cli.main([*argv, "--data-dir", str(tmp_path / argv[1]), "--registry", "h1:8230,"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--registry" in err[0] and "BINLAKE_REGISTRY" not in err[0], err


def test_snapshot_pace_waits_until_the_rows_are_due_and_a_stop_ends_the_wait() -> None:
    import threading
    import time

    from binlake.source.rowpace import RowPace, check_rate

    t0 = time.monotonic()
    free = RowPace(0)
    for _ in range(100):
        free.after(10_000)
    assert time.monotonic() - t0 < 0.5 and free.waited_s == 0  # 0: no pace at all
    pace = RowPace(2_000)
    t0 = time.monotonic()
    for _ in range(4):
        pace.after(100)  # 400 rows at 2,000 rows/s: at least 0.2 s, each part waiting for its own rows too
    took = time.monotonic() - t0
    assert took >= 0.2 - 0.01 and pace.rows == 400
    assert 0.15 <= pace.waited_s <= took + 0.01
    stop = threading.Event()
    slow = RowPace(1, stop)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    slow.after(1_000)  # due in 1,000 s; the stop ends the wait
    assert time.monotonic() - t0 < 5
    for bad in (-1, float("nan"), float("inf"), True, "10"):
        with pytest.raises(errors.InvalidArgument, match="--snapshot-max-rows-per-s must be 0"):
            check_rate(bad)  # type: ignore[arg-type]
