"""spark-submit entry point: apply a replication task's windows to its target.

    spark-submit jobs/apply.py --task FILE [--target URL] [--until-ts T] [--lake DIR]

Argument parsing, one SparkSession, one ``binlake.replicate.runner.Applier``
run; the summary is printed as one JSON line (last line of stdout). A refusal
exits with its message on stderr and status 3 when no retry can help (a bad
task file, a target changed by hand: ``errors.is_final``) or 2 when a retry may
(the target unreachable, a window not ingested yet).
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jobs/apply.py", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="task file (TOML)")
    parser.add_argument("--target", help="target URL (default: the task file's; the DAG resolves Connection ids)")
    parser.add_argument("--until-ts", type=int, help="apply only windows ending at or before this TSO")
    parser.add_argument("--lake", help="lake directory or URI (default: the task file's)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, $BINLAKE_SPARK_MASTER or local[*])")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from binlake import errors
    from binlake.lake.sparkenv.session import LAKE_CONF, build_spark
    from binlake.replicate import report, runner, task

    try:
        t = task.load(args.task)
        spark = build_spark("binlake-apply", args.master, extra_conf=LAKE_CONF)
        summary = runner.Applier(spark, t, lake=args.lake, target_url=args.target,
                                 progress=lambda m: print(m, file=sys.stderr, flush=True)).run(args.until_ts)
    except errors.BinlakeError as exc:
        print(f"apply: {exc}", file=sys.stderr)
        return errors.EXIT_FINAL if errors.is_final(exc) else errors.EXIT_RETRYABLE
    print(summary.summary(), file=sys.stderr)
    print(json.dumps(report.summary_dict(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
