"""The ``binlake`` command: run services, operate the cluster, inspect binlogs, benchmark.

Every subcommand's --help shows examples. User mistakes (bad flags, bad
config, unreachable services, refused windows) print one clear line and exit
with status 2; nothing prints a traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from binlake import __version__, argcheck, errors, tso

EXIT_USER = 2

_EPILOG_TOP = """\
Start a cluster on one machine:
  binlake registry --data-dir data/registry --addr 127.0.0.1:8230 &
  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump1 --addr 127.0.0.1:8250 &
  binlake pump --registry 127.0.0.1:8230 --data-dir data/pump2 --addr 127.0.0.1:8260 &
Look at it:
  binlake ctl pumps --registry 127.0.0.1:8230
  binlake ctl dump --registry 127.0.0.1:8230 --start 2026-11-21T08:00 --end 2026-11-21T08:05

Configuration: flags > BINLAKE_* environment > --config TOML (see config/binlake.toml) > defaults.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the command and where help is
    (subcommand parsers are of this class too: add_subparsers inherits it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _ts_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a TSO (an integer such as 470614378216685568), got {text!r}; "
            "use --start/--end for datetimes"
        ) from None
    if not 0 <= value <= tso.MAX_TS:
        raise argparse.ArgumentTypeError(f"a TSO must be in [0, 2^63), got {value}")
    return value


def _scratch_dir(text: str) -> str:
    """A directory to work in: existing and writable, or creatable under a writable one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty string")
    path = pathlib.Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    if not argcheck.can_create_under(path):
        raise argparse.ArgumentTypeError(f"cannot create or write {text}: no writable directory there")
    return text


def _int_list(text: str) -> str:
    """Comma-separated positive integers (e.g. writer counts, sizes), checked; the text itself."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,4,16, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,4,16, got {text!r}")
    return text


