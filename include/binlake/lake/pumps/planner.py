"""Window planning: which Pumps a commit_ts window must be read from, and
whether they are ready for it.

A Pump must be read for ``[start_ts, end_ts)`` unless it went offline before
``start_ts`` (an offline Pump took no transaction after its offline_ts), or the
registry knows it held no transaction below ``end_ts`` (``empty_below_ts``). Every
other registered Pump may hold transactions of the window, so every one of
them must be reachable and ready for it by ``binlake.window.readiness`` (safe
ts >= end_ts, GC ts <= start_ts).
"""

from __future__ import annotations

import dataclasses

from binlake import errors
from binlake.registry.client import RegistryClient
from binlake.registry.model import NodeRecord, NodeState
from binlake.window import Readiness, Window, gone_error, readiness


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    start_ts: int
    end_ts: int
    pumps: tuple[NodeRecord, ...]

    @property
    def addrs(self) -> dict[str, str]:
        return {p.node_id: p.addr for p in self.pumps}

    @property
    def window(self) -> Window:
        return Window(self.start_ts, self.end_ts)

    def waiting_for(self) -> list[NodeRecord]:
        """Pumps whose (last reported) safe ts is still below the window end."""
        return [p for p in self.pumps if readiness(self.window, p.safe_ts, 0) is Readiness.WAITING]


def check_window(start_ts: int, end_ts: int) -> Window:
    """The validated window (``binlake.window.Window``)."""
    return Window(start_ts, end_ts)


def pumps_for_window(nodes: list[NodeRecord], start_ts: int, end_ts: int) -> list[NodeRecord]:
    """The Pumps that may hold transactions of ``[start_ts, end_ts)``: not those
    offline before it, nor those the registry knows held nothing below its end
    (``empty_below_ts``: a Pump that joined after the window, lost or not, is never
    asked for it). When every Pump is known to hold nothing of the window (a cluster
    nothing was written to yet), all of them are asked: the window is then read, and
    recorded, as the empty window it is, as it always was before a Pump was known empty."""
    live = sorted(
        (n for n in nodes if n.kind == "pump"
         and not (n.state is NodeState.OFFLINE and 0 < n.offline_ts < start_ts)),
        key=lambda n: n.node_id,
    )
    holding = [n for n in live if not n.empty_below_ts >= end_ts]
    return holding or live


def plan_window(registry: str | RegistryClient, start_ts: int, end_ts: int,
                pumps: list[str] | None = None) -> WindowPlan:
    """The Pumps to read for the window (optionally restricted to ``pumps`` ids).
    Refuses (OutOfRange) when a Pump has collected garbage above the window start."""
    window = check_window(start_ts, end_ts)
    reg = registry if isinstance(registry, RegistryClient) else RegistryClient(registry)
    own = reg is not registry
    try:
        nodes, _rev = reg.list_nodes("pump")
    finally:
        if own:
            reg.close()
    chosen = pumps_for_window(nodes, start_ts, end_ts)
    if pumps is not None:
        known = {n.node_id for n in chosen}
        unknown = [p for p in pumps if p not in known]
        if unknown:
            raise errors.NotFound(
                f"pump(s) {', '.join(unknown)} not registered (or offline before the window); "
                f"known: {', '.join(sorted(known)) or 'none'}"
            )
        chosen = [n for n in chosen if n.node_id in pumps]
    for n in chosen:
        if readiness(window, n.safe_ts, n.gc_ts) is Readiness.GONE:
            raise gone_error(window, n.node_id, n.gc_ts)
    return WindowPlan(start_ts, end_ts, tuple(chosen))
