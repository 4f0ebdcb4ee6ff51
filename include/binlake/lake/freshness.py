"""How fresh the lake is: its newest ingested window against what the Pumps could
give it now.

The Pumps' safe ts is the commit_ts below which every binlog is final: a window
ending at or below it can be ingested. The lake's *lag* is how far its newest
ingested window end is behind the lowest safe ts of the online Pumps, in
seconds of the TSOs' physical clock; *windows waiting* are the closed windows
not ingested yet (the gaps inside the ledger, plus the windows of the newest
window's length between its end and the safe ts).

Read without Spark: the ``windows`` ledger through delta-rs
(``binlake.lake.store.arrowread``), the Pumps and consumers from the registry. So
``binlake lake status`` answers in a second, and ``binlake lake metrics``
serves the same figures to Prometheus at scrape time.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from binlake import errors, tso
from binlake.lake.store import arrowread, drills, location, s3
from binlake.lake.store.ledger import uncovered
from binlake.lake.store.location import WINDOWS, table_path


@dataclasses.dataclass
class Freshness:
    lake: str
    windows: int
    first_start_ts: int | None
    newest_end_ts: int | None
    newest_len_ms: int | None
    gaps: list[tuple[int, int]]
    safe_ts: int | None  # the lowest safe ts of the online Pumps; None: no Pump registered
    pumps: list[dict[str, Any]]
    consumers: list[dict[str, Any]]

    @property
    def lag_s(self) -> float | None:
        """Seconds the newest ingested window end is behind the Pumps' safe ts (0 when
        caught up); None without a window or without a Pump."""
        if self.newest_end_ts is None or self.safe_ts is None:
            return None
        return max(0.0, (tso.physical_ms(self.safe_ts) - tso.physical_ms(self.newest_end_ts)) / 1000)

    @property
    def windows_waiting(self) -> int | None:
        """Closed windows not ingested: the ledger's gaps, plus whole windows (of the newest
        window's length) between its end and the safe ts."""
        if self.newest_end_ts is None or self.safe_ts is None or not self.newest_len_ms:
            return None
        behind_ms = tso.physical_ms(self.safe_ts) - tso.physical_ms(self.newest_end_ts)
        return len(self.gaps) + max(0, math.floor(behind_ms / self.newest_len_ms))

    def to_dict(self) -> dict[str, Any]:
        def when(ts: int | None) -> str | None:
            return tso.to_datetime(ts).isoformat() if ts else None

        return {"lake": self.lake, "windows": self.windows, "first_start_ts": self.first_start_ts,
                "newest_end_ts": self.newest_end_ts, "newest_end": when(self.newest_end_ts),
                "newest_window_s": self.newest_len_ms / 1000 if self.newest_len_ms else None,
                "safe_ts": self.safe_ts, "safe": when(self.safe_ts), "lag_s": self.lag_s,
                "windows_waiting": self.windows_waiting, "gaps": [list(g) for g in self.gaps],
                "pumps": self.pumps, "consumers": self.consumers}


def ledger(lake: str) -> list[tuple[int, int]]:
    """The ``windows`` ledger's (start_ts, end_ts), sorted; empty before the first ingest."""
    if not isinstance(lake, str) or not lake.strip():
        raise errors.InvalidArgument(f"lake must be a directory path, got {lake!r}")
    path = table_path(lake, WINDOWS)
    local = arrowread.local_path(path)
    if local is None:
        if not location.parse(lake).is_s3:
            raise errors.InvalidArgument(
                f"{lake} is neither a local directory nor on S3: freshness reads the windows ledger with "
                "delta-rs (use `binlake lake windows` for a lake on another file system)")
        s3.probe(lake)  # bucket, keys, endpoint: one clear line when wrong
        if not _s3_table_exists(path):
            return []
    elif not os.path.isdir(os.path.join(local, "_delta_log")):
        return []
    try:
        table = arrowread.TableReader(path).read(["start_ts", "end_ts"])
    except arrowread.NotReadable as exc:
        raise errors.FailedPrecondition(f"cannot read the windows ledger of {lake}: {exc}") from None
    # A window's row twice (a lost client's append and its retry's) is one window.
    return sorted(set(zip(table.column("start_ts").to_pylist(), table.column("end_ts").to_pylist(), strict=True)))


def _s3_table_exists(path: str) -> bool:
    """Whether the S3 table at ``path`` has a Delta log (one listing, through delta-rs's settings)."""
    from pyarrow import fs as pafs

    store = s3.s3_filesystem()
    log_dir = location.to_object_store(path)[len("s3://"):] + "/_delta_log"
    found = store.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    return any(f.path.endswith(".json") or f.path.endswith(".checkpoint.parquet") for f in found)


def measure(lake: str, registry: str | None) -> Freshness:
    """The lake's freshness; ``registry`` None measures the lake alone (no lag)."""
    rows = ledger(lake)
    pumps: list[dict[str, Any]] = []
    consumers: list[dict[str, Any]] = []
    safe: int | None = None
    if registry is not None:
        from binlake.registry.client import RegistryClient

        with RegistryClient(registry) as reg:
            nodes, _ = reg.list_nodes("pump")
            found = reg.list_consumers()
        pumps = [{"pump": n.node_id, "state": str(n.state), "safe_ts": n.safe_ts, "gc_ts": n.gc_ts} for n in nodes]
        online = [n.safe_ts for n in nodes if str(n.state).lower() == "online" and n.safe_ts > 0]
        safe = min(online) if online else None
        consumers = [{"consumer": c.consumer_id, "checkpoint_ts": c.checkpoint_ts, "description": c.description}
                     for c in found]
    if not rows:
        return Freshness(lake, 0, None, None, None, [], safe, pumps, consumers)
    first, newest = rows[0][0], max(rows, key=lambda r: r[1])
    gaps = uncovered([{"start_ts": s, "end_ts": e} for s, e in rows], first, newest[1])
    length = tso.physical_ms(newest[1]) - tso.physical_ms(newest[0])
    return Freshness(lake, len(rows), first, newest[1], length if length > 0 else None, gaps, safe, pumps,
                     consumers)


