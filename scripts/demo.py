"""`make demo`: what binlake proves so far, end to end, on embedded defaults.

Act 1 - a Pump cluster survives kill -9: starts a registry and three Pumps as
processes, writes transactions through the PumpClient from several threads
(prewrite, the "upstream commit" recorded in the writer's status service,
commit), kills one Pump with SIGKILL mid-load, shows the client failing over,
restarts the Pump, reads the whole window back and checks nothing
acknowledged was lost or served twice.

Act 2 - the binlog is the upstream: a deterministic workload (bank transfers,
sysbench-like OLTP, DDL interleaved) runs through TxnWriter against a SQLite
upstream; every transaction is read back from the Pumps in commit_ts order and
replayed into an empty database from the binlogs alone; the replica's
per-table checksums equal the upstream's, and the bank's total never moved.

Act 3 - the lake: the ``binlake_ingest`` DAG runs (``airflow dags test``
against a real SQLite metadata database, one run per 10-second data interval)
over every window act 2's workload spans; each run plans the window, waits for
the Pumps' safe ts, ingests it with Spark into the Delta change table and
publishes the asset. The demo prints the ``windows`` ledger and checks that
the change table holds exactly the workload's row changes and DDLs, with no
gap between windows, and that running a window again changes nothing.

Act 4 - apply: the ``binlake_apply`` DAG applies the lake to a SQLite target
and ``binlake diff`` against the upstream prints every table OK
(``scripts/demo_apply.py``).

Act 5 - point in time: ``binlake restore`` rebuilds every table as of a
commit_ts taken in the middle of act 2's workload, as Delta tables and into a
DuckDB file, and both equal the upstream copied at that very ts; the bank total
is unchanged (``scripts/demo_restore.py``).

Act 6 - an existing database: ``binlake source mysql`` follows a MariaDB's
row binlog through a kill -9 of the source, and the binlogs in the Pumps
rebuild the MariaDB exactly (``scripts/demo_sources.py``; skipped when
MariaDB is not installed).

Act 7 - replicated Pumps: every binlog on two Pumps; a Pump's host is lost for
good in the middle of a workload, which finishes without a failed transaction;
the window over the run is ready without the dead Pump, and ``binlake ingest``
puts it into a Delta lake while that Pump is still dead
(``scripts/demo_replicas.py``).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import demo_restore
from rich.console import Console

from binlake import errors, tso
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.config import ClientSettings
from binlake.ctl.actions import binlog_to_json, pumps_table
from binlake.proto import binlog_pb2 as bp
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord
from binlake.stack.supervisor import local_airflow
from binlake.testing.devcluster import DevCluster
from binlake.writer.txn_status import MemoryStatusProvider, TxnStatusServer

WRITERS = 8
RUN_SECONDS = 6.0
KILL_AT = 2.0
# Act 3's ingest interval: the DAG's data intervals are this long, aligned to its start date.
WINDOW_S = 10
DAGS = pathlib.Path(__file__).resolve().parents[1] / "dags"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_prewrite(start_ts: int, writer: str, n: int) -> bp.Binlog:
    row = bp.Row(columns=[
        bp.Column(id=1, value=bp.Datum(int_value=n)),
        bp.Column(id=2, value=bp.Datum(string_value=f"order {n}")),
        bp.Column(id=3, value=bp.Datum(decimal_value=f"{n % 1000}.25")),
    ])
    value = bp.PrewriteValue(schema_version=1, mutations=[
        bp.TableMutation(table_id=100, inserted_rows=[row.SerializeToString()], sequence=[bp.INSERT]),
    ])
    return bp.Binlog(tp=bp.PREWRITE, start_ts=start_ts, prewrite_key=writer.encode(),
                     prewrite_value=value.SerializeToString())


def main() -> int:
    root = pathlib.Path(tempfile.mkdtemp(prefix="binlake-demo-"))
    say(f"working under {root}")
    cluster = DevCluster(root, pumps=3, pump_args=[
        "--stop-write-at-free-bytes", "0", "--fake-binlog-interval-s", "0.5", "--txn-timeout-s", "3",
    ])
    try:
        cluster.start()
        say(f"registry at {cluster.registry_addr}; pumps " + ", ".join(f"{k}@{v}" for k, v in cluster.pump_addrs.items()))
        took: list[tuple[str, float]] = []
        mark = time.monotonic()

        def done(act: str) -> None:
            nonlocal mark
            took.append((act, time.monotonic() - mark))
            mark = time.monotonic()

        rc = run(cluster)
        done("1 pumps, kill -9")
        capture = demo_restore.Capture.start(root / "upstream.db", min_txns=1000)  # act 5's mid-run copy
        rc2, summary = act2(cluster, root)
        done("2 workload, replay")
        rc3 = act3(cluster, root, summary)
        done("3 ingest DAG")
        from demo_apply import act4  # act 4: the apply DAG and binlake diff

        rc4 = act4(root, _airflow_env(cluster, root), f"sqlite:///{root}/upstream.db") if not rc3 else 1
        done("4 apply DAG, diff")
        rc5 = demo_restore.act4(root, capture)  # act 5: restore to a mid-run commit_ts
        done("5 restore")
        from demo_sources import act_sources  # act 6: back up an existing MariaDB

        rc6 = act_sources(cluster, root)
        done("6 MariaDB source")
        from demo_replicas import act_replicas  # act 7: two copies, a Pump host lost for good

        rc7 = act_replicas(cluster, root)
        done("7 replicas, host lost")
        total = sum(t for _a, t in took)
        say("time per act: " + ", ".join(f"act {a} {t:.0f}s" for a, t in took) + f"; total {total / 60:.1f} min")
        return rc or rc2 or rc3 or rc4 or rc5 or rc6 or rc7
    except errors.BinlakeError as exc:
        say(f"FAILED: {exc}")
        return 1
    finally:
        cluster.stop()
        say("stopped every process")
        shutil.rmtree(root, ignore_errors=True)


def run(cluster: DevCluster) -> int:
    provider = MemoryStatusProvider()
    status = TxnStatusServer(provider).start()
    reg = RegistryClient(cluster.registry_addr)
    reg.register(NodeRecord(node_id="demo-writer", kind="writer", addr=status.addr))
    client = PumpClient(settings=ClientSettings(registry=cluster.registry_addr, probe_interval_s=0.5,
                                                refresh_interval_s=0.5, write_timeout_s=3.0))
    acked: list[tuple[int, int, str]] = []
    committed_upstream: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors_seen: list[str] = []
    per_pump: dict[str, int] = {}

    def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            start_ts = reg.get_ts()
            try:
                pump = client.write_prewrite(make_prewrite(start_ts, "demo-writer", w * 1_000_000 + n))
            except errors.BinlakeError as exc:
                errors_seen.append(str(exc))
                provider.set_rolled_back(start_ts)
                continue
            commit_ts = reg.get_ts()
            provider.set_committed(start_ts, commit_ts)  # the upstream commit
            with lock:
                committed_upstream[start_ts] = commit_ts
            try:
                client.write_commit(bp.Binlog(tp=bp.COMMIT, start_ts=start_ts, commit_ts=commit_ts), pump)
            except errors.BinlakeError as exc:
                errors_seen.append(str(exc))
                continue
            with lock:
                acked.append((start_ts, commit_ts, pump))
                per_pump[pump] = per_pump.get(pump, 0) + 1

    first_ts = reg.get_ts()
    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
    say(f"writing transactions from {WRITERS} threads for {RUN_SECONDS:g}s")
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(KILL_AT)
    before = len(acked)
    say(f"{before} transactions acknowledged; kill -9 pump2")
    cluster.kill9("pump2")
    time.sleep(1.5)
    say(f"client now routes prewrites to {client.available()} (unavailable: {client.unavailable()}); "
        f"{len(acked) - before} more acknowledged meanwhile")
    say("restarting pump2 on the same data dir")
    cluster.restart("pump2")
    time.sleep(max(0.0, RUN_SECONDS - (time.monotonic() - t0)))
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    say(f"pump2 available again: {'pump2' in client.available()}; acknowledged per pump: {dict(sorted(per_pump.items()))}")
    end_ts = reg.get_ts() + 1
    say("waiting until every pump's safe ts passes the last commit (pending prewrites resolve via the writer)")
    nodes = cluster.pump_addrs
    got = list(pull_window(nodes, first_ts, end_ts, wait=True, wait_timeout_s=60))
    served = {b.start_ts: b.commit_ts for b in got}
    ordered = all((a.commit_ts, a.start_ts) < (b.commit_ts, b.start_ts) for a, b in zip(got, got[1:], strict=False))
    lost = [s for s, c, _ in acked if served.get(s) != c]
    phantom = [s for s in served if s not in committed_upstream]
    dup = len(got) - len(served)
    say(f"dumped window [{first_ts}, {end_ts}) = [{tso.to_datetime(first_ts):%H:%M:%S.%f}, "
        f"{tso.to_datetime(end_ts):%H:%M:%S.%f}) from 3 pumps")
    for b in got[:2]:
        print("  " + json.dumps(binlog_to_json(b, rows=True))[:300])
    print(f"  ... ({len(got)} transactions; `binlake ctl dump` prints them all)")
    nodes_now, _ = reg.list_nodes("pump")
    Console(width=200).print(pumps_table(nodes_now))
    print()
    print("  transactions committed upstream : ", len(committed_upstream))
    print("  acknowledged by the pumps        : ", len(acked), f"({len(acked) / elapsed:.0f}/s)")
    print("  read back (unique, in order)     : ", len(served), "in commit_ts order" if ordered else "OUT OF ORDER")
    print("  lost (acknowledged, not served)  : ", len(lost))
    print("  served but never committed       : ", len(phantom))
    print("  served twice                     : ", dup)
    print("  write errors seen by writers     : ", len(errors_seen))
    ok = not lost and not phantom and not dup and ordered and len(served) >= len(acked)
    print()
    print("VERDICT (act 1):", "PASS - a Pump was killed with -9 mid-load; nothing acknowledged was lost or "
          "served twice" if ok else "FAIL")
    client.close()
    reg.close()
    status.stop()
    return 0 if ok else 1


def replay(binlogs: list[bp.Binlog], url: str) -> dict[str, int]:
    """Rebuild a database from binlogs alone (DDL statements as logged, rows by key)."""
    import sqlalchemy as sa

    from binlake import codec
    from binlake.sql import dialect, schema

    engine = sa.create_engine(url)
    tables: dict[int, bp.TableInfo] = {}
    counts = {"ddl": 0, "insert": 0, "update": 0, "delete": 0}
    with engine.begin() as conn:
        for b in binlogs:
            if b.ddl_query:
                for stmt in b.ddl_query.decode().split("; "):
                    conn.exec_driver_sql(stmt)
                info = b.ddl_table
                tables.pop(info.previous_table_id, None)
                if info.dropped:
                    tables.pop(info.table_id, None)
                else:
                    tables[info.table_id] = info
                counts["ddl"] += 1
                continue
            for m in bp.PrewriteValue.FromString(b.prewrite_value).mutations:
                info = tables[m.table_id]
                t = dialect.sa_table(info, "sqlite")
                keys = schema.key_columns(info)
                it = {bp.INSERT: iter(m.inserted_rows), bp.UPDATE: iter(m.updated_rows),
                      bp.DELETE_ROW: iter(m.deleted_rows)}

                def where(row: dict, t: sa.Table = t, keys: list = keys):
                    return sa.and_(*[t.c[k] == row[k] for k in keys])

                for kind in m.sequence:
                    data = next(it[kind])
                    if kind == bp.INSERT:
                        conn.execute(t.insert().values(**codec.decode_row(data, info)))
                        counts["insert"] += 1
                    elif kind == bp.UPDATE:
                        old, new = codec.decode_update(data, info)
                        conn.execute(t.update().where(where(old)).values(**new))
                        counts["update"] += 1
                    else:
                        conn.execute(t.delete().where(where(codec.decode_row(data, info))))
                        counts["delete"] += 1
    engine.dispose()
    return counts


def act2(cluster: DevCluster, root: pathlib.Path) -> tuple[int, Any]:
    from binlake.sql import checksum
    from binlake.workload import plan as wplan
    from binlake.workload import run as wrun
    from binlake.writer.txn_writer import TxnWriter

    print()
    upstream = f"sqlite:///{root}/upstream.db"
    replica = f"sqlite:///{root}/replica.db"
    txns = wplan.plan("mixed", tables=2, txns=2500, seed=2026, large_txn_rows=2000, large_txn_every=800,
                      table_rows=300, accounts=50)
    # Act 3 ingests whole 10-second windows: start on a window boundary, so
    # act 1's transactions (a table no DDL ever defined) fall in none of them.
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)
    say(f"act 2: workload 'mixed' (bank + oltp + DDL), {len(txns)} planned transactions, seed 2026, "
        f"4 clients -> SQLite upstream {upstream}")
    with TxnWriter(upstream, registry=cluster.registry_addr) as writer:
        summary = wrun.run(writer, txns, clients=4, progress=True)
        writer.flush()
    print(wrun.format_summary(summary))
    total_after = wrun.bank_total(upstream)
    say(f"reading [{summary.start_ts}, {summary.end_ts}) back from every pump")
    got = list(pull_window(cluster.pump_addrs, summary.start_ts, summary.end_ts, wait=True, wait_timeout_s=120))
    say(f"{len(got)} transactions read ({summary.transactions} written); replaying them into an empty database")
    counts = replay(got, replica)
    up = checksum.checksum(upstream)
    rep = checksum.checksum(replica, schema=checksum.load_schema(upstream))
    print()
    print(f"  {'table':<14} {'upstream rows':>13} {'replica rows':>13}  checksums")
    for name in sorted(set(up) | set(rep)):
        a, b = up.get(name, (0, "-")), rep.get(name, (0, "-"))
        print(f"  {name:<14} {a[0]:>13} {b[0]:>13}  {'equal' if a == b else 'DIFFERENT'}")
    print(f"  replayed: {counts['ddl']} DDLs, {counts['insert']} inserts, {counts['update']} updates, "
          f"{counts['delete']} deletes (workload: {summary.ddls} DDLs, {summary.inserts} inserts, "
          f"{summary.updates} updates, {summary.deletes} deletes)")
    print(f"  bank total after the run: {total_after} (every transfer kept it; 50 accounts x 1000.00)")
    ok = (up == rep and len(got) == summary.transactions and summary.errors == 0
          and counts["insert"] == summary.inserts and counts["update"] == summary.updates
          and counts["delete"] == summary.deletes)
    print()
    print("VERDICT (act 2):", "PASS - the binlogs in the Pumps rebuild the upstream exactly (checksums equal)"
          if ok else "FAIL")
    return (0 if ok else 1), summary


def _airflow_env(cluster: DevCluster, root: pathlib.Path) -> dict[str, str]:
    home = root / "airflow"
    return {
        **os.environ,
        **local_airflow(home, DAGS),
        # The DAG's shape (read when the file is parsed) and its settings (read by its tasks).
        "BINLAKE_INGEST_SCHEDULE": f"{WINDOW_S}s",
        "BINLAKE_INGEST_START_DATE": "2026-01-01T00:00:00",
        "BINLAKE_REGISTRY": cluster.registry_addr,
        "BINLAKE_LAKE_DIR": str(root / "lake"),
        "BINLAKE_INGEST_MODE": "inprocess",
        "BINLAKE_SPARK_MASTER": "local[2]",
        "BINLAKE_SAFE_TS_POLL_S": "0.5",
    }


def act3(cluster: DevCluster, root: pathlib.Path, summary: Any) -> int:
    import datetime as dt
    import subprocess

    print()
    env = _airflow_env(cluster, root)
    home = pathlib.Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    say(f"act 3: the binlake_ingest DAG over act 2's windows; Airflow metadata (SQLite) in {home}")
    done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        say("FAILED: airflow db migrate")
        return 1
    first = tso.to_datetime(summary.start_ts).timestamp() // WINDOW_S * WINDOW_S
    last = -(-tso.to_datetime(summary.end_ts).timestamp() // WINDOW_S) * WINDOW_S
    ends = [dt.datetime.fromtimestamp(t, dt.UTC) for t in range(int(first) + WINDOW_S, int(last) + 1, WINDOW_S)]
    # The runs happen in a child process: Airflow reads its configuration from the
    # environment when first imported, and its logs and Spark's go to a file there.
    results = home / "runs.jsonl"
    log = home / "dag-runs.log"
    spec = {"ends": [e.isoformat() for e in ends], "lake": env["BINLAKE_LAKE_DIR"], "registry": cluster.registry_addr,
            "results": str(results), "since_ts": summary.start_ts}
    say(f"{len(ends)} windows of {WINDOW_S}s cover the workload; one DAG run each (dag.test against that "
        f"metadata DB; Airflow and Spark logs in {log})")
    with log.open("w") as out:
        # dag.test() (Airflow 3.3) cannot finish a run of a DAG that declares a
        # DeadlineAlert (it looks the alert up by its serialized form, not the id the
        # scheduler's sync gives it): this child parses the ingest DAG without its deadline.
        child = subprocess.Popen([sys.executable, __file__, "--dag-runs", json.dumps(spec)],
                                 env={**env, "BINLAKE_INGEST_DEADLINE": "off"}, stdout=out, stderr=subprocess.STDOUT)
        report: dict[str, Any] = {}
        seen = 0
        while True:
            finished = child.poll() is not None
            lines = results.read_text().splitlines() if results.exists() else []
            for line in lines[seen:]:
                item = json.loads(line)
                if "report" in item:
                    report = item["report"]
                else:
                    say(f"  run {item['run']}/{len(ends)}: window [{item['start']}, {item['end']}) -> "
                        f"{item['state']} in {item['seconds']:.0f}s")
            seen = len(lines)
            if finished:
                break
            time.sleep(0.5)
    if child.returncode != 0 or not report:
        print("\n".join(log.read_text().splitlines()[-40:]))
        say(f"FAILED: the DAG runs (exit {child.returncode}); see {log}")
        return 1
    return _act3_verdict(report, summary, len(ends))


def _act3_verdict(report: dict[str, Any], summary: Any, planned: int) -> int:
    print()
    print(f"  {'window (UTC)':<19} {'txns':>5} {'DDLs':>4} {'rows':>6} {'insert':>7} {'update':>7} {'delete':>7}  tables")
    ops = {"insert": 0, "update": 0, "delete": 0}
    for w in report["windows"]:
        per_op = {op: sum(n for k, n in w["rows_per_table_op"].items() if k.endswith(":" + op)) for op in ops}
        tables = len({k.rsplit(":", 1)[0] for k in w["rows_per_table_op"]})
        print(f"  {w['start']}-{w['end']}   {w['txns']:>5} {w['ddls']:>4} {w['rows']:>6} {per_op['insert']:>7} "
              f"{per_op['update']:>7} {per_op['delete']:>7}  {tables}")
        for op in ops:
            ops[op] += per_op[op]
    windows = report["windows"]
    bounds = [(w["start_ts"], w["end_ts"]) for w in windows]
    contiguous = len(bounds) == planned and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    made = summary.inserts + summary.updates + summary.deletes
    again = report["again"]
    print()
    print(f"  DAG runs succeeded               :  {report['succeeded']} of {planned}")
    print(f"  windows in the ledger            :  {len(windows)}, {'contiguous (no gap, no overlap)' if contiguous else 'NOT CONTIGUOUS'}")
    print(f"  row changes in the change table  :  {report['changes']} (inserts {ops['insert']}, updates "
          f"{ops['update']}, deletes {ops['delete']})")
    print(f"  row changes the workload made    :  {made} (inserts {summary.inserts}, updates {summary.updates}, "
          f"deletes {summary.deletes})")
    print(f"  DDLs in ddl_history / workload   :  {report['ddls']} / {summary.ddls}")
    print(f"  window {again['start']}-{again['end']} run again :  {again['rows']} rows, replaced; its rows "
          f"{'unchanged' if again['unchanged'] else 'CHANGED'}; the table holds {again['changes_after']} rows")
    ok = (report["succeeded"] == planned and contiguous
          and ops == {"insert": summary.inserts, "update": summary.updates, "delete": summary.deletes}
          and report["changes"] == again["changes_after"] == made and report["ddls"] == summary.ddls
          and again["unchanged"] and again["replaced"])
    print()
    print("VERDICT (act 3):", "PASS - the ingest DAG put exactly the workload's row changes and DDLs into the "
          "Delta change table, window by window; running a window again changed nothing" if ok else "FAIL")
    return 0 if ok else 1


def dag_runs(spec: dict[str, Any]) -> int:
    """Act 3's child: one ``dag.test`` of binlake_ingest per window end, then what
    the lake holds. Writes JSON lines to ``spec['results']`` as it goes."""
    import datetime as dt

    from airflow.dag_processing.dagbag import DagBag

    from binlake.lake import ingest
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.lake.store import ledger as lake_ledger
    from binlake.lake.store import location

    results = pathlib.Path(spec["results"])

    def emit(item: dict[str, Any]) -> None:
        with results.open("a") as f:
            f.write(json.dumps(item) + "\n")

    # Started before the runs, so every in-process ingest reuses this JVM.
    spark = build_spark("binlake-demo", "local[2]", shuffle_partitions=2, extra_conf=LAKE_CONF)
    bag = DagBag(dag_folder=str(DAGS))
    if bag.import_errors:
        print(bag.import_errors)
        return 1
    dag = bag.dags["binlake_ingest"]
    succeeded = 0
    for i, end_text in enumerate(spec["ends"], 1):
        end = dt.datetime.fromisoformat(end_text)
        t0 = time.monotonic()
        run = dag.test(logical_date=end)
        state = str(run.state)
        succeeded += state == "success"
        emit({"run": i, "start": f"{end - dt.timedelta(seconds=WINDOW_S):%H:%M:%S}", "end": f"{end:%H:%M:%S}",
              "state": state, "seconds": time.monotonic() - t0})
    lake = spec["lake"]

    def hm(ts: int) -> str:
        return f"{tso.to_datetime(ts):%H:%M:%S}"

    windows = [{"start_ts": w["start_ts"], "end_ts": w["end_ts"], "start": hm(w["start_ts"]), "end": hm(w["end_ts"]),
                "txns": w["txns"], "ddls": w["ddls"], "rows": w["rows"],
                "rows_per_table_op": dict(w["rows_per_table_op"])} for w in lake_ledger.read_windows(spark, lake)]

    def changes() -> Any:
        return spark.read.format("delta").load(location.table_path(lake, location.CHANGES))

    in_lake = changes().count()
    ddls = spark.read.format("delta").load(location.table_path(lake, location.DDL_HISTORY)).where(
        f"commit_ts >= {int(spec['since_ts'])}").count()
    # Idempotence: the middle window again; its rows must come out the same.
    mid = windows[len(windows) // 2]
    where = f"commit_ts >= {mid['start_ts']} AND commit_ts < {mid['end_ts']}"
    before = sorted(map(tuple, changes().where(where).collect()))
    again = ingest.ingest_window(spark, lake, spec["registry"], mid["start_ts"], mid["end_ts"])
    after = sorted(map(tuple, changes().where(where).collect()))
    emit({"report": {"succeeded": succeeded, "windows": windows, "changes": in_lake, "ddls": ddls,
                     "again": {"start": mid["start"], "end": mid["end"], "rows": again.rows, "replaced": again.replaced,
                               "unchanged": before == after, "changes_after": changes().count()}}})
    spark.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--dag-runs":
        sys.exit(dag_runs(json.loads(sys.argv[2])))
    sys.exit(main())
