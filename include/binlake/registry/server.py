"""The registry's gRPC server: a thin servicer over ``RegistryService``, the server
lifecycle, and ``python -m binlake.registry.server`` to run one."""

from __future__ import annotations

import argparse
import collections
import logging
import pathlib
import signal
import sys
import threading
from types import FrameType

import grpc

from binlake import config, errors, net, rpc
from binlake.proto import registry_pb2, registry_pb2_grpc
from binlake.registry.election import Election
from binlake.registry.etcd_store import EtcdStore
from binlake.registry.model import NodeRecord, NodeState
from binlake.registry.service import RegistryService, create_replication
from binlake.registry.store import RegistryStore
from binlake.registry.stores import open_store

log = logging.getLogger(__name__)

# Registry messages are small; the limit only needs to hold a large node list.
MAX_MESSAGE_BYTES = 64 * config.MiB
GRPC_WORKERS = 16


class RegistryServicer(registry_pb2_grpc.RegistryServicer):
    """Protobuf <-> NodeRecord; every rule lives in RegistryService. Counts calls per
    method (``calls``) so tests and operators can see how well clients batch."""

    def __init__(self, service: RegistryService, election: Election | None = None) -> None:
        self._service = service
        self._election = election
        self._calls: collections.Counter[str] = collections.Counter()
        self._calls_lock = threading.Lock()

    @property
    def service(self) -> RegistryService:
        return self._service

    def calls(self) -> dict[str, int]:
        """RPCs received so far, by method name."""
        with self._calls_lock:
            return dict(self._calls)

    def _count(self, method: str, context: grpc.ServicerContext | None = None) -> None:
        with self._calls_lock:
            self._calls[method] += 1
        if context is not None:
            self._gate(context)

    def _gate(self, context: grpc.ServicerContext) -> None:
        """A follower refuses every call but GetMember with NotLeader naming the
        leader (rpc.servicer_method also puts it in the trailing metadata), so a
        client goes there directly. Why not proxy: a proxy adds a hop and a second
        failure point to every TSO, and a client that knows the leader needs none."""
        self._service.check_leader()

    @rpc.servicer_method
    def GetMember(self, request: registry_pb2.GetMemberReq, context: grpc.ServicerContext) -> registry_pb2.MemberInfo:
        self._count("GetMember")
        store = self._service.store
        election = self._election
        info = registry_pb2.MemberInfo(
            addr=self._service.self_addr, store=store.describe(), cluster_id=store.cluster_id(),
            tso_limit=self._service.tso_limit(),
        )
        if election is None:
            info.leader = True
            info.leader_addr = self._service.self_addr
        else:
            info.leader = election.is_leader()
            info.leader_addr = election.leader_addr()
            info.lease_left_ms = int(election.lease_left_s() * 1000)
            if isinstance(store, EtcdStore):
                info.etcd_endpoint = store.client.current_endpoint
        return info

    @rpc.servicer_method
    def GetTS(self, request: registry_pb2.GetTSReq, context: grpc.ServicerContext) -> registry_pb2.GetTSResp:
        self._count("GetTS", context)
        first = self._service.get_ts(request.count)
        return registry_pb2.GetTSResp(first=first, count=request.count)

    @rpc.servicer_method
    def GetClusterInfo(
        self, request: registry_pb2.GetClusterInfoReq, context: grpc.ServicerContext
    ) -> registry_pb2.GetClusterInfoResp:
        self._count("GetClusterInfo", context)
        cluster_id, revision = self._service.cluster_info()
        return registry_pb2.GetClusterInfoResp(cluster_id=cluster_id, revision=revision)

    @rpc.servicer_method
    def RegisterNode(
        self, request: registry_pb2.RegisterNodeReq, context: grpc.ServicerContext
    ) -> registry_pb2.NodeInfo:
        self._count("RegisterNode", context)
        return self._service.register(NodeRecord.from_proto(request.node)).to_proto()

    @rpc.servicer_method
    def Heartbeat(self, request: registry_pb2.HeartbeatReq, context: grpc.ServicerContext) -> registry_pb2.NodeInfo:
        self._count("Heartbeat", context)
        return self._service.heartbeat(NodeRecord.from_proto(request.node)).to_proto()

    @rpc.servicer_method
    def SetNodeState(
        self, request: registry_pb2.SetNodeStateReq, context: grpc.ServicerContext
    ) -> registry_pb2.NodeInfo:
        self._count("SetNodeState", context)
        state = NodeState.from_proto(request.state)
        return self._service.set_state(request.node_id, state).to_proto()

    @rpc.servicer_method
    def GetNode(self, request: registry_pb2.GetNodeReq, context: grpc.ServicerContext) -> registry_pb2.NodeInfo:
        self._count("GetNode", context)
        return self._service.get_node(request.node_id).to_proto()

    @rpc.servicer_method
    def ListNodes(
        self, request: registry_pb2.ListNodesReq, context: grpc.ServicerContext
    ) -> registry_pb2.ListNodesResp:
        self._count("ListNodes", context)
        nodes, revision = self._service.list_nodes(request.kind or None)
        return registry_pb2.ListNodesResp(
            nodes=[n.to_proto() for n in nodes],
            revision=revision,
            cluster_id=self._service.store.cluster_id(),
        )

    @rpc.servicer_method
    def UpdateConsumer(
        self, request: registry_pb2.UpdateConsumerReq, context: grpc.ServicerContext
    ) -> registry_pb2.ConsumerInfo:
        self._count("UpdateConsumer", context)
        c = request.consumer
        return self._service.update_consumer(c.consumer_id, c.checkpoint_ts, c.description).to_proto()

    @rpc.servicer_method
    def ListConsumers(
        self, request: registry_pb2.ListConsumersReq, context: grpc.ServicerContext
    ) -> registry_pb2.ListConsumersResp:
        self._count("ListConsumers", context)
        return registry_pb2.ListConsumersResp(consumers=[c.to_proto() for c in self._service.list_consumers()])

    @rpc.servicer_method
    def RemoveConsumer(
        self, request: registry_pb2.RemoveConsumerReq, context: grpc.ServicerContext
    ) -> registry_pb2.ConsumerInfo:
        self._count("RemoveConsumer", context)
        return self._service.remove_consumer(request.consumer_id).to_proto()

    @rpc.servicer_method
    def GetReplication(
        self, request: registry_pb2.GetReplicationReq, context: grpc.ServicerContext
    ) -> registry_pb2.ReplicationHistory:
        self._count("GetReplication", context)
        return registry_pb2.ReplicationHistory(settings=[r.to_proto() for r in self._service.get_replication()])

    @rpc.servicer_method
    def SetReplication(
        self, request: registry_pb2.SetReplicationReq, context: grpc.ServicerContext
    ) -> registry_pb2.ReplicationHistory:
        self._count("SetReplication", context)
        history = self._service.set_replication(request.replicas, request.min_acks, request.grace_ms)
        return registry_pb2.ReplicationHistory(settings=[r.to_proto() for r in history])