def lines(f: Freshness) -> Iterator[str]:
    """The human report of ``binlake lake status``."""
    def when(ts: int | None) -> str:
        return tso.format_ts(ts) if ts else "-"

    yield f"lake            {f.lake}"
    if f.newest_end_ts is None:
        yield "newest window   none ingested yet"
    else:
        yield f"newest window   ends {when(f.newest_end_ts)}  ({f.windows} windows, from {when(f.first_start_ts)})"
    yield f"pumps' safe ts  {when(f.safe_ts) if f.safe_ts else 'no online Pump'}"
    lag = f.lag_s
    yield f"lag             {'-' if lag is None else f'{lag:.1f}s'}"
    waiting = f.windows_waiting
    yield f"waiting         {'-' if waiting is None else f'{waiting} window(s)'}" + (
        f" ({len(f.gaps)} gap(s) inside the ledger)" if f.gaps else "")
    for g in f.gaps:
        yield f"  gap           [{g[0]}, {g[1]})  {when(g[0])} .. {when(g[1])}"
    for p in f.pumps:
        yield f"  pump {p['pump']:<9} {p['state']:<8} safe ts {when(p['safe_ts'])}"
    if not f.consumers:
        yield "consumers       none registered"
    for c in f.consumers:
        yield f"  consumer      {c['consumer']}  checkpoint {when(c['checkpoint_ts'])}"


class FreshnessCollector(Collector):
    """A Prometheus collector measuring the lake at scrape time (``binlake lake metrics``)."""

    def __init__(self, lake: str, registry: str | None) -> None:
        self.lake, self.registry = lake, registry

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            f = measure(self.lake, self.registry)
        except errors.BinlakeError:  # the registry down, the ledger unreadable: say so, keep serving
            yield GaugeMetricFamily("binlake_lake_up", "1 when the lake and registry could be read.", value=0)
            return
        yield GaugeMetricFamily("binlake_lake_up", "1 when the lake and registry could be read.", value=1)
        yield GaugeMetricFamily("binlake_lake_windows", "Windows in the ledger.", value=f.windows)
        if f.newest_end_ts is not None:
            yield GaugeMetricFamily("binlake_lake_newest_window_end_seconds",
                                    "Unix time of the newest ingested window's end.",
                                    value=tso.physical_ms(f.newest_end_ts) / 1000)
        if f.lag_s is not None:
            yield GaugeMetricFamily("binlake_lake_lag_seconds",
                                    "How far the newest ingested window end is behind the Pumps' safe ts.",
                                    value=f.lag_s)
        if f.windows_waiting is not None:
            yield GaugeMetricFamily("binlake_lake_windows_waiting", "Closed windows not ingested yet.",
                                    value=f.windows_waiting)
        yield from drill_gauges(self.lake)
        checkpoints = GaugeMetricFamily("binlake_lake_consumer_checkpoint_seconds",
                                        "Unix time of each consumer's checkpoint.", labels=["consumer"])
        for c in f.consumers:
            checkpoints.add_metric([c["consumer"]], tso.physical_ms(c["checkpoint_ts"]) / 1000
                                   if c["checkpoint_ts"] else 0.0)
        yield checkpoints


def drill_gauges(lake: str) -> Iterator[GaugeMetricFamily]:
    """The last restore drill's figures (``binlake drill``), when one ran."""
    try:
        last = drills.last(lake)
    except (arrowread.NotReadable, OSError):
        return
    if last is None:
        return
    at = last.get("started_at")
    figures = {
        "binlake_drill_last_timestamp_seconds": ("Unix time the last drill started.",
                                                 at.timestamp() if at is not None else None),
        "binlake_drill_last_passed": ("1 when the last drill passed, 0 when it failed.",
                                      1.0 if last.get("verdict") == "passed" else 0.0),
        "binlake_drill_last_rto_seconds": ("Seconds the last drill's restore took.", last.get("restore_s")),
        "binlake_drill_last_rpo_seconds": ("The last drill's RPO: seconds its newest window end was behind.",
                                           last.get("rpo_s")),
        "binlake_drill_last_seconds": ("Seconds the last drill took in all.", last.get("drill_s")),
        "binlake_drill_last_proving_share": ("Share of the last drill spent proving.", last.get("proving_share")),
        "binlake_drill_last_rows": ("Rows the last drill restored.", last.get("rows")),
        "binlake_drill_last_rows_per_second": ("The last drill's restore rate.", last.get("rows_per_s")),
    }
    for name, (doc, value) in figures.items():
        if value is not None:
            yield GaugeMetricFamily(name, doc, value=float(value))


def serve(addr: str, lake: str, registry: str | None) -> tuple[Any, str]:
    """Serve the lake's freshness on ``http://ADDR/metrics`` (port 0: a free one); the
    server (``shutdown()`` stops it) and the HOST:PORT it listens on."""
    from binlake.net import parse_addr

    host, port = parse_addr(addr, "metrics address")
    reg = CollectorRegistry()
    reg.register(FreshnessCollector(lake, registry))
    server, _thread = start_http_server(port, addr=host, registry=reg)
    return server, f"{host}:{server.server_port}"


__all__: Sequence[str] = ("Freshness", "FreshnessCollector", "drill_gauges", "ledger", "lines", "measure", "serve")
