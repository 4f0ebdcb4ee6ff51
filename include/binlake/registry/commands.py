"""``binlake registry``: the command that runs the registry (TSO and node states)."""

from __future__ import annotations

import argparse
from typing import Any

from binlake.cli.args import positive_int


def register(sub: Any, bench: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``binlake registry`` (see ``binlake.cli._COMMAND_MODULES``)."""
    p = sub.add_parser(
        "registry", help="run the registry (TSO and node states)", formatter_class=fmt,
        description="Run the registry: hands out TSOs and keeps every node's state.",
        epilog="Example:\n  binlake registry --data-dir data/registry --addr 127.0.0.1:8230\n",
    )
    p.add_argument("--config", help="TOML config file (its [registry] table)")
    p.add_argument("--data-dir", help="where the SQLite store lives (default data/registry)")
    p.add_argument("--addr", help="HOST:PORT to listen on (default 127.0.0.1:8230; port 0 = any free port)")
    p.add_argument("--tso-window-ms", type=positive_int, help="TSO high-water step persisted ahead of use")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from binlake import config
    from binlake.registry import server

    settings = config.load(config.RegistrySettings, args.config, data_dir=args.data_dir, addr=args.addr,
                           tso_window_ms=args.tso_window_ms)
    server.run(settings)
    return 0
