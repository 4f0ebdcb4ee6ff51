"""``binlake ctl consumers`` and ``binlake ctl remove-consumer``: who holds Pump GC.

A consumer (the lake's ingest, later a replication task) holds every Pump's GC
at its checkpoint (``binlake.pump.gc``). These commands list the consumers
with their lag, warn about windows a hard GC limit already removed under a
consumer, and drop a consumer that will never come back so GC proceeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from binlake import errors, tso
from binlake.cli.args import add_registry, registry_addr
from binlake.registry.model import ConsumerRecord, NodeRecord


def add_parsers(csub: argparse._SubParsersAction, fmt: type[argparse.HelpFormatter]) -> None:  # type: ignore[type-arg]
    """Add the consumer actions to ``binlake ctl``'s subparsers ``csub`` (``ctl.commands`` calls it)."""
    c = csub.add_parser(
        "consumers", help="consumers holding Pump GC: checkpoint, lag, windows lost", formatter_class=fmt,
        description=(
            "List the registered consumers (the lake's ingest, ...). Every Pump keeps the binlogs at and above\n"
            "the lowest checkpoint, whatever its retention; a warning names any window a Pump's hard GC limit\n"
            "has already removed under a consumer."
        ),
        epilog="Example:\n  binlake ctl consumers --registry 127.0.0.1:8230\n",
    )
    add_registry(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c.set_defaults(handler=_consumers)
    c = csub.add_parser(
        "remove-consumer", help="drop a consumer so it no longer holds Pump GC", formatter_class=fmt,
        description="Drop a consumer that will not come back; the Pumps' next GC round may pass its checkpoint.",
        epilog="Example:\n  binlake ctl remove-consumer lake:/data/lake --registry 127.0.0.1:8230\n",
    )
    c.add_argument("consumer_id", help="the consumer's id (see `binlake ctl consumers`)")
    add_registry(c)
    c.set_defaults(handler=_remove)


def lost_windows(consumers: Sequence[ConsumerRecord], pumps: Sequence[NodeRecord]) -> list[str]:
    """One line per (consumer, Pump) where the Pump's GC ts passed the consumer's checkpoint."""
    out = []
    for c in consumers:
        for p in pumps:
            if p.gc_ts > c.checkpoint_ts:
                out.append(
                    f"pump {p.node_id} removed [{tso.format_ts(c.checkpoint_ts)}, {tso.format_ts(p.gc_ts)}) "
                    f"which consumer {c.consumer_id} has not read (a hard GC limit): those windows are lost "
                    "on that pump"
                )
    return out


def gc_holder(consumers: Sequence[ConsumerRecord]) -> str:
    """What holds every Pump's GC: the consumer with the lowest checkpoint, or retention."""
    low = min(consumers, key=lambda c: (c.checkpoint_ts, c.consumer_id), default=None)
    if low is None:
        return "retention only"
    return f"{low.consumer_id} @ {tso.format_ts(low.checkpoint_ts)}"


def _lag(ts: int) -> str:
    if ts <= 0:
        return "nothing consumed"
    return f"{max(0.0, time.time() - tso.physical_ms(ts) / 1000):.0f}s"


def _consumers(args: argparse.Namespace) -> int:
    from binlake.registry.client import RegistryClient

    with RegistryClient(registry_addr(args)) as reg:
        consumers = reg.list_consumers()
        pumps, _ = reg.list_nodes("pump")
    warnings = lost_windows(consumers, pumps)
    if args.json:
        for c in consumers:
            print(json.dumps({**c.__dict__, "checkpoint": tso.format_ts(c.checkpoint_ts) if c.checkpoint_ts else ""}))
    elif not consumers:
        print("no consumers registered: every Pump collects by retention alone")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Consumers (each holds every Pump's GC at its checkpoint)", title_justify="left")
        for col in ("consumer", "checkpoint ts", "checkpoint (UTC)", "lag", "description"):
            table.add_column(col, no_wrap=col == "consumer")
        for c in consumers:
            when = tso.to_datetime(c.checkpoint_ts).isoformat() if c.checkpoint_ts else "-"
            table.add_row(c.consumer_id, str(c.checkpoint_ts), when, _lag(c.checkpoint_ts), c.description)
        Console(width=200).print(table)
    for line in warnings:
        print(f"WARNING: {line}", file=sys.stderr)
    return 0


def _remove(args: argparse.Namespace) -> int:
    from binlake.registry.client import RegistryClient

    if not args.consumer_id.strip():
        raise errors.InvalidArgument("remove-consumer needs a consumer id (see `binlake ctl consumers`)")
    with RegistryClient(registry_addr(args)) as reg:
        rec = reg.remove_consumer(args.consumer_id)
    print(f"consumer {rec.consumer_id} removed (checkpoint was {tso.format_ts(rec.checkpoint_ts)}); "
          "the Pumps' next GC rounds no longer wait for it")
    return 0
