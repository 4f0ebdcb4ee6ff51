"""The argument types and shared options of binlake's command lines, public for every
module that adds a subcommand (``register(sub, bench, fmt)``) and for the spark-submit
entry points under jobs/.

Each type is an argparse ``type=``: it returns the checked value or raises
``argparse.ArgumentTypeError`` with what was wrong, which ``Parser`` prints as one
line with exit status ``EXIT_USER``.
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Callable
from typing import Any, NoReturn

from binlake import errors, tso
from binlake.cli import argcheck
from binlake.net import DEFAULT_REGISTRY_ADDR, parse_addr_list

# The exit status of a user's mistake (bad flags, bad config, a refused request).
EXIT_USER = 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the command and where help is
    (subcommand parsers are of this class too: add_subparsers inherits it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def number_in(cast: Callable[[str], float], lo: float, hi: float, what: str) -> Callable[[str], Any]:
    """An argparse type: ``cast`` of the text, refused unless ``lo <= value <= hi``;
    both refusals say "expected {what} in lo..hi"."""
    if lo > hi:
        raise ValueError(f"number_in: empty range {lo}..{hi}")

    def parse(text: str) -> Any:
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} in {lo}..{hi}, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {what} in {lo}..{hi}, got {text}")
        return v

    return parse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def ts_arg(text: str) -> int:
    """A TSO: an integer in [0, 2^63)."""
    return _tso(text, "")


def window_ts_arg(text: str) -> int:
    """A window bound as a TSO, in a command whose --start/--end take datetimes instead."""
    return _tso(text, "; use --start/--end for datetimes")


def _tso(text: str, hint: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a TSO (an integer such as 470614378216685568), got {text!r}{hint}") from None
    if not 0 <= value <= tso.MAX_TS:
        raise argparse.ArgumentTypeError(f"a TSO must be in [0, 2^63), got {value}")
    return value


def scratch_dir(text: str) -> str:
    """A directory to work in: existing and writable, or creatable under a writable one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty string")
    path = pathlib.Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    if not argcheck.can_create_under(path):
        raise argparse.ArgumentTypeError(f"cannot create or write {text}: no writable directory there")
    return text


def spark_bench_args(p: argparse.ArgumentParser, master_help: str = "Spark master (default local[*])") -> None:
    """The flags every benchmark that runs Spark in a scratch directory takes: --master, --dir, --keep."""
    p.add_argument("--master", help=master_help)
    p.add_argument("--dir", type=scratch_dir, help="scratch directory (default: a temp dir under bench/)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")


def int_list(text: str) -> str:
    """Comma-separated positive integers (e.g. writer counts, sizes), checked; the text itself."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,4,16, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,4,16, got {text!r}")
    return text


def s3_lake_arg(text: str) -> str:
    """An ``s3://bucket/prefix`` lake (the benchmarks' second lake beside the local one)."""
    from binlake import errors
    from binlake.lake.store import location

    try:
        parsed = location.parse(text, "the lake")
    except errors.BinlakeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not parsed.is_s3:
        raise argparse.ArgumentTypeError(f"expected an s3://BUCKET/PREFIX lake, got {text!r}")
    return text


def include_dir(text: str) -> str:
    """Another checkout's include dir (``bench pump --baseline``): a binlake package in it."""
    if not (pathlib.Path(text) / "binlake" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an include dir with a binlake package in it (e.g. `git archive main include | "
            "tar -x -C /tmp/base`, then /tmp/base/include)")
    return text


def datetime_arg(text: str) -> int:
    try:
        return tso.parse_datetime(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        help="registry HOST:PORT, or a registry group's HOST:PORT,HOST:PORT,... (clients find and follow "
             f"its leader; default: [cluster] registry, $BINLAKE_REGISTRY, else {DEFAULT_REGISTRY_ADDR})",
    )


def add_lake(p: argparse.ArgumentParser) -> None:
    """Where the lake is and which Spark reads it (``lake.commands`` builds the session)."""
    p.add_argument("--lake", help="lake directory or URI (default: [lake] dir, $BINLAKE_LAKE_DIR)")
    p.add_argument("--master", help="Spark master (default: $BINLAKE_SPARK_MASTER, else local[*])")


def add_window(p: argparse.ArgumentParser) -> None:
    """A commit_ts window as TSOs or datetimes (``window_args`` reads it)."""
    p.add_argument("--start-ts", type=window_ts_arg, help="window start (inclusive), a TSO")
    p.add_argument("--end-ts", type=window_ts_arg, help="window end (exclusive), a TSO")
    p.add_argument("--start", type=datetime_arg, help="window start as an ISO datetime (UTC unless offset given)")
    p.add_argument("--end", type=datetime_arg, help="window end as an ISO datetime")


def window_args(args: argparse.Namespace) -> tuple[int, int]:
    """The window of ``--start-ts/--end-ts`` or ``--start/--end`` (exactly one form each)."""
    if args.start_ts is not None and args.start is not None:
        raise errors.InvalidArgument("give the window start once: --start-ts or --start, not both")
    if args.end_ts is not None and args.end is not None:
        raise errors.InvalidArgument("give the window end once: --end-ts or --end, not both")
    start = args.start_ts if args.start_ts is not None else args.start
    end = args.end_ts if args.end_ts is not None else args.end
    if start is None or end is None:
        raise errors.InvalidArgument("a window needs a start (--start-ts or --start) and an end (--end-ts or --end)")
    if start >= end:
        raise errors.InvalidArgument(f"window [{start}, {end}) is empty: the start must be before the end")
    return start, end


def registry_addr(args: argparse.Namespace) -> str:
    """The checked --registry of ``add_registry`` (one HOST:PORT or a registry group's
    comma-separated list, as given), else ``[cluster] registry``, else the default."""
    from binlake import config

    if args.registry is not None and not args.registry.strip():
        raise errors.InvalidArgument("--registry is empty: give the registry's HOST:PORT (e.g. 127.0.0.1:8230)")
    if args.registry is None:
        return config.load(config.ClusterSettings).registry or DEFAULT_REGISTRY_ADDR
    parse_addr_list(args.registry, "--registry")
    return str(args.registry)


def lake_arg(args: argparse.Namespace) -> str | None:
    """The --lake of ``add_lake``, else ``[lake] dir``; None when neither is set."""
    from binlake import config

    return args.lake if args.lake is not None else config.load(config.LakeSettings).dir
