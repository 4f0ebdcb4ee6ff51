"""``binlake ctl``: the operator's view of the cluster (binlogctl's role)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from google.protobuf import json_format

from binlake import errors, tso
from binlake.cli.args import window_args
from binlake.client.reader import pull_pump, pull_window
from binlake.proto import binlog_pb2
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord, NodeState


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _age(ms: int) -> str:
    if ms <= 0:
        return "never"
    seconds = max(0.0, time.time() - ms / 1000)
    return f"{seconds:.0f}s ago"


def pumps_table(nodes: list[NodeRecord], gc_held_by: str = "") -> Any:
    from rich.table import Table

    title = "Pumps" + (f" (GC held by {gc_held_by})" if gc_held_by else "")
    table = Table(title=title, title_justify="left")
    for col in ("node", "address", "state", "max commit ts", "safe ts", "GC ts", "pending", "disk used",
                "disk free", "heartbeat"):
        table.add_column(col, no_wrap=col in ("node", "address"))
    for n in nodes:
        table.add_row(
            n.node_id, n.addr, n.state.value, tso.format_ts(n.max_commit_ts), tso.format_ts(n.safe_ts),
            tso.format_ts(n.gc_ts), str(n.pending_txns), _size(n.disk_used_bytes), _size(n.disk_free_bytes),
            _age(n.updated_at_ms),
        )
    return table


def run(args: argparse.Namespace, registry: str | None) -> int:
    if args.ctl_command == "checksum":
        return _checksum(args)  # a database read: no registry involved
    if args.ctl_command == "snapshot-progress":
        return _snapshot_progress(args)  # a data dir's file: no registry involved
    if registry is None:
        raise errors.InvalidArgument(f"ctl {args.ctl_command} needs --registry HOST:PORT")
    with RegistryClient(registry) as reg:
        cmd = args.ctl_command
        if cmd == "pumps":
            nodes, _ = reg.list_nodes("pump")
            if args.json:
                for n in nodes:
                    row = {**n.__dict__, "state": n.state.value}
                    print(json.dumps(row))
                return 0
            if not nodes:
                print(f"no pumps registered with {registry}")
                return 0
            from rich.console import Console

            from binlake.ctl.consumers import gc_holder, lost_windows

            consumers = reg.list_consumers()
            Console(width=200).print(pumps_table(nodes, gc_holder(consumers)))
            for line in lost_windows(consumers, nodes):
                print(f"WARNING: {line}", file=sys.stderr)
            if args.sole_copies or _replicas(reg) > 1:
                _print_sole_copies(nodes, consumers)
            return 0
        if cmd in ("pause-pump", "offline-pump"):
            node = reg.get_node(args.node_id)
            if node.kind != "pump":
                raise errors.InvalidArgument(f"node {args.node_id} is a {node.kind}, not a pump")
            target = NodeState.PAUSING if cmd == "pause-pump" else NodeState.CLOSING
            if cmd == "offline-pump" and not args.force and _replicas(reg) > 1:
                _check_no_sole_copy(reg, node)
            rec = reg.set_state(args.node_id, target)
            then = "paused" if target is NodeState.PAUSING else "offline"
            print(
                f"pump {rec.node_id}: state {rec.state.value}; it takes no new transactions and reports "
                f"'{then}' once its pending transactions are finished"
                + ("; it stays readable until GC passes its data" if then == "offline" else "")
            )
            return 0
        if cmd == "replication":
            return _replication(args, reg)
        if cmd == "ts":
            ts = reg.get_ts()
            print(f"{ts}\t{tso.to_datetime(ts).isoformat()}")
            return 0
        if cmd == "dump":
            return _dump(args, reg)
    raise errors.InvalidArgument(f"unknown ctl action {args.ctl_command!r}")


def _snapshot_progress(args: argparse.Namespace) -> int:
    from binlake.source.snapshot_group import read_progress

    p = read_progress(args.data_dir)
    if args.json:
        print(json.dumps(p))
        return 0
    eta = f", about {p['eta_s']:.0f}s left" if p.get("eta_s") is not None else ""
    pace = f", paced at {p['max_rows_per_s']:.0f} rows/s" if p.get("max_rows_per_s") else ""
    age = time.time() - float(p.get("updated_at") or 0)
    print(f"{p['source']} source snapshot (attempt {p['attempt']}) {p['state']}: {p['tables_done']}/{p['tables']} "
          f"tables, {p['rows']} of ~{p['rows_estimate']} rows, {p['bytes'] / 1e6:.1f} MB in {p['elapsed_s']:.0f}s "
          f"({p['rows_per_s']:.0f} rows/s{pace}, {p['mb_per_s']:.2f} MB/s){eta}; updated {age:.0f}s ago")
    return 0


def _replicas(reg: RegistryClient) -> int:
    """The largest R configured here or set in the registry (any copy may be the only one)."""
    from binlake.registry.replicas import configured

    return max([configured().replicas, *(s.replicas for s in reg.get_replication())])


def _replication(args: argparse.Namespace, reg: RegistryClient) -> int:
    from binlake.registry.replicas import configured_lookback_ms, min_acks_for_window

    # Checked whether or not a setting is appended: a bad value is never silently ignored.
    if not 0 <= args.grace_s <= 3600:
        raise errors.InvalidArgument(f"--grace-s must be between 0 and 3600 seconds, got {args.grace_s:g}")
    lookback = configured_lookback_ms()  # a bad [client] configuration fails before anything is set or shown
    if args.replicas is None:
        if args.min_acks is not None:
            raise errors.InvalidArgument("--min-acks needs --replicas (give both, e.g. --replicas 3 --min-acks 2)")
        history = reg.get_replication()
    else:
        acks = args.replicas if args.min_acks is None else args.min_acks
        history = reg.set_replication(args.replicas, acks, int(args.grace_s * 1000))
    if args.json:
        for s in history:
            print(json.dumps({"from_ts": s.from_ts, "replicas": s.replicas, "min_acks": s.min_acks}))
        return 0
    if not history:
        print("no replication setting: replicas = min_acks = 1 (or the writers' [client] configuration)")
    for s in history:
        print(f"from {tso.format_ts(s.from_ts)}: replicas={s.replicas} min_acks={s.min_acks}")
    if history:
        # When the latest W reaches reads: a window may hold transactions that started a
        # transaction's lifetime before it (replication.py says why it must wait that long).
        reads_from = tso.compose(tso.physical_ms(history[-1].from_ts) + lookback)
        acks = min_acks_for_window(history, reads_from, reads_from + 1, lookback_ms=lookback)
        print(f"reads: a window is read with the lowest min_acks in force from [client] txn_lookback_s "
              f"({lookback / 1000:g}s) before its start; min_acks={acks} from windows starting at "
              f"{tso.format_ts(reads_from)}")
    return 0


def _print_sole_copies(nodes: list[NodeRecord], consumers: list[Any]) -> None:
    """Per Pump, the transactions not consumed yet that no other reachable Pump holds."""
    from binlake.ctl.replicas import sole_copies

    sole, down = sole_copies(nodes, consumers)
    for node_id, copies in sorted(sole.items()):
        n = copies.count
        span = f", commit_ts {tso.format_ts(copies.first)} .. {tso.format_ts(copies.last)}" if n else ""
        print(f"pump {node_id}: {n} under-replicated transaction(s) held by no other pump in "
              f"[{tso.format_ts(copies.start_ts)}, {tso.format_ts(copies.end_ts)}){span}")
    for node_id, why in sorted(down.items()):
        print(f"pump {node_id}: unreachable, its copies cannot be compared ({why})")


def _check_no_sole_copy(reg: RegistryClient, node: NodeRecord) -> None:
    from binlake.ctl.replicas import refusal, sole_copies

    nodes, _ = reg.list_nodes("pump")
    sole, down = sole_copies(nodes, reg.list_consumers())
    if node.node_id in down:
        raise errors.FailedPrecondition(
            f"pump {node.node_id} is unreachable ({down[node.node_id]}): what only it holds cannot be checked; "
            "retire it with --force if its data is gone for good (replicated transactions survive on the others)")
    mine = sole.get(node.node_id)
    if mine is not None and mine.count:
        raise errors.FailedPrecondition(refusal(node.node_id, mine))


def binlog_to_json(b: binlog_pb2.Binlog, rows: bool = False) -> dict[str, Any]:
    """A complete transaction as a JSON-able dict (TiDB binlog's 'print' destination)."""
    out: dict[str, Any] = {
        "commit_ts": b.commit_ts,
        "commit_time": tso.to_datetime(b.commit_ts).isoformat(),
        "start_ts": b.start_ts,
    }
    if b.ddl_query:
        out["ddl_query"] = b.ddl_query.decode(errors="replace")
        out["ddl_job_id"] = b.ddl_job_id
        if b.HasField("ddl_table"):
            out["ddl_table"] = json_format.MessageToDict(b.ddl_table)
    value = binlog_pb2.PrewriteValue.FromString(b.prewrite_value)
    out["schema_version"] = value.schema_version
    muts = []
    for m in value.mutations:
        entry: dict[str, Any] = {
            "table_id": m.table_id,
            "inserts": len(m.inserted_rows),
            "updates": len(m.updated_rows),
            "deletes": len(m.deleted_rows),
            "sequence": [binlog_pb2.MutationType.Name(t) for t in m.sequence],
        }
        if rows:
            entry["inserted_rows"] = [json_format.MessageToDict(binlog_pb2.Row.FromString(r))
                                      for r in m.inserted_rows]
            entry["updated_rows"] = [json_format.MessageToDict(binlog_pb2.UpdatedRow.FromString(r))
                                     for r in m.updated_rows]
            entry["deleted_rows"] = [json_format.MessageToDict(binlog_pb2.Row.FromString(r))
                                     for r in m.deleted_rows]
        muts.append(entry)
    out["mutations"] = muts
    return out


def _dump(args: argparse.Namespace, reg: RegistryClient) -> int:
    start, end = window_args(args)
    nodes, _ = reg.list_nodes("pump")
    pumps = {n.node_id: n.addr for n in nodes}
    if args.pump is not None:
        if args.pump not in pumps:
            known = ", ".join(sorted(pumps)) or "none"
            raise errors.NotFound(f"no pump {args.pump!r} in the registry (known: {known})")
        stream = pull_pump(pumps[args.pump], start, end, node_id=args.pump, wait=args.wait)
    else:
        if not pumps:
            raise errors.NotFound("no pumps are registered; nothing to dump")
        pumps = _readable(reg, nodes, start, end, wait=args.wait)
        stream = pull_window(pumps, start, end, wait=args.wait)
    count = 0
    for b in stream:
        sys.stdout.write(json.dumps(binlog_to_json(b, args.rows)) + "\n")
        count += 1
    print(f"{count} transactions in [{start}, {end})", file=sys.stderr)
    return 0


def _readable(reg: RegistryClient, nodes: list[NodeRecord], start: int, end: int, wait: bool) -> dict[str, str]:
    """The Pumps to read ``[start, end)`` from: every one that may hold it, less up to
    W - 1 unreachable ones (``window.cluster_readiness``; each Pump checks its own
    safe ts and GC ts when read, waiting with ``wait``)."""
    from binlake.lake.pumps.planner import WindowPlan, pumps_for_window
    from binlake.lake.pumps.pump_check import pump_statuses
    from binlake.registry.replicas import cluster_min_acks
    from binlake.window import Readiness, Window, cluster_readiness, pump_views

    chosen = pumps_for_window(nodes, start, end)
    acks = cluster_min_acks(reg, start, end)
    if acks == 1:
        return {n.node_id: n.addr for n in chosen}
    down: dict[str, str] = {}
    statuses = pump_statuses(WindowPlan(start, end, tuple(chosen)), unreachable=down)
    # With --wait each reachable Pump waits for its own safe ts: only reachability counts here.
    views = pump_views([n.node_id for n in chosen],
                       {p: (end if wait else st.safe_ts, st.gc_ts) for p, st in statuses.items()})
    window = Window(start, end)
    verdict = cluster_readiness(window, views, acks)
    if verdict.state is Readiness.READY:
        if verdict.skipped:
            print(f"reading without unreachable pump(s) {', '.join(verdict.skipped)} (min_acks={acks}: every "
                  "transaction is on another pump too)", file=sys.stderr)
        keep = set(verdict.serve_from)
        return {n.node_id: n.addr for n in chosen if n.node_id in keep}
    if verdict.state is Readiness.GONE or not set(verdict.waiting) & set(verdict.unreachable):
        # A reachable Pump's own refusal names its GC ts or safe ts.
        return {n.node_id: n.addr for n in chosen if n.node_id in statuses}
    raise errors.Unavailable(verdict.describe(window) + "; " + "; ".join(f"{p}: {w}" for p, w in sorted(down.items())))


def _checksum(args: argparse.Namespace) -> int:
    from binlake.sql import checksum

    tables = [t.strip() for t in args.tables.split(",") if t.strip()] if args.tables else None
    if args.tables is not None and not tables:
        raise errors.InvalidArgument("--tables needs at least one table name (comma-separated)")
    if args.schema_from is not None and not args.schema_from.strip():
        raise errors.InvalidArgument("--schema-from is empty: give the SQLAlchemy URL of the upstream")
    schema = checksum.load_schema(args.schema_from) if args.schema_from else None
    sums = checksum.checksum(args.url, tables, include_internal=args.include_internal, schema=schema)
    if args.json:
        for name, (rows, digest) in sums.items():
            print(json.dumps({"table": name, "rows": rows, "checksum": digest}))
        return 0
    if not sums:
        print("no tables")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Checksums", title_justify="left")
    table.add_column("table", no_wrap=True)
    table.add_column("rows", justify="right")
    table.add_column("checksum", no_wrap=True)
    for name, (rows, digest) in sums.items():
        table.add_row(name, str(rows), digest)
    Console(width=200).print(table)
    return 0
