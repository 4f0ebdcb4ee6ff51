"""A small synchronous etcd v3 client: KV transactions, leases and member status
over etcd's gRPC API, with fail-over across the cluster's endpoints.

The registry's servicer runs on gRPC's thread pool, so it wants blocking calls.
``aetcd`` (the maintained etcd v3 library that imports with our grpcio and
protobuf pins) is asyncio-only and talks to one endpoint; we use its generated
etcd v3 stubs (``aetcd.rpc``) over a plain blocking channel per endpoint and
keep the endpoint fail-over here, which is all the registry needs.

``parse_etcd_url`` reads ``etcd://h1:2379,h2:2379,h3:2379[/prefix]``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from aetcd.rpc import rpc_pb2, rpc_pb2_grpc

from binlake import errors, net

log = logging.getLogger(__name__)

T = TypeVar("T")

ETCD_SCHEMES = ("etcd://", "etcd+http://")
DEFAULT_PREFIX = "/binlake"
# One attempt against one endpoint; an isolated (minority) member makes a
# linearizable request hang until etcd's own timeout, so we move on sooner.
ATTEMPT_TIMEOUT_S = 1.0

# Errors after which another endpoint may answer.
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)


@dataclasses.dataclass(frozen=True)
class EtcdTarget:
    """Where the store lives: etcd client endpoints and the key prefix."""

    endpoints: tuple[str, ...]
    prefix: str

    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints) + self.prefix


def parse_etcd_url(text: str) -> EtcdTarget:
    """``etcd://h1:2379,h2:2379[/prefix]`` -> EtcdTarget; one clear error otherwise."""
    if not isinstance(text, str):
        raise errors.InvalidArgument(f"an etcd store URL is a string, got {type(text).__name__}")
    raw = text.strip()
    lowered = raw.lower()
    scheme = next((s for s in ETCD_SCHEMES if lowered.startswith(s)), None)
    if scheme is None:
        raise errors.InvalidArgument(
            f"etcd store {raw!r}: use etcd://HOST:PORT[,HOST:PORT...][/prefix] (TLS to etcd is not supported yet)"
        )
    rest = raw[len(scheme):]
    hosts, slash, path = rest.partition("/")
    prefix = "/" + path.strip("/") if slash and path.strip("/") else DEFAULT_PREFIX
    if any(c.isspace() for c in prefix):
        raise errors.InvalidArgument(f"etcd store {raw!r}: the key prefix {prefix!r} has whitespace")
    endpoints: list[str] = []
    for part in hosts.split(","):
        part = part.strip()
        if not part:
            raise errors.InvalidArgument(
                f"etcd store {raw!r}: an empty endpoint in the list (write etcd://h1:2379,h2:2379,h3:2379)"
            )
        host, port = net.parse_addr(part, f"etcd store {raw!r} endpoint")
        if port == 0:
            raise errors.InvalidArgument(f"etcd store {raw!r}: endpoint {part!r} needs a port (etcd's is 2379)")
        if part not in endpoints:
            endpoints.append(part)
    return EtcdTarget(tuple(endpoints), prefix)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix`` (etcd's rule)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class EtcdClient:
    """Blocking calls to an etcd cluster. Each call tries the endpoint that last
    answered, then the others, until ``timeout_s`` is spent. Thread-safe.

    A retried write may have been applied by the attempt that timed out; every
    write the registry makes is safe to apply twice (puts of a whole record, a
    max() of the TSO mark, a revision bump, which only needs to increase)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise errors.InvalidArgument("an etcd client needs at least one endpoint")
        if timeout_s <= 0:
            raise errors.InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        self._endpoints = list(endpoints)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._current = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    @property
    def current_endpoint(self) -> str:
        with self._lock:
            return self._endpoints[self._current]

    def _channel(self, endpoint: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise errors.Unavailable("the etcd client is closed")
            ch = self._channels.get(endpoint)
            if ch is None:
                ch = grpc.insecure_channel(endpoint, options=[
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ])
                self._channels[endpoint] = ch
            return ch

    def call(self, what: str, fn: Callable[[grpc.Channel, float], T], *, timeout_s: float | None = None) -> T:
        """Run ``fn(channel, attempt_timeout)`` against the endpoints in turn until
        one answers or the time is up; then one Unavailable naming every endpoint."""
        deadline = time.monotonic() + (timeout_s or self._timeout_s)
        with self._lock:
            start = self._current
        tried: list[str] = []
        last = ""
        i = 0
        while True:
            idx = (start + i) % len(self._endpoints)
            endpoint = self._endpoints[idx]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                result = fn(self._channel(endpoint), max(min(remaining, ATTEMPT_TIMEOUT_S), 0.01))
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                if code not in _RETRY_CODES:
                    raise errors.FailedPrecondition(
                        f"etcd {endpoint} refused {what}: {detail} (is it an etcd client URL, "
                        "usually port 2379?)") from None
                last = f"{code.name.lower()}: {detail}"
                if endpoint not in tried:
                    tried.append(endpoint)
                i += 1
                if i % len(self._endpoints) == 0:
                    # Every endpoint failed once; breathe before the next round.
                    time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
                continue
            with self._lock:
                self._current = idx
            return result
        raise errors.Unavailable(
            f"etcd is unreachable or has no quorum for {what} (tried {', '.join(tried) or ', '.join(self._endpoints)}; "
            f"last error {last or 'timeout'}): check that a majority of the etcd members are up"
        )

    # -- KV --------------------------------------------------------------------------

    def get(self, key: bytes) -> rpc_pb2.KeyValue | None:
        req = rpc_pb2.RangeRequest(key=key)
        resp = self.call("get", lambda ch, t: rpc_pb2_grpc.KVStub(ch).Range(req, timeout=t))
        return resp.kvs[0] if resp.kvs else None

    def get_prefix(self, prefix: bytes) -> list[rpc_pb2.KeyValue]:
        req = rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        resp = self.call("range", lambda ch, t: rpc_pb2_grpc.KVStub(ch).Range(req, timeout=t))
        return list(resp.kvs)

    def txn(self, compare: list[Any], success: list[Any], failure: list[Any] | None = None) -> Any:
        req = rpc_pb2.TxnRequest(compare=compare, success=success, failure=failure or [])
        return self.call("txn", lambda ch, t: rpc_pb2_grpc.KVStub(ch).Txn(req, timeout=t))

    # -- leases --------------------------------------------------------------------------

    def grant(self, ttl_s: int) -> int:
        req = rpc_pb2.LeaseGrantRequest(TTL=ttl_s)
        resp = self.call("lease grant", lambda ch, t: rpc_pb2_grpc.LeaseStub(ch).LeaseGrant(req, timeout=t))
        return int(resp.ID)

    def keepalive_once(self, lease_id: int, timeout_s: float) -> int:
        """Refresh a lease once; its new TTL in seconds (0: the lease is gone)."""

        def once(ch: grpc.Channel, t: float) -> int:
            stream = rpc_pb2_grpc.LeaseStub(ch).LeaseKeepAlive(
                iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease_id)]), timeout=t)
            for resp in stream:
                return int(resp.TTL)
            return 0

        return self.call("lease keepalive", once, timeout_s=timeout_s)

    def revoke(self, lease_id: int, timeout_s: float = 1.0) -> None:
        req = rpc_pb2.LeaseRevokeRequest(ID=lease_id)
        self.call("lease revoke", lambda ch, t: rpc_pb2_grpc.LeaseStub(ch).LeaseRevoke(req, timeout=t),
                  timeout_s=timeout_s)

    def lease_ttl(self, lease_id: int) -> int:
        """Seconds etcd will keep the lease; -1 when it is gone."""
        req = rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id)
        resp = self.call("lease ttl", lambda ch, t: rpc_pb2_grpc.LeaseStub(ch).LeaseTimeToLive(req, timeout=t))
        return int(resp.TTL)

    # -- cluster ----------------------------------------------------------------------------

    def endpoint_status(self) -> Iterator[tuple[str, str]]:
        """(endpoint, "leader"/"follower"/"unreachable") for every configured endpoint."""
        for endpoint in self._endpoints:
            try:
                resp = rpc_pb2_grpc.MaintenanceStub(self._channel(endpoint)).Status(
                    rpc_pb2.StatusRequest(), timeout=ATTEMPT_TIMEOUT_S)
            except grpc.RpcError:
                yield endpoint, "unreachable"
                continue
            yield endpoint, "leader" if resp.leader == resp.header.member_id else "follower"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()


# -- transaction building blocks ---------------------------------------------------------


def cmp_create_revision(key: bytes, value: int) -> rpc_pb2.Compare:
    """create_revision(key) == value (0: the key does not exist)."""
    return rpc_pb2.Compare(key=key, result=rpc_pb2.Compare.EQUAL, target=rpc_pb2.Compare.CREATE,
                           create_revision=value)


def cmp_mod_revision(key: bytes, value: int) -> rpc_pb2.Compare:
    return rpc_pb2.Compare(key=key, result=rpc_pb2.Compare.EQUAL, target=rpc_pb2.Compare.MOD, mod_revision=value)


def op_put(key: bytes, value: bytes, lease: int = 0) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key))
