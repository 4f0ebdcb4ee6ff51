"""gRPC channel and server options (``binlake.rpc``) that must agree with each other."""

from __future__ import annotations

from binlake import rpc


def test_servers_accept_the_keepalive_pings_their_clients_send() -> None:
    """A server answers pings more frequent than its accepted interval with GOAWAY
    "too_many_pings" and drops the connection (gRPC's default accepts one per 5 min):
    every binlake server must accept the pings every binlake client sends on an idle
    connection."""
    client = dict(rpc.client_options(1 << 20))
    server = dict(rpc.message_options(1 << 20))
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < client["grpc.keepalive_time_ms"]