class RegistryServer:
    """Owns the store, the service and the gRPC server for one registry process."""

    def __init__(self, settings: config.RegistrySettings) -> None:
        self._settings = settings
        self._store: RegistryStore | None = None
        self._election: Election | None = None
        self._servicer: RegistryServicer | None = None
        self._server: grpc.Server | None = None
        self._addr = ""

    @property
    def addr(self) -> str:
        """The bound HOST:PORT (the real port when settings.addr asked for port 0)."""
        if not self._addr:
            raise errors.FailedPrecondition("the registry server is not started")
        return self._addr

    @property
    def servicer(self) -> RegistryServicer:
        if self._servicer is None:
            raise errors.FailedPrecondition("the registry server is not started")
        return self._servicer

    @property
    def election(self) -> Election | None:
        """The election of a registry group member (None with a SQLite store)."""
        return self._election

    @property
    def store(self) -> RegistryStore:
        if self._store is None:
            raise errors.FailedPrecondition("the registry server is not started")
        return self._store

    def start(self) -> RegistryServer:
        if self._server is not None:
            raise errors.FailedPrecondition(f"the registry server is already running on {self._addr}")
        host, port = net.parse_addr(self._settings.addr, "registry addr")
        spec: str | pathlib.Path = self._settings.store or self._settings.data_dir
        store = open_store(spec, cluster_id=self._settings.cluster_id)
        election: Election | None = None
        try:
            if self._settings.cluster_id and store.cluster_id() != self._settings.cluster_id:
                raise errors.FailedPrecondition(
                    f"registry store {store.describe()} holds cluster {store.cluster_id()}, not "
                    f"{self._settings.cluster_id}: give this cluster's store, or drop --cluster-id")
            if self._settings.replicas is not None:
                # Before a service opens the store (its allocator saves a TSO limit at once)
                # and serves a single TSO: a new cluster's first write is under this setting.
                replicas = self._settings.replicas
                create_replication(store, replicas, self._settings.min_acks or replicas)
            if isinstance(store, EtcdStore):
                if port == 0 or host in ("0.0.0.0", "::", ""):
                    raise errors.InvalidArgument(
                        f"registry addr {self._settings.addr!r}: a member of a registry group on etcd needs the "
                        "HOST:PORT its clients reach (it is what followers name as the leader), not port 0 "
                        "or a wildcard host")
                election = Election(store, self._settings.addr)
                service = RegistryService(store, tso_window_ms=self._settings.tso_window_ms,
                                          self_addr=self._settings.addr, leadership=election)
                # The service starts serving only once elected (its allocator loads
                # and raises the saved mark first) and stops when deposed.
                election.on_elected, election.on_deposed = service.become_leader, service.step_down
            else:
                service = RegistryService(store, tso_window_ms=self._settings.tso_window_ms,
                                          self_addr=self._settings.addr)
            servicer = RegistryServicer(service, election)
            server = rpc.create_server(GRPC_WORKERS, "registry", rpc.message_options(MAX_MESSAGE_BYTES))
            registry_pb2_grpc.add_RegistryServicer_to_server(servicer, server)
            try:
                port = rpc.add_port(server, self._settings.addr)
            except RuntimeError as exc:
                port = 0
                reason = str(exc)
            else:
                reason = "the address is in use or not local"
            if port == 0:
                raise errors.Unavailable(f"registry cannot listen on {self._settings.addr}: {reason}")
            server.start()
            if election is not None:
                election.start()
        except BaseException:
            store.close()
            raise
        self._store, self._servicer, self._server, self._election = store, servicer, server, election
        shown_host = f"[{host}]" if ":" in host else host
        self._addr = f"{shown_host}:{port}"
        if election is None:
            service.self_addr = self._addr
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Finish in-flight calls (up to ``grace`` seconds), then release the store."""
        server, store, election = self._server, self._store, self._election
        self._server = None
        self._election = None
        if election is not None:
            # Resign first: the next leader takes over while we drain.
            election.stop()
        if server is not None:
            server.stop(grace).wait()
        if store is not None:
            store.close()
            self._store = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout``); True when it stopped."""
        server = self._server
        if server is None:
            return True
        # gRPC returns True when the wait timed out, i.e. the server still runs.
        return not server.wait_for_termination(timeout)

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run(settings: config.RegistrySettings) -> None:
    """Serve until SIGINT or SIGTERM, then stop gracefully. Call from the main thread."""
    server = RegistryServer(settings).start()
    cluster_id = server.store.cluster_id()
    log.info("registry listening on %s (store %s, cluster id %d; %s)", server.addr, server.store.describe(),
             cluster_id, rpc.tls().describe())
    if server.election is not None:
        log.info("registry %s stands for election in its group (lease %d s)", server.addr, server.election.lease_s)
    print(f"registry listening on {server.addr}", flush=True)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("registry got %s; stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # A timed wait keeps the main thread responsive to signals.
        while not stop.wait(0.5):
            pass
    finally:
        server.stop(grace=5.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("registry stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m binlake.registry.server", description=__doc__)
    parser.add_argument("--config", help="TOML config file ([registry] table)")
    parser.add_argument("--addr", help="HOST:PORT to listen on (port 0 = any free port)")
    parser.add_argument("--data-dir", help="directory of the SQLite store")
    parser.add_argument("--store", help="store URL: sqlite:///file.db or etcd://h1:2379,h2:2379,h3:2379[/prefix]")
    parser.add_argument("--cluster-id", type=int, help="refuse a store holding another cluster id")
    parser.add_argument("--tso-window-ms", type=int, help="TSO high-water mark step persisted ahead of use")
    parser.add_argument("--log-level", default="INFO", type=_log_level, help="DEBUG, INFO, WARNING, ERROR")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = config.load(
            config.RegistrySettings,
            args.config,
            addr=args.addr,
            data_dir=args.data_dir,
            tso_window_ms=args.tso_window_ms,
            store=args.store,
            cluster_id=args.cluster_id,
        )
        run(settings)
    except errors.BinlakeError as exc:
        # Exit 2, as the binlake command does: the input or the machine needs a change, not a retry.
        print(f"registry: {exc}", file=sys.stderr)
        return 2
    return 0


def _log_level(value: str) -> str:
    level = value.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a log level: use DEBUG, INFO, WARNING or ERROR")
    return level


if __name__ == "__main__":
    sys.exit(main())
