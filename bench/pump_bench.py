"""Pump write benchmark: committed transactions/s, MB/s, latency and fsyncs/s
for several writer counts and transaction sizes, against the raw append+fsync
bandwidth of the same bytes on the same disk, measured in the same run.

Setup: a registry and one Pump as processes (fsync on); writers are threads
spread over up to 4 client processes (as upstream servers would be), each
process with one PumpClient and one RegistryClient (both coalesce concurrent
calls). A transaction = TSO, prewrite of SIZE bytes (acknowledged after
fsync), TSO, commit (acknowledged once appended, fsynced with the next group
or within 5 ms: ``[pump] sync_commits``).

``--floor`` adds the transport's ceiling on this machine, in the same run: the
same cases against a Pump whose storage acknowledges every binlog at once and
keeps nothing (the same gRPC server, servicer, PumpService checks and
PumpClient; no value log, no fsync, no index). No Pump written in Python on
this gRPC stack can go faster than that row, whatever its storage does.

``--replicas 1,2`` runs every case at each replica count R on a cluster of
max(R) Pumps (each on its own data directory; on one disk here, so the copies'
fsyncs share it): R = 1 spreads prewrites over the Pumps, R = 2 writes each to
two and acknowledges once both fsynced. Pump CPU and fsync figures are pump1's.
With ``--floor`` the floor then runs in that shape too (``floor-2pumps``: as
many null-storage Pumps as the R rows' cluster, the client spreading prewrites
over them the same way), beside the one-null-Pump floor: R = 1 there is two
Pump processes sharing the two cores and halving each stream's batches, which
a floor of one Pump does not pay; the floor of the same shape is the
transport's ceiling for that cluster.

``--no-flush`` adds the same Pumps with the disk flush skipped (``noflush``
rows: ``bench/noflush/sitecustomize.py`` makes the value log's fdatasync return
at once in the Pump processes only; nothing in binlake can do that): between
the floor and the real rows, it splits what the Pump costs into its own code
and the disk's flush, in the same run. Acknowledged writes there would not
survive a power loss: it is a measurement, never a setting.

With ``--floor`` and one writer, ``floor-fsync`` is that null storage plus
the value log's disk work alone (``_FsyncOnlyStorage``: each batch appended to
a file, fdatasync'd before its acknowledgement when it holds a prewrite): its
ratio to the floor is what the disk's flush leaves, so what the Pump's own code
may cost within a target ratio is what lies between the two.

``--rounds N`` runs every case N times, each round running it on the Pumps
and on every floor back to back (the null Pumps stay up beside the real ones),
and reports the median round: a ratio from one run of a few seconds moves by 15 % or more
on a shared machine; each round's ratio cancels the drift between rounds.
With ``--replicas`` a table of R > 1 against R = 1 (txn/s and p99) is built the
same way: the median of the rounds' own ratios.

``--echo`` adds grpcio's own ceiling (``grpc_echo``): a bidirectional-stream
echo with no binlake code, one stream per writer, in the same run. Two of its
round trips are one committed transaction's worth of acknowledged messages.

Run: ``binlake bench pump`` (or ``make bench``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing as mp
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Worker processes are spawned and import this module (and benchkit) by name:
# this folder must be on their path; the binlake command itself never adds it.
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from benchkit import cpu_seconds, percentile, run_threads  # noqa: E402


class _BlockTS:
    """TSOs reserved from the registry in blocks: isolates the Pump from TSO round trips."""

    def __init__(self, reg, block: int = 4096) -> None:
        self._reg = reg
        self._block = block
        self._lock = threading.Lock()
        self._next = self._end = 0

    def get_ts(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._next = self._reg.get_ts_batch(self._block)
                self._end = self._next + self._block
            ts = self._next
            self._next += 1
            return ts


def _use_tree(include: str | None) -> None:
    """Import binlake from ``include`` (another checkout's include dir) in this process."""
    if include:
        sys.path.insert(0, include)


def _worker(registry: str, threads: int, size: int, seconds: float, tso_mode: str, commit_mode: str,
            out: mp.Queue, include: str | None = None, pump_addr: str = "", replicas: int = 1) -> None:
    _use_tree(include)
    from binlake.client.pump_client import PumpClient
    from binlake.config import ClientSettings
    from binlake.proto import binlog_pb2 as bp
    from binlake.registry.client import RegistryClient

    registry_client = RegistryClient(registry)
    reg = _BlockTS(registry_client) if tso_mode == "block" else registry_client
    # The floor's null Pumps are not registered: the client is given their addresses.
    client = (PumpClient(pumps={f"pump{i}": a for i, a in enumerate(pump_addr.split(","), 1)}) if pump_addr
              else PumpClient(settings=ClientSettings(registry=registry, **({"replicas": replicas} if replicas > 1
                                                                             else {}))))
    value = bp.PrewriteValue(mutations=[bp.TableMutation(table_id=1, inserted_rows=[os.urandom(size)],
                                                         sequence=[bp.INSERT])]).SerializeToString()
    latencies: list[float] = []
    counts = [0] * threads
    lock = threading.Lock()
    acked = [0]

    def on_commit(future) -> None:  # background mode: count a transaction once its commit is durable
        if future.exception() is None:
            with lock:
                acked[0] += 1

    def run(i: int, stop: threading.Event) -> None:
        local: list[float] = []
        while not stop.is_set():
            start_ts = reg.get_ts()
            t0 = time.perf_counter()
            pump = client.write_prewrite(bp.Binlog(tp=bp.PREWRITE, start_ts=start_ts, prewrite_key=b"bench",
                                                   prewrite_value=value))
            t1 = time.perf_counter()
            commit_ts = reg.get_ts()
            t2 = time.perf_counter()
            commit = bp.Binlog(tp=bp.COMMIT, start_ts=start_ts, commit_ts=commit_ts)
            if commit_mode == "background":
                # As TxnWriter does: the upstream committed; the commit binlog
                # is acknowledged later, and only then is the transaction counted.
                client.write_commit_async(commit, pump).add_done_callback(on_commit)
                local.append(t1 - t0)
            else:
                client.write_commit(commit, pump)
                local += (t1 - t0, time.perf_counter() - t2)
                counts[i] += 1
        with lock:
            latencies.extend(local)

    started = time.perf_counter()
    cpu0 = os.times()
    run_threads(threads, seconds, run)
    client.flush()  # background commits still in flight count only once acknowledged
    elapsed = time.perf_counter() - started
    if commit_mode == "background":
        counts = [acked[0]]
    cpu1 = os.times()
    client.close()
    registry_client.close()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    out.put((sum(counts), elapsed, latencies, cpu))


def _metrics(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("binlake_pump_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def raw_fsync(directory: pathlib.Path, size: int, seconds: float, group: int = 64) -> tuple[float, float]:
    """Append records of ``size`` (+ a 40-byte commit record each) in groups of
    ``group`` per fdatasync: (records/s, MB/s). The physical limit for our bytes."""
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    payload = os.urandom(size + 12) + os.urandom(52)
    chunk = payload * group
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, chunk)
            os.fdatasync(fd)
            n += group
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    elapsed = time.perf_counter() - t0
    return n / elapsed, n * len(payload) / elapsed / 1e6


def fsync_latency(directory: pathlib.Path, count: int = 300) -> float:
    path = directory / "lat.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    for _ in range(count):
        os.write(fd, b"x" * 1024)
        os.fdatasync(fd)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    path.unlink(missing_ok=True)
    return elapsed / count * 1000


def settle_disk(directory: pathlib.Path, seconds: float = 2.0) -> None:
    """Let the raw measurement's deleted files leave the disk before the cases run.

    The raw cases write and delete hundreds of MB; their writeback and the
    discard of their blocks (this disk is mounted with ``discard``) otherwise
    land on the first variant's cases: with two identical trees as ``new`` and
    ``--baseline``, the first had the higher p99 in 3 of 4 runs (bench/RESULTS.md)."""
    os.sync()
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    time.sleep(seconds)


def _storage_worker(include: str | None, directory: str, writers: int, size: int, seconds: float,
                    out: mp.Queue) -> None:
    """The storage layer alone (no gRPC): ``writers`` threads each store prewrite then
    commit through ``Storage.submit`` and wait for each acknowledgement. CPU per
    transaction is the process's, less what the writers spend building binlogs."""
    _use_tree(include)
    from binlake.proto import binlog_pb2 as bp
    from binlake.pump.storage import Entry, Storage

    st = Storage(directory, segment_bytes=512 << 20)
    value = bp.PrewriteValue(mutations=[bp.TableMutation(table_id=1, inserted_rows=[os.urandom(size)],
                                                         sequence=[bp.INSERT])]).SerializeToString()
    ts = iter(range(1 << 40, 1 << 62, 2))
    lock = threading.Lock()
    counts = [0] * writers
    lat: list[float] = []

    building = [0.0] * writers

    def run(i: int, stop: threading.Event) -> None:
        local: list[float] = []
        while not stop.is_set():
            with lock:
                start = next(ts)
            c0 = time.thread_time()
            b = bp.Binlog(tp=bp.PREWRITE, start_ts=start, prewrite_key=b"bench", prewrite_value=value)
            pb = b.SerializeToString()
            building[i] += time.thread_time() - c0
            t0 = time.perf_counter()
            st.submit([Entry(b, pb)]).result()
            local.append(time.perf_counter() - t0)
            c0 = time.thread_time()
            c = bp.Binlog(tp=bp.COMMIT, start_ts=start, commit_ts=start + 1)
            cb = c.SerializeToString()
            building[i] += time.thread_time() - c0
            st.submit([Entry(c, cb)]).result()
            counts[i] += 1
        with lock:
            lat.extend(local)

    cpu0 = time.process_time()
    elapsed = run_threads(writers, seconds, run)
    st.wait_indexed(timeout=60)  # the indexing of what was acknowledged counts too
    cpu = time.process_time() - cpu0 - sum(building)
    fsyncs = st.stats.fsyncs
    st.close()
    txns = sum(counts)
    out.put((txns / elapsed, fsyncs / elapsed, sorted(lat), cpu / txns * 1e6 if txns else 0.0))


class _NullStorage:
    """Acknowledges every binlog at once and keeps nothing: the floor's storage."""

    def submit(self, entries: list) -> concurrent.futures.Future[list]:
        # Through submit_cb, so a subclass's storing serves the unary write RPCs too.
        f: concurrent.futures.Future[list] = concurrent.futures.Future()
        self.submit_cb(entries, lambda results, _exc: f.set_result(results))
        return f

    def submit_cb(self, entries: list, done, *, may_lead: bool = True) -> None:
        done([None] * len(entries), None)

    @staticmethod
    def disk_free_bytes() -> int:
        return 1 << 50


class _FsyncOnlyStorage(_NullStorage):
    """The floor plus the value log's disk work and nothing else: each batch's
    bytes appended to one file, and fdatasync'd before the acknowledgement when
    the batch holds a prewrite (the Pump's durability rule: commits ride on a
    later flush). No validation, index, memory of transactions or group commit,
    so it is a floor only where no group could form: one writer."""

    def __init__(self, path: str) -> None:
        from binlake.proto import binlog_pb2

        self._prewrite = binlog_pb2.PREWRITE
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def submit_cb(self, entries: list, done, *, may_lead: bool = True) -> None:
        with self._lock:
            os.write(self._fd, b"".join(e.payload for e in entries))
            if any(e.tp == self._prewrite for e in entries):
                os.fdatasync(self._fd)
        done([None] * len(entries), None)


def _null_pump(out: mp.Queue, fsync_path: str | None = None) -> None:
    """Serve the Pump's write RPCs on the real server and servicer over
    ``_NullStorage`` (``_FsyncOnlyStorage`` on ``fsync_path`` when given)."""
    from binlake import rpc
    from binlake.pump.metrics import PumpMetrics
    from binlake.pump.server import PumpServer, PumpServicer
    from binlake.pump.service import PumpService

    storage = _FsyncOnlyStorage(fsync_path) if fsync_path else _NullStorage()
    service = PumpService(storage, node_id="pump1", max_binlog_bytes=1 << 30,  # type: ignore[arg-type]
                          stop_write_at_free_bytes=0)
    service.registered = True
    metrics = PumpMetrics(dict)
    options = rpc.message_options(1 << 30)
    server = PumpServer("127.0.0.1:0", options, 64)
    server.add(PumpServicer(service, metrics))
    server.start()
    out.put((os.getpid(), f"127.0.0.1:{server.port}"))
    server.wait_for_termination()


@contextlib.contextmanager
def null_pumps(count: int, fsync_path: str | None = None) -> Iterator[tuple[int, str]]:
    """``count`` null-storage Pump processes (see the module docstring), each with
    ``_FsyncOnlyStorage`` on its own file under ``fsync_path`` when given: yields
    the first one's pid (its CPU is the rows' pump CPU, as pump1's in the R rows)
    and their comma-separated addresses (the client spreads prewrites over them as
    over real Pumps at R = 1)."""
    ctx = mp.get_context("spawn")
    addr_q: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_null_pump, args=(addr_q, f"{fsync_path}-{i}" if fsync_path else None),
                         daemon=True)
             for i in range(count)]
    for proc in procs:
        proc.start()
    try:
        served = [addr_q.get(timeout=60) for _ in procs]  # (pid, address), in any order
        yield served[0][0], ",".join(addr for _pid, addr in served)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(10)


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (variant, case): the round with the median txn/s (an odd count
    of rounds gives the middle one), its other figures with it. Rows keep their
    first appearance's order."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_case_key(r), []).append(r)
    out = []
    for group in groups.values():
        ranked = sorted(group, key=lambda r: r["txn_s"])
        out.append({**ranked[(len(ranked) - 1) // 2], "rounds": len(group)})
    return out


def _case_key(r: dict) -> tuple:
    return (r["variant"], r.get("replicas", 1), r["tso"], r["commit"], r["writers"], r["size"])


def round_ratio(rows: list[dict], r: dict, floor: str) -> float | None:
    """The median over rounds of r's txn/s ÷ the floor's in the same round (a
    round runs every variant of a case back to back, so a machine's drift between
    rounds cancels out of each ratio)."""
    key = _case_key(r)  # an R = 1 row, as every floor's
    return _paired_median(rows, lambda x: _case_key(x) == key, lambda x: _case_key(x) == (floor, *key[1:]),
                          "txn_s")


def replica_ratio(rows: list[dict], r: dict, field: str) -> float | None:
    """The median over rounds of r's ``field`` (an R > 1 row) ÷ the same case's
    at R = 1 on the same Pumps in the same round."""
    key = _case_key(r)
    return _paired_median(rows, lambda x: _case_key(x) == key,
                          lambda x: _case_key(x) == (key[0], 1, *key[2:]), field)


def _paired_median(rows: list[dict], mine: Callable[[dict], bool], ref: Callable[[dict], bool],
                   field: str) -> float | None:
    a = {x["round"]: x[field] for x in rows if mine(x)}
    b = {x["round"]: x[field] for x in rows if ref(x) and x[field]}
    ratios = sorted(a[i] / b[i] for i in a if i in b)
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def storage_case(include: str | None, directory: pathlib.Path, writers: int, size: int,
                 seconds: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    directory.mkdir(parents=True, exist_ok=True)
    proc = ctx.Process(target=_storage_worker, args=(include, str(directory), writers, size, seconds, out))
    proc.start()
    txn_s, fsync_s, lat, cpu_us = out.get(timeout=seconds + 120)
    proc.join()
    shutil.rmtree(directory, ignore_errors=True)
    return {"txn_s": txn_s, "fsync_s": fsync_s, "p50_ms": percentile(lat, 0.5) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000, "cpu_us_txn": cpu_us}


def raw_single(directory: pathlib.Path, size: int, seconds: float) -> float:
    """Records of ``size`` appended one per fdatasync: records/s (one writer's ceiling)."""
    return raw_fsync(directory, size, seconds, group=1)[0]


def _reset_peak_rss(pid: int) -> None:
    # Writing 5 to clear_refs resets VmHWM (Linux), so each case reports its own peak.
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process used so far."""
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return 0.0


def _peak_rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_case(registry: str, metrics_url: str, writers: int, size: int, seconds: float, tso_mode: str,
             procs: int, commit_mode: str = "sync", include: str | None = None,
             pump_pid: int = 0, pump_addr: str = "", replicas: int = 1) -> dict[str, float]:
    procs = min(writers, procs)
    per = [writers // procs + (1 if i < writers % procs else 0) for i in range(procs)]
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    zero = {"binlake_pump_fsyncs_total": 0.0, "binlake_pump_bytes_stored_total": 0.0}
    before = _metrics(metrics_url) if metrics_url else zero
    workers = [ctx.Process(target=_worker, args=(registry, n, size, seconds, tso_mode, commit_mode, out, include,
                                                 pump_addr, replicas))
               for n in per]
    if pump_pid:
        _reset_peak_rss(pump_pid)
    cpu_before = _cpu_s(pump_pid) if pump_pid else 0.0
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
    after = _metrics(metrics_url) if metrics_url else zero
    cpu = (_cpu_s(pump_pid) - cpu_before) if pump_pid else 0.0
    txns = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    lat = sorted(x for r in results for x in r[2])
    fsyncs = after["binlake_pump_fsyncs_total"] - before["binlake_pump_fsyncs_total"]
    stored = after["binlake_pump_bytes_stored_total"] - before["binlake_pump_bytes_stored_total"]
    if not metrics_url:  # the floor stores nothing: count the bytes the writers sent
        stored = txns * (size + 64)
    return {
        "replicas": replicas, "tso": tso_mode, "commit": commit_mode, "procs": procs, "writers": writers, "size": size, "txn_s": txns / elapsed, "mb_s": stored / elapsed / 1e6,
        "p50_ms": percentile(lat, 0.5) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "fsync_s": fsyncs / elapsed, "binlogs_per_fsync": (2 * txns / fsyncs) if fsyncs else 0.0,
        "rss_mib": _peak_rss_mib(pump_pid) if pump_pid else 0.0,
        # The Pump's CPU per committed transaction: robust to a machine shared with others.
        "cpu_us_txn": cpu / txns * 1e6 if txns else 0.0,
        "client_cpu_us_txn": sum(r[3] for r in results) / txns * 1e6 if txns else 0.0,
    }


def start_cluster(directory: pathlib.Path, pumps: int, env: dict[str, str | None],
                  attempts: int = 3) -> tuple[Any, str]:
    """A registry and ``pumps`` Pumps (pump1 serving metrics; one address cannot
    serve several), started with ``env`` added to their environment; returns the
    cluster and pump1's metrics address. The ports are picked free before the
    processes start, so another process may take one meanwhile: a start that
    fails is retried on new ports (and a new data directory) up to ``attempts``
    times."""
    from binlake import errors
    from binlake.net import free_port
    from binlake.testing.devcluster import DevCluster

    for attempt in range(1, attempts + 1):
        metrics_addr = f"127.0.0.1:{free_port()}"
        cluster = DevCluster(directory.with_name(f"{directory.name}-{attempt}"), pumps=pumps,
                             pump_args=["--stop-write-at-free-bytes", "0"])
        cluster.pumps["pump1"].args += ["--metrics-addr", metrics_addr]
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            if v:
                os.environ[k] = v
        try:
            cluster.start()  # stops what it started when it fails
            return cluster, metrics_addr
        except errors.Unavailable as exc:
            if attempt == attempts:
                raise
            print(f"  the cluster did not start ({exc}); again on other ports", flush=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    raise AssertionError("unreachable")


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--seconds", type=float, default=5.0)
        parser.add_argument("--writers", default="1,4,16,64,256")
        parser.add_argument("--sizes", default="1024,65536")
        parser.add_argument("--dir")
        parser.add_argument("--client-procs", type=int, default=1)
        parser.add_argument("--no-tso-per-txn", dest="tso_per_txn", action="store_false")
        parser.add_argument("--baseline")
        parser.add_argument("--no-storage", dest="storage", action="store_false")
        parser.add_argument("--floor", action="store_true")
        parser.add_argument("--echo", action="store_true")
        parser.add_argument("--no-flush", action="store_true")
        parser.add_argument("--replicas", default="")
        parser.add_argument("--rounds", type=int, default=1)
        args = parser.parse_args()
    try:
        writers = [int(x) for x in args.writers.split(",") if x]
        sizes = [int(x) for x in args.sizes.split(",") if x]
        replica_counts = [int(x) for x in (getattr(args, "replicas", "") or "").split(",") if x] or [1]
    except ValueError:
        print("bench pump: --writers, --sizes and --replicas take comma-separated integers, e.g. 1,4,16",
              file=sys.stderr)
        return 2
    if min(replica_counts) < 1 or max(replica_counts) > 16:
        print("bench pump: --replicas takes counts from 1 to 16, e.g. 1,2", file=sys.stderr)
        return 2
    if not writers or not sizes or min(writers) < 1 or min(sizes) < 1 or args.seconds <= 0:
        print("bench pump: writers, sizes and --seconds must be positive", file=sys.stderr)
        return 2
    rounds = getattr(args, "rounds", 1)
    if not 1 <= rounds <= 99:
        print("bench pump: --rounds takes a count from 1 to 99, e.g. 3", file=sys.stderr)
        return 2
    baseline = getattr(args, "baseline", None)
    if baseline and not (pathlib.Path(baseline) / "binlake" / "__init__.py").is_file():
        print(f"bench pump: --baseline {baseline} is not an include dir with a binlake package in it "
              "(e.g. `git archive main include | tar -x -C /tmp/base`, then --baseline /tmp/base/include)",
              file=sys.stderr)
        return 2
    base = pathlib.Path(args.dir) if args.dir else ROOT / "bench"
    base.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(tempfile.mkdtemp(prefix="pump-bench-", dir=base))
    print(f"scratch dir {root} ({shutil.disk_usage(root).free / 1e9:.0f} GB free); "
          f"fdatasync of 1 KiB here: {fsync_latency(root):.2f} ms", flush=True)
    # (name, include dir or None for this tree, the Pumps' extra environment): each case
    # runs on each, back to back.
    variants: list[tuple[str, str | None, dict[str, str]]] = [("new", None, {})]
    if baseline:
        variants.append(("baseline", str(pathlib.Path(baseline).resolve()), {}))
    if getattr(args, "no_flush", False):
        # The shim ahead of the caller's own path (a worktree's include dir, say): the
        # Pumps must still import the tree this bench measures.
        shim_path = os.pathsep.join(p for p in (str(ROOT / "bench" / "noflush"), os.environ.get("PYTHONPATH")) if p)
        variants.append(("noflush", None, {"PYTHONPATH": shim_path, "BINLAKE_BENCH_NO_FLUSH": "1"}))
    rows = []
    storage_rows = []
    echo_rows: list[dict[str, float]] = []
    raw: dict[int, tuple[float, float, float]] = {}
    per_txn_writers = 16 if 16 in writers else max(writers)
    try:
        for size in sizes:
            raw_rec_s, raw_mb_s = raw_fsync(root, size, min(args.seconds, 3.0))
            raw[size] = (raw_rec_s, raw_mb_s, raw_single(root, size, min(args.seconds, 2.0)))
            print(f"raw, {size} B records: {raw_rec_s:,.0f} records/s ({raw_mb_s:.1f} MB/s) 64 per fdatasync, "
                  f"{raw[size][2]:,.0f} records/s one per fdatasync", flush=True)
            settle_disk(root)
            if getattr(args, "echo", False):
                from grpc_echo import echo_case

                for w in writers:
                    e = echo_case(w, size, args.seconds)
                    echo_rows.append(e)
                    print(f"  grpcio echo writers={w:<3} size={size:<6} {e['rt_s']:>8.0f} round trips/s "
                          f"p50 {e['p50_ms']:.2f} ms p99 {e['p99_ms']:.2f} ms", flush=True)
            for name, include, pump_env in variants:
                if getattr(args, "storage", True) and name != "noflush":
                    for w in sorted({1, 16} & set(writers) or {min(writers)}):
                        r = storage_case(include, root / f"storage-{name}", w, size, args.seconds)
                        r.update(variant=name, writers=w, size=size, raw_rec_s=raw_rec_s, raw_one_s=raw[size][2])
                        storage_rows.append(r)
                        print(f"  {name:<8} storage alone writers={w:<3} size={size:<6} {r['txn_s']:>8.0f} txn/s "
                              f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms {r['fsync_s']:.0f} fsyncs/s "
                              f"{r['cpu_us_txn']:.0f} CPU µs/txn",
                              flush=True)
                cluster, metrics_addr = start_cluster(root / f"{name}-{size}", max(replica_counts),
                                                      {"PYTHONPATH": include, **pump_env})
                try:
                    proc = cluster.pumps["pump1"].proc
                    pid = proc.pid if proc is not None else 0
                    cases = [(w, "block", "sync") for w in writers]
                    if args.tso_per_txn:
                        cases.append((per_txn_writers, "per-txn", "sync"))
                        cases.append((per_txn_writers, "per-txn", "background"))
                    with contextlib.ExitStack() as stack:
                        # (name, pid, addresses, at one writer only): up beside the real
                        # cluster, so each round runs a case on all of them back to back.
                        floors: list[tuple[str, int, str, bool]] = []
                        if getattr(args, "floor", False) and name == "new":
                            # One null Pump, and (with --replicas) as many as the R rows' cluster.
                            for n_null in sorted({1, max(replica_counts)}):
                                floors.append(("floor" if n_null == 1 else f"floor-{n_null}pumps",
                                               *stack.enter_context(null_pumps(n_null)), False))
                            if 1 in writers:  # in the R rows' shape too (the others' own-shape floor)
                                n_null = max(replica_counts)
                                floors.append(("floor-fsync" if n_null == 1 else f"floor-fsync-{n_null}pumps",
                                               *stack.enter_context(null_pumps(n_null, str(root / "fsync-only"))),
                                               True))
                        for rnd in range(rounds):
                            tag = f"[{rnd + 1}/{rounds}] " if rounds > 1 else ""
                            for w, mode, commit_mode in cases:
                                for replicas in replica_counts:
                                    r = run_case(cluster.registry_addr, f"http://{metrics_addr}/metrics", w, size,
                                                 args.seconds, mode, args.client_procs, commit_mode, include, pid,
                                                 replicas=replicas)
                                    r.update(variant=name, raw_mb_s=raw_mb_s, raw_rec_s=raw_rec_s, round=rnd)
                                    rows.append(r)
                                    print(f"  {tag}{name:<8} R={replicas} tso={mode:<7} commit={commit_mode:<10} "
                                          f"writers={w:<3} size={size:<6} "
                                          f"{r['txn_s']:>8.0f} txn/s {r['mb_s']:>7.1f} MB/s  p50 {r['p50_ms']:.2f} ms  "
                                          f"p99 {r['p99_ms']:.2f} ms  {r['fsync_s']:.0f} fsyncs/s  pump "
                                          f"{r['cpu_us_txn']:.0f} CPU µs/txn, peak RSS {r['rss_mib']:.0f} MiB",
                                          flush=True)
                                for floor_name, floor_pid, floor_addrs, one_writer in floors:
                                    if one_writer and w != 1:
                                        continue
                                    r = run_case(cluster.registry_addr, "", w, size, args.seconds, mode,
                                                 args.client_procs, commit_mode, None, floor_pid,
                                                 pump_addr=floor_addrs)
                                    r.update(variant=floor_name, raw_mb_s=raw_mb_s, raw_rec_s=raw_rec_s, round=rnd)
                                    rows.append(r)
                                    print(f"  {tag}{floor_name:<8} tso={mode:<7} commit={commit_mode:<10} "
                                          f"writers={w:<3} size={size:<6} {r['txn_s']:>8.0f} txn/s  "
                                          f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
                                          f"pump {r['cpu_us_txn']:.0f} CPU µs/txn", flush=True)
                finally:
                    cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    all_rows, rows = rows, median_rows(rows)
    print()
    if rounds > 1:
        print(f"Each figure is the median of {rounds} rounds (the round with the median txn/s, its other "
              "figures with it); each ÷ floor is the median of the rounds' own ratios.")
    print("| path | R | TSO | commit binlog | writers | txn size | committed txn/s | MB/s | p50 write ms | p99 write ms "
          "| fsyncs/s | binlogs/fsync | pump CPU µs/txn | client CPU µs/txn | pump peak RSS MiB | raw append+fsync MB/s "
          "| ratio to raw |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r.get('replicas', 1)} | {r['tso']} | {r['commit']} | {r['writers']} | {r['size'] // 1024} KiB | "
              f"{r['txn_s']:.0f} | {r['mb_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['fsync_s']:.0f} | "
              f"{r['binlogs_per_fsync']:.1f} | {r['cpu_us_txn']:.0f} | {r['client_cpu_us_txn']:.0f} | "
              f"{r['rss_mib']:.0f} | {r['raw_mb_s']:.1f} | "
              f"{r['mb_s'] / r['raw_mb_s']:.2f} |")
    if storage_rows:
        print()
        print("| path | storage alone (no gRPC) | writers | txn size | committed txn/s | p50 prewrite ms "
              "| p99 prewrite ms | fsyncs/s | CPU µs/txn | raw one-record append+fdatasync/s "
              "| txn/s ÷ raw one-record/s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in storage_rows:
            print(f"| {r['variant']} | Storage.submit | {r['writers']} | {r['size'] // 1024} KiB | {r['txn_s']:.0f} | "
                  f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['fsync_s']:.0f} | {r['cpu_us_txn']:.0f} | "
                  f"{r['raw_one_s']:.0f} | "
                  f"{r['txn_s'] / r['raw_one_s']:.2f} |")
    if echo_rows:
        print()
        print("| grpcio echo (no binlake code) | writers | message size | round trips/s | p50 ms | p99 ms "
              "| server CPU µs/round trip | client CPU µs/round trip | txn/s at one message per binlog (2 round trips a txn) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for e in echo_rows:
            print(f"| stream, thread-pool server | {e['writers']} | {e['size'] // 1024} KiB | {e['rt_s']:.0f} | "
                  f"{e['p50_ms']:.2f} | {e['p99_ms']:.2f} | {e['server_cpu_us']:.0f} | {e['client_cpu_us']:.0f} | "
                  f"{e['rt_s'] / 2:.0f} |")
    print()
    print("Raw figures of this disk, same run: " + "; ".join(
        f"{size} B: {v[0]:,.0f} records/s ({v[1]:.1f} MB/s) at 64 per fdatasync, {v[2]:,.0f}/s at one per fdatasync"
        for size, v in raw.items()))
    print("TSO block = timestamps reserved from the registry 4096 at a time (measures the Pump); "
          "per-txn = two registry round trips per transaction (coalesced per client process).")
    if any(r["variant"] == "floor" for r in rows):
        print("floor = the same server and client against a Pump that acknowledges at once and stores nothing "
              "(no fsync): the transport's ceiling on this machine.")
        floors = sorted({str(r["variant"]) for r in rows if str(r["variant"]).startswith("floor")},
                        key=lambda f: (f.startswith("floor-fsync"), f))
        for f in floors:
            if f.endswith("pumps") and not f.startswith("floor-fsync"):
                print(f"{f} = the floor in the R rows' shape: that many null-storage Pumps, the client "
                      "spreading prewrites over them as over the real ones at R = 1 (pump CPU: the first one's).")
        for f in (f for f in floors if f.startswith("floor-fsync")):
            print(f"{f} = the floor plus the value log's disk work alone: each batch appended to a file and "
                  "fdatasync'd before its acknowledgement when it holds a prewrite (no checks, index or group "
                  "commit; one writer only, where no group could form; as many null Pumps as the R rows' cluster): "
                  "what the disk's flush leaves of the "
                  "floor, and so the budget the Pump's own code has left.")
        print()
        print("| path | R | TSO | commit binlog | writers | txn/s | " + " | ".join(f"÷ {f}" for f in floors) + " |")
        print("|---|---:|---|---|---:|---:|" + "---:|" * len(floors))
        for r in rows:
            # floor-fsync has a row too: its ratio to the floor is what the flush alone costs.
            flush_floor = str(r["variant"]).startswith("floor-fsync")
            if (r["variant"] in floors and not flush_floor) or r.get("replicas", 1) != 1:
                continue
            ratios = []
            for f in floors:
                ratio = round_ratio(all_rows, r, f) if f != r["variant"] else None
                ratios.append("-" if ratio is None else f"{ratio:.2f}")
            print(f"| {r['variant']} | 1 | {r['tso']} | {r['commit']} | {r['writers']} | {r['txn_s']:.0f} | "
                  + " | ".join(ratios) + " |")
    replicated = [r for r in rows if r.get("replicas", 1) > 1]
    if replicated:
        print()
        print("| path | R | TSO | commit binlog | writers | txn/s ÷ R = 1's | p99 ÷ R = 1's |")
        print("|---|---:|---|---|---:|---:|---:|")
        for r in replicated:
            ratios = [replica_ratio(all_rows, r, field) for field in ("txn_s", "p99_ms")]
            print(f"| {r['variant']} | {r['replicas']} | {r['tso']} | {r['commit']} | {r['writers']} | "
                  + " | ".join("-" if x is None else f"{x:.2f}" for x in ratios) + " |")
        print("(each the median of the rounds' own ratios: R = 1 and R = 2 of a case run back to back on the same "
              "Pumps)")
    if any(r["variant"] == "noflush" for r in rows):
        print("noflush = the same Pumps with the value log's fdatasync returning at once (bench/noflush; fsyncs/s "
              "there counts the flushes skipped): the Pump's own code without the disk's flush.")
    print("commit binlog sync = the writer waits for it; background = as TxnWriter (the upstream has "
          "committed), counted only once acknowledged.")
    print(f"raw = the same record sizes appended 64 per fdatasync on the same disk; client processes: "
          f"{args.client_procs}; paths: " + ", ".join(
              f"{n} = {i or 'this tree'}" + (" with the Pumps' disk flush skipped" if e else "")
              for n, i, e in variants) + ".")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "include"))
    raise SystemExit(main())
