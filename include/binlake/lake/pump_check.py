"""Pump checks before a read: each planned Pump's own Status, and whether it can serve the window.

The registry's view (its last heartbeat) is not enough to start a read: every
Pump that may hold the window is asked directly, so an unreachable Pump, a safe
ts below the window end or a GC ts above the window start fails the read up
front with a message naming the Pump and the ts.
"""

from __future__ import annotations

import grpc

from binlake import errors, rpc
from binlake.lake.planner import WindowPlan, plan_window
from binlake.proto import pump_pb2, pump_pb2_grpc
from binlake.window import Readiness, gone_error, readiness, waiting_error

# How long one Pump's Status call may take before it counts as unreachable.
STATUS_TIMEOUT_S = 5.0


def pump_statuses(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, pump_pb2.StatusResp]:
    """Every planned Pump's own Status; Unavailable naming the Pump when one does not answer."""
    out: dict[str, pump_pb2.StatusResp] = {}
    for node in plan.pumps:
        with rpc.channel(node.addr, rpc.client_options(16 << 20)) as channel:
            try:
                out[node.node_id] = pump_pb2_grpc.PumpStub(channel).Status(pump_pb2.StatusReq(), timeout=timeout_s)
            except grpc.RpcError as exc:
                raise errors.Unavailable(
                    f"pump {node.node_id} at {node.addr} is unreachable ({exc.code().name}: {exc.details()}); "
                    f"it may hold transactions of [{plan.start_ts}, {plan.end_ts}), which cannot be read "
                    "without it") from None
    return out


def check_pumps(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, pump_pb2.StatusResp]:
    """Ask every planned Pump itself (not the registry's last heartbeat) whether it
    can serve the window; raise naming the Pump and the ts when one cannot."""
    out = pump_statuses(plan, timeout_s)
    for node in plan.pumps:
        st = out[node.node_id]
        state = readiness(plan.window, st.safe_ts, st.gc_ts)
        if state is Readiness.GONE:
            raise gone_error(plan.window, node.node_id, st.gc_ts)
        if state is Readiness.WAITING:
            raise waiting_error(plan.window, node.node_id, st.safe_ts)
    return out


def plan_read(registry: str, start_ts: int, end_ts: int, pumps: list[str] | None = None) -> WindowPlan:
    """The Pumps to read for ``[start_ts, end_ts)``, each checked to be able to serve it."""
    plan = plan_window(registry, start_ts, end_ts, pumps)
    if not plan.pumps:
        raise errors.NotFound(f"no pumps are registered with {registry} for window [{start_ts}, {end_ts})")
    check_pumps(plan)
    return plan
