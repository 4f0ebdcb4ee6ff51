"""Pump checks before a read: each planned Pump's own Status, and whether it can serve the window.

The registry's view (its last heartbeat) is not enough to start a read: every
Pump that may hold the window is asked directly, so an unreachable Pump, a safe
ts below the window end or a GC ts above the window start fails the read up
front with a message naming the Pump and the ts.

Replicated Pumps (``min_acks`` = W > 1): up to W - 1 unreachable Pumps are left
out of the plan and the window is read from the others (``window.cluster_readiness``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import grpc

from binlake import errors, rpc
from binlake.lake.pumps.planner import WindowPlan, plan_window
from binlake.proto import pump_pb2, pump_pb2_grpc
from binlake.registry.model import NodeRecord
from binlake.window import Readiness, cluster_readiness, gone_error, pump_views, readiness, waiting_error

# How long one Pump's Status call may take before it counts as unreachable.
STATUS_TIMEOUT_S = 5.0


def pump_statuses(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S,
                  unreachable: dict[str, str] | None = None) -> dict[str, pump_pb2.StatusResp]:
    """Every planned Pump's own Status; Unavailable naming the Pump when one does not
    answer, unless ``unreachable`` is given: then it collects them (id -> why)."""
    def ask(node: NodeRecord) -> pump_pb2.StatusResp | grpc.RpcError:
        with rpc.channel(node.addr, rpc.client_options(16 << 20)) as channel:
            try:
                resp: pump_pb2.StatusResp = pump_pb2_grpc.PumpStub(channel).Status(
                    pump_pb2.StatusReq(), timeout=timeout_s)
                return resp
            except grpc.RpcError as exc:
                return exc

    # All at once: an unreachable Pump costs one timeout, not one per Pump.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(plan.pumps)))) as pool:
        answers = list(pool.map(ask, plan.pumps))
    out: dict[str, pump_pb2.StatusResp] = {}
    for node, answer in zip(plan.pumps, answers, strict=True):
        if isinstance(answer, pump_pb2.StatusResp):
            out[node.node_id] = answer
        else:
            why = f"{answer.code().name}: {answer.details()}"
            if unreachable is not None:
                unreachable[node.node_id] = why
                continue
            raise errors.Unavailable(
                f"pump {node.node_id} at {node.addr} is unreachable ({why}); "
                f"it may hold transactions of [{plan.start_ts}, {plan.end_ts}), which cannot be read "
                "without it")
    return out


def answers(statuses: dict[str, pump_pb2.StatusResp]) -> dict[str, tuple[int, int]]:
    """(safe ts, GC ts) of every Pump that answered (``window.pump_views``'s input)."""
    return {node_id: (st.safe_ts, st.gc_ts) for node_id, st in statuses.items()}


def reachable_answers(nodes: list[NodeRecord], start_ts: int, end_ts: int,
                      timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, tuple[int, int]]:
    """Ask each of ``nodes`` its Status at once: (safe ts, GC ts) of those that answered."""
    return answers(pump_statuses(WindowPlan(start_ts, end_ts, tuple(nodes)), timeout_s, unreachable={}))


def check_pumps(plan: WindowPlan, timeout_s: float = STATUS_TIMEOUT_S) -> dict[str, pump_pb2.StatusResp]:
    """Ask every planned Pump itself (not the registry's last heartbeat) whether it
    can serve the window; raise naming the Pump and the ts when one cannot."""
    return check_replicated(plan, 1, timeout_s)[1]


def check_replicated(plan: WindowPlan, min_acks: int,
                     timeout_s: float = STATUS_TIMEOUT_S) -> tuple[WindowPlan, dict[str, pump_pb2.StatusResp]]:
    """``check_pumps`` with transactions on at least ``min_acks`` Pumps: returns the
    plan narrowed to the Pumps to read (up to ``min_acks`` - 1 unreachable ones left
    out) and their statuses. Raises naming the Pumps the window waits for."""
    if min_acks == 1:
        out = pump_statuses(plan, timeout_s)
    else:
        down: dict[str, str] = {}
        out = pump_statuses(plan, timeout_s, down)
        views = pump_views([n.node_id for n in plan.pumps], answers(out))
        verdict = cluster_readiness(plan.window, views, min_acks)
        if verdict.state is Readiness.READY:
            keep = set(verdict.serve_from)
            return dataclasses.replace(plan, pumps=tuple(n for n in plan.pumps if n.node_id in keep)), out
        if verdict.state is Readiness.WAITING and set(verdict.unreachable) & set(verdict.waiting):
            raise errors.Unavailable(
                verdict.describe(plan.window) + f" (min_acks={min_acks}; "
                + "; ".join(f"{p}: {why}" for p, why in sorted(down.items())) + ")")
    for node in plan.pumps:
        if node.node_id not in out:
            continue  # unreachable, within min_acks - 1: the reachable ones decide
        st = out[node.node_id]
        state = readiness(plan.window, st.safe_ts, st.gc_ts)
        if state is Readiness.GONE:
            raise gone_error(plan.window, node.node_id, st.gc_ts)
        if state is Readiness.WAITING:
            raise waiting_error(plan.window, node.node_id, st.safe_ts)
    return plan, out


def plan_read(registry: str, start_ts: int, end_ts: int, pumps: list[str] | None = None,
              min_acks: int | None = None) -> WindowPlan:
    """The Pumps to read for ``[start_ts, end_ts)``, each checked to be able to serve it
    (``min_acks`` None: the W in force for the window, ``replication.cluster_min_acks``)."""
    from binlake.registry.client import RegistryClient
    from binlake.registry.replicas import cluster_min_acks

    plan = plan_window(registry, start_ts, end_ts, pumps)
    if not plan.pumps:
        raise errors.NotFound(f"no pumps are registered with {registry} for window [{start_ts}, {end_ts})")
    if min_acks is None:
        with RegistryClient(registry) as reg:
            min_acks = cluster_min_acks(reg, start_ts, end_ts)
    return check_replicated(plan, min_acks)[0]
