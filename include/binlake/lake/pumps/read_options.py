"""The ``binlake`` data source's options, validated (``ReadOptions.parse``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from binlake import errors, net, tso

# What a read yields: change rows or the window's DDL rows.
KINDS = ("changes", "ddl")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    registry: str
    start_ts: int
    end_ts: int
    pumps: list[str] | None = None
    kind: str = "changes"
    sub_window: int | None = None
    schema_history: str = ""
    window_index: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate the data source's options; InvalidArgument names the bad one."""
        opts = {str(k).lower(): v for k, v in options.items()}
        known = {"registry", "start_ts", "end_ts", "pumps", "kind", "sub_window", "schema_history",
                 "window_index", "path"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise errors.InvalidArgument(
                f"binlake source: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known - {'path'}))}")
        registry = opts.get("registry") or ""
        if not registry:
            raise errors.InvalidArgument(
                "binlake source: option 'registry' (HOST:PORT, or a group's HOST:PORT,HOST:PORT,...) is required")
        net.parse_addr_list(registry, "registry")

        def ts(name: str) -> int:
            raw = opts.get(name)
            if raw is None or str(raw).strip() == "":
                raise errors.InvalidArgument(f"binlake source: option '{name}' (a TSO) is required")
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise errors.InvalidArgument(f"binlake source: option '{name}' must be an integer TSO, got {raw!r}") from None
            if not 0 <= value <= tso.MAX_TS:
                raise errors.InvalidArgument(f"binlake source: option '{name}' must be in [0, 2^63), got {value}")
            return value

        start_ts, end_ts = ts("start_ts"), ts("end_ts")
        if start_ts >= end_ts:
            raise errors.InvalidArgument(f"binlake source: window [{start_ts}, {end_ts}) is empty")
        pumps = None
        if opts.get("pumps"):
            pumps = [p.strip() for p in str(opts["pumps"]).split(",") if p.strip()]
            if not pumps:
                raise errors.InvalidArgument("binlake source: option 'pumps' lists no pump id")
        kind = str(opts.get("kind") or "changes").lower()
        if kind not in KINDS:
            raise errors.InvalidArgument(f"binlake source: option 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        sub_window = None
        if opts.get("sub_window"):
            try:
                sub_window = int(str(opts["sub_window"]))
            except ValueError:
                sub_window = 0
            if sub_window <= 0:
                raise errors.InvalidArgument(
                    f"binlake source: option 'sub_window' must be a positive ts span, got {opts['sub_window']!r}")
        return cls(registry, start_ts, end_ts, pumps, kind, sub_window, opts.get("schema_history") or "",
                   opts.get("window_index") or "")
