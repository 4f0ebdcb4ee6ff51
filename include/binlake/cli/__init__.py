"""The ``binlake`` command: run services, operate the cluster, inspect binlogs, benchmark.

Every subcommand's --help shows examples. User mistakes (bad flags, bad
config, unreachable services, refused windows) print one clear line and exit
with status 2; nothing prints a traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from binlake import __version__, errors
from binlake.cli.args import EXIT_USER, Parser

__all__ = ["EXIT_USER", "build_parser", "main"]

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


# Subcommands that live beside their concept. Each module has
# ``register(sub, bench, fmt)``, which adds its parsers (``bench``: the
# subparsers of ``binlake bench``) and sets ``handler`` on each:
# ``handler(args) -> int`` (exit status). Errors it raises go through ``main``
# like every other command's. One line a module, so commands stay findable.
_COMMAND_MODULES: tuple[str, ...] = (
    "binlake.source.commands",
    "binlake.replicate.commands",
    "binlake.restore.commands",
    "binlake.undo.commands",
    "binlake.drill.commands",
)


# The core commands, each beside its concept, in the order --help lists them.
# Each module has ``register(sub, bench, fmt)`` like those of _COMMAND_MODULES.
_CORE_COMMAND_MODULES: tuple[str, ...] = (
    "binlake.registry.commands",
    "binlake.pump.commands",
    "binlake.stack.commands",
    "binlake.ctl.commands",
    "binlake.workload.commands",
    "binlake.lake.commands",
)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = Parser(
        prog="binlake", description=__doc__.splitlines()[0], epilog=_EPILOG_TOP, formatter_class=fmt
    )
    parser.add_argument("--version", action="version", version=f"binlake {__version__}")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log verbosity (default: [log] level, $BINLAKE_LOG_LEVEL, else INFO)")
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
    from binlake import config

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # The level in force, for the commands that quiet Spark below DEBUG.
        args.log_level = level = args.log_level or config.load(config.LogSettings).level
    except errors.BinlakeError as exc:
        print(f"binlake: error: {exc}", file=sys.stderr)
        return EXIT_USER
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return EXIT_USER
    try:
        # Every setting this command reads without a file of its own comes from its --config
        # too (an S3 lake's [lake.s3], [spark], [native], ...), for as long as it runs.
        config.use_file(getattr(args, "config", None))
        _configure_tls(args)
        _configure_spark(args)
        if getattr(args, "master", None) is not None:
            from binlake.lake.sparkenv.session import check_master

            check_master(args.master, "--master")
        return _dispatch(parser, args)
    except errors.BinlakeError as exc:
        print(f"binlake {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Out of memory, here or in a Spark JVM, is one line naming the setting to change,
        # whichever command ran into it; anything else is a bug and keeps its traceback.
        from binlake.lake.sparkenv.spark_errors import out_of_memory

        oom = out_of_memory(exc, "")
        if oom is None:
            raise
        print(f"binlake {args.command}: error: {oom}", file=sys.stderr)
        return EXIT_USER
    finally:
        config.reset()


def _configure_tls(args: argparse.Namespace) -> None:
    """[security] from flags > env > the command's --config file, for every server and channel."""
    from binlake import config, rpc

    settings = config.load(config.SecuritySettings, getattr(args, "config", None),
                           ca=args.ca, cert=args.cert, key=args.key)
    rpc.configure_tls(settings.files())
    # Child processes (`binlake up`'s registry and Pumps, Spark's Python workers and
    # servers) get the same files in the environment built for them (paths only; the
    # key's contents are never copied).
    config.export(config.SecuritySettings,
                  {name: getattr(settings, name) for name in ("ca", "cert", "key") if getattr(settings, name)})


def _configure_spark(args: argparse.Namespace) -> None:
    """[spark] from env > the command's --config file: this process reads it through
    ``config.use_file``; the spark-submit and Airflow processes it starts get it in the
    environment built for them (``config.child_env``)."""
    from binlake import config

    settings = config.load(config.SparkSettings)
    chosen: dict[str, object] = {}
    if settings.master:
        chosen["master"] = settings.master
    if not settings.ship_code:
        chosen["ship_code"] = False
    config.export(config.SparkSettings, chosen)


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    parser.error(f"unknown command {args.command}")
    return EXIT_USER


if __name__ == "__main__":
    raise SystemExit(main())