def _include_dir(text: str) -> str:
    """Another checkout's include dir (``bench pump --baseline``): a binlake package in it."""
    if not (pathlib.Path(text) / "binlake" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an include dir with a binlake package in it (e.g. `git archive main include | "
            "tar -x -C /tmp/base`, then /tmp/base/include)")
    return text


def _pump_servers(text: str) -> str:
    """Comma-separated Pump gRPC server kinds (``bench pump --pump-servers``); the text itself."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if text and not kinds or any(k not in ("asyncio", "threads") for k in kinds):
        raise argparse.ArgumentTypeError(f"expected asyncio and/or threads (comma-separated), got {text!r}")
    return text


def _datetime_arg(text: str) -> int:
    try:
        return tso.parse_datetime(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry", default=os.environ.get("BINLAKE_REGISTRY", os.environ.get("BINLAKE_PUMP_REGISTRY")),
        help="registry HOST:PORT, or a registry group's HOST:PORT,HOST:PORT,... (clients find and follow "
             "its leader; default: $BINLAKE_REGISTRY, else 127.0.0.1:8230)",
    )


def _add_lake(p: argparse.ArgumentParser) -> None:
    """Where the lake is and which Spark reads it (``lake.commands`` builds the session)."""
    p.add_argument("--lake", default=os.environ.get("BINLAKE_LAKE_DIR"),
                   help="lake directory or URI (default: $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")


def _add_window(p: argparse.ArgumentParser) -> None:
    """A commit_ts window as TSOs or datetimes (``lake.commands.window_args`` reads it)."""
    p.add_argument("--start-ts", type=_ts_arg, help="window start (inclusive), a TSO")
    p.add_argument("--end-ts", type=_ts_arg, help="window end (exclusive), a TSO")
    p.add_argument("--start", type=_datetime_arg, help="window start as an ISO datetime (UTC unless offset given)")
    p.add_argument("--end", type=_datetime_arg, help="window end as an ISO datetime")


def _registry_addr(args: argparse.Namespace) -> str:
    """--registry as given (one HOST:PORT or a comma-separated group), checked."""
    from binlake.rpc import parse_addr_list

    if args.registry is not None and not args.registry.strip():
        raise errors.InvalidArgument("--registry is empty: give the registry's HOST:PORT (e.g. 127.0.0.1:8230)")
    addr = args.registry or "127.0.0.1:8230"
    parse_addr_list(addr, "--registry")
    return addr


# Subcommands that live beside their concept. Each module has
# ``register(sub, bench, fmt)``, which adds its parsers (``bench``: the
# subparsers of ``binlake bench``) and sets ``handler`` on each:
# ``handler(args) -> int`` (exit status). Errors it raises go through ``main``
# like every other command's. One line a module, so commands stay findable.
_COMMAND_MODULES: tuple[str, ...] = (
    "binlake.ctl_consumers",
    "binlake.registry.ctl_command",
    "binlake.source.commands",
    "binlake.replicate.commands",
    "binlake.restore.commands",
)


# The core commands, each beside its concept, in the order --help lists them.
# Each module has ``register(sub, bench, fmt)`` like those of _COMMAND_MODULES.
_CORE_COMMAND_MODULES: tuple[str, ...] = (
    "binlake.registry.commands",
    "binlake.pump.commands",
    "binlake.up_command",
    "binlake.ctl_commands",
    "binlake.source.workload_command",
    "binlake.lake.commands",
)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="binlake", description=__doc__.splitlines()[0], epilog=_EPILOG_TOP, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"binlake {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("BINLAKE_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity (default INFO)")
    # TLS for every gRPC server and client this command runs ([security] in --config,
    # BINLAKE_SECURITY_* env); paths only, and no env-derived defaults shown here.
    parser.add_argument("--ca", help="CA certificate (PEM): verify peers; servers then require client certs")
    parser.add_argument("--cert", help="certificate (PEM) this process presents, as server and client")
    parser.add_argument("--key", help="private key (PEM) of --cert")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `binlake bench` is made first (every module adds its benchmark to it) and
    # moved back after the core commands below, where --help has always listed it.
    bench = sub.add_parser("bench", help="benchmarks (results go to bench/RESULTS.md)", formatter_class=fmt)
    bsub = bench.add_subparsers(dest="bench_command", metavar="WHICH")
    bench.set_defaults(handler=_bench_help)
    for name in _CORE_COMMAND_MODULES:
        importlib.import_module(name).register(sub, bsub, fmt)
    _move_last(sub, "bench")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub, bsub, fmt)
    return parser


def _move_last(sub: argparse._SubParsersAction, name: str) -> None:  # type: ignore[type-arg]
    """Put command ``name`` after the others so far, in --help and in "choose from" lists.
    (argparse offers no public way to order subcommands, so this reorders its two records.)"""
    parsers = sub._name_parser_map
    parsers[name] = parsers.pop(name)
    entry = next(a for a in sub._choices_actions if a.dest == name)
    sub._choices_actions.remove(entry)
    sub._choices_actions.append(entry)


def _bench_help(args: argparse.Namespace) -> int:
    """``binlake bench`` without a benchmark: its help (exits)."""
    build_parser().parse_args(["bench", "--help"])
    return EXIT_USER


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return EXIT_USER
    try:
        _configure_tls(args)
        if getattr(args, "master", None) is not None:
            from binlake.lake.spark import check_master

            check_master(args.master, "--master")
        return _dispatch(parser, args)
    except errors.BinlakeError as exc:
        print(f"binlake {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _bench_module(name: str) -> Any:
    """``bench/<name>_bench.py`` loaded from the bench folder (``binlake.config.PathSettings``:
    $BINLAKE_BENCH_DIR, else the checkout's bench/), without touching sys.path."""

    from binlake import config

    path = config.paths().bench() / f"{name}_bench.py"
    if not path.is_file():
        raise errors.FailedPrecondition(
            f"no benchmark {path}: the benchmarks live in a binlake checkout's bench/ folder; "
            "run from a checkout or set BINLAKE_BENCH_DIR")
    # The benchmarks share bench/benchkit.py and import it by its plain name.
    kit = path.parent / "benchkit.py"
    if kit.is_file() and "benchkit" not in sys.modules:
        _load_file("benchkit", kit)
    return _load_file(f"{name}_bench", path)


def _load_file(name: str, path: pathlib.Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses in the module look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _configure_tls(args: argparse.Namespace) -> None:
    """[security] from flags > env > the command's --config file, for every server and channel."""
    from binlake import config, rpc

    settings = config.load(config.SecuritySettings, getattr(args, "config", None),
                           ca=args.ca, cert=args.cert, key=args.key)
    rpc.configure_tls(settings.files())
    # Child processes (`binlake up`'s registry and Pumps, spark-submit) inherit the same
    # files through the environment (paths only; the key's contents are never copied).
    for name in ("ca", "cert", "key"):
        value = getattr(settings, name)
        if value:
            os.environ[f"BINLAKE_SECURITY_{name.upper()}"] = value


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    parser.error(f"unknown command {args.command}")
    return EXIT_USER


if __name__ == "__main__":
    raise SystemExit(main())
