"""``binlake ctl registry``: the members of a registry group (who leads, the leader
each one sees, the etcd endpoint it uses, the TSO high-water mark, the lease left)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from binlake import errors, tso
from binlake.cli.args import add_registry, registry_addr
from binlake.net import parse_addr_list


def add_parsers(csub: argparse._SubParsersAction, fmt: type[argparse.HelpFormatter]) -> None:  # type: ignore[type-arg]
    """Add ``binlake ctl registry`` to the ctl actions ``csub``."""
    c = csub.add_parser(
        "registry", help="members of the registry group: leader, etcd endpoint, TSO mark, lease",
        formatter_class=fmt,
        description=(
            "Ask every registry named by --registry who it is and who leads: its role, the leader it sees,\n"
            "the etcd endpoint it uses, the TSO high-water mark the leader saved and the lease it has left.\n"
            "Exits 1 when no member leads."
        ),
        epilog="Example:\n  binlake ctl registry --registry h1:8230,h2:8230,h3:8230\n",
    )
    add_registry(c)
    c.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    c.set_defaults(handler=_members)


def member_rows(addrs: list[str]) -> list[dict[str, Any]]:
    """One dict per member: what its GetMember says, or that it is unreachable."""
    from binlake.registry.client import RegistryClient

    rows: list[dict[str, Any]] = []
    with RegistryClient(",".join(addrs), timeout_s=2.0) as reg:
        for addr in addrs:
            try:
                m = reg.member(addr, timeout_s=2.0)
            except errors.BinlakeError as exc:
                rows.append({"addr": addr, "role": "unreachable", "error": str(exc)})
                continue
            rows.append({
                "addr": addr, "role": "leader" if m.leader else "follower", "leader": m.leader_addr,
                "store": m.store, "etcd_endpoint": m.etcd_endpoint, "tso_limit_ms": int(m.tso_limit),
                "tso_limit": tso.to_datetime(tso.compose(int(m.tso_limit), 0)).isoformat() if m.tso_limit else "",
                "lease_left_s": round(m.lease_left_ms / 1000, 2), "cluster_id": int(m.cluster_id),
            })
    return rows


def _members(args: argparse.Namespace) -> int:
    addrs = parse_addr_list(registry_addr(args), "--registry")
    rows = member_rows(addrs)
    clusters = {r["cluster_id"] for r in rows if "cluster_id" in r}
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="Registry members", title_justify="left")
        for col in ("member", "role", "leader seen", "etcd endpoint", "TSO high-water (UTC)", "lease left"):
            table.add_column(col, no_wrap=True)
        for r in rows:
            if r["role"] == "unreachable":
                table.add_row(r["addr"], "unreachable", "-", "-", "-", "-")
                continue
            table.add_row(r["addr"], r["role"], r["leader"] or "(none)", r["etcd_endpoint"] or r["store"],
                          r["tso_limit"] or "-", f"{r['lease_left_s']:.1f}s" if r["role"] == "leader" else "-")
        Console(width=200).print(table)
    if len(clusters) > 1:
        print(f"WARNING: the members belong to different clusters ({', '.join(map(str, sorted(clusters)))}): "
              "the --registry list mixes two registry groups", file=sys.stderr)
    if not any(r["role"] == "leader" for r in rows):
        print("no member leads: an election takes up to one lease (3 s); if it lasts, check the etcd quorum",
              file=sys.stderr)
        return 1
    return 0
