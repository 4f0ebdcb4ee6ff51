"""Prometheus metrics of one Pump (a registry per Pump, so tests can run several)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from binlake import tso
from binlake.net import parse_addr

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class _StorageCollector(Collector):
    """Reads the live figures from the Pump at scrape time (no bookkeeping on the hot path)."""

    def __init__(self, snapshot: Callable[[], dict[str, float]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._snapshot()
        yield CounterMetricFamily("binlake_pump_binlogs_stored", "Binlogs appended durably.", value=s["binlogs"])
        yield CounterMetricFamily("binlake_pump_bytes_stored", "Binlog payload bytes appended.", value=s["bytes"])
        yield CounterMetricFamily("binlake_pump_fsyncs", "fsync calls on the value log.", value=s["fsyncs"])
        yield CounterMetricFamily("binlake_pump_group_commits", "Group commits (one fsync round each).",
                                  value=s["groups"])
        yield GaugeMetricFamily("binlake_pump_safe_ts", "The safe ts.", value=s["safe_ts"])
        yield GaugeMetricFamily("binlake_pump_safe_ts_lag_seconds", "Wall clock minus the safe ts.",
                                value=s["safe_ts_lag_s"])
        yield GaugeMetricFamily("binlake_pump_max_commit_ts", "Largest commit_ts stored.", value=s["max_commit_ts"])
        yield GaugeMetricFamily("binlake_pump_gc_ts", "The GC ts.", value=s["gc_ts"])
        yield GaugeMetricFamily("binlake_pump_pending_txns", "Prewrites waiting for their commit.",
                                value=s["pending"])
        yield GaugeMetricFamily("binlake_pump_storage_bytes", "Value log plus index size.", value=s["storage_bytes"])
        yield GaugeMetricFamily("binlake_pump_disk_free_bytes", "Free bytes on the data dir's disk.",
                                value=s["disk_free"])


class PumpMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, float]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "binlake_pump_write_requests", "Write RPCs by outcome.", ["method", "code"], registry=self.registry
        )
        self.refusals = Counter(
            "binlake_pump_write_refusals", "Binlogs refused, by status code.", ["code"], registry=self.registry,
        )
        self.latency = Histogram(
            "binlake_pump_write_latency_seconds", "Write RPC latency (receipt to durable ack).",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.gc_forced = Counter(
            "binlake_pump_gc_forced", "GC rounds that passed a consumer's checkpoint (a hard limit), by consumer.",
            ["consumer"], registry=self.registry,
        )
        self.registry.register(_StorageCollector(snapshot))
        self._server: Any = None  # prometheus_client's WSGIServer once serving

    def serve(self, addr: str) -> str:
        host, port = parse_addr(addr, "metrics addr")
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._server = server
        return f"{host}:{server.server_port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def lag_seconds(safe_ts: int) -> float:
    if safe_ts <= 0:
        return 0.0
    return max(0.0, time.time() - tso.physical_ms(safe_ts) / 1000.0)
