"""Registry group benchmark: failover time, TSO throughput on etcd against the
SQLite registry, and a writer's registry traffic per second through a failover.

Three etcd members and three registries (``binlake registry --store etcd://...``)
run as processes on loopback; a lone SQLite registry runs beside them in the
same run, as the floor the etcd-backed leader is compared with.

- failover: kill -9 the leader registry, then time until a client (given the
  whole list) gets its next TSO, which only a newly elected leader can give;
  the killed member is restarted before the next run, and the next kill comes
  at a random point of the new leader's 1 s keepalive cycle;
- TSO: ``--threads`` threads calling ``get_ts`` (coalesced into batches as
  every client does) for ``--seconds`` against each registry: calls/s, p50/p99;
- writer through a failover: threads doing a writer's two registry calls per
  transaction (start_ts, commit_ts), the leader killed at second 3; committed
  transactions per second.

Run: ``binlake bench registry [--runs 5] [--seconds 3] [--threads 16]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchkit import percentile, run_threads


def _spawn_registry(args: list[str], log: pathlib.Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "binlake.cli", "registry", *args], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait(addr: str, timeout: float = 30.0) -> None:
    from binlake import errors
    from binlake.registry.client import RegistryClient

    deadline = time.monotonic() + timeout
    with RegistryClient(addr, timeout_s=1.0) as reg:
        while True:
            try:
                reg.get_ts()
                return
            except errors.BinlakeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _leader(addrs: list[str]) -> str:
    from binlake import errors
    from binlake.registry.client import RegistryClient

    deadline = time.monotonic() + 30
    with RegistryClient(",".join(addrs), timeout_s=0.5) as reg:
        while time.monotonic() < deadline:
            for a in addrs:
                try:
                    if reg.member(a, timeout_s=0.5).leader:
                        return a
                except errors.BinlakeError:
                    pass
            time.sleep(0.05)
    raise RuntimeError("no registry leader")


def _tso_case(addr: str, threads: int, seconds: float) -> dict[str, float]:
    from binlake.registry.client import RegistryClient

    lat: list[list[float]] = [[] for _ in range(threads)]
    with RegistryClient(addr) as reg:
        reg.get_ts()

        def loop(i: int, stop: threading.Event) -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                reg.get_ts()
                lat[i].append(time.perf_counter() - t0)

        elapsed = run_threads(threads, seconds, loop)
    flat = sorted(x for per in lat for x in per)
    return {"calls_per_s": len(flat) / elapsed, "p50_ms": percentile(flat, 0.5) * 1000,
            "p99_ms": percentile(flat, 0.99) * 1000}


def main(args: argparse.Namespace) -> int:
    from binlake.net import free_port
    from binlake.testing.etcdcluster import EtcdCluster

    if not EtcdCluster.available():
        print("binlake bench registry: etcd is not installed (apt-get install etcd-server)", file=sys.stderr)
        return 2
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="binlake-regbench-") as tmp:
        root = pathlib.Path(tmp)
        etcd = EtcdCluster(root / "etcd", 3).start()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        sqlite_addr = f"127.0.0.1:{free_port()}"
        try:
            addrs = [f"127.0.0.1:{free_port()}" for _ in range(3)]
            for a in addrs:
                procs[a] = _spawn_registry(["--store", etcd.url(), "--addr", a], root / f"reg-{a}.log")
            procs["sqlite"] = _spawn_registry(["--data-dir", str(root / "sqlite"), "--addr", sqlite_addr],
                                              root / "sqlite.log")
            _wait(",".join(addrs))
            _wait(sqlite_addr)
            group = ",".join(addrs)

            # TSO throughput, etcd leader vs SQLite registry, same run.
            etcd_tso = _tso_case(group, args.threads, args.seconds)
            sqlite_tso = _tso_case(sqlite_addr, args.threads, args.seconds)
            results["tso"] = {"etcd": etcd_tso, "sqlite": sqlite_tso,
                              "ratio": etcd_tso["calls_per_s"] / sqlite_tso["calls_per_s"]}

            # Failover: kill -9 the leader, time to the next TSO a client gets.
            from binlake.registry.client import RegistryClient

            times: list[float] = []
            rng = random.Random(2026)
            with RegistryClient(group) as reg:
                for _ in range(args.runs):
                    reg.get_ts()
                    leader = _leader(addrs)
                    t0 = time.monotonic()
                    os.killpg(procs[leader].pid, signal.SIGKILL)
                    procs[leader].wait()
                    reg.get_ts()
                    times.append(time.monotonic() - t0)
                    procs[leader] = _spawn_registry(["--store", etcd.url(), "--addr", leader],
                                                    root / f"reg-{leader}.log")
                    # The restarted member is back as a follower; then a random wait, so
                    # the next kill lands at a random point of the leader's keepalive
                    # cycle (a fixed wait would always kill right after a keepalive,
                    # the worst case, as the term starts when the failover ends).
                    time.sleep(2.0 + rng.uniform(0.0, 1.0))
            ordered = sorted(times)
            results["failover_s"] = {"runs": times, "p50": percentile(ordered, 0.5), "max": ordered[-1]}

            # A writer's registry calls per second through a failover.
            per_second: dict[int, int] = {}
            lock = threading.Lock()
            with RegistryClient(group) as reg:
                start = time.monotonic()

                def writer(i: int, stop: threading.Event) -> None:
                    while not stop.is_set():
                        reg.get_ts()
                        reg.get_ts()
                        second = int(time.monotonic() - start)
                        with lock:
                            per_second[second] = per_second.get(second, 0) + 1

                def killer() -> None:
                    time.sleep(3.0)
                    leader = _leader(addrs)
                    os.killpg(procs[leader].pid, signal.SIGKILL)
                    procs[leader].wait()

                k = threading.Thread(target=killer)
                k.start()
                run_threads(args.threads, 10.0, writer)
                k.join()
            results["writer_per_second"] = [per_second.get(s, 0) for s in range(10)]
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            etcd.stop()

    tso = results["tso"]
    fo = results["failover_s"]
    assert isinstance(tso, dict) and isinstance(fo, dict)
    print(f"## Registry group — `binlake bench registry --runs {args.runs} --seconds {args.seconds} "
          f"--threads {args.threads}`\n")
    print("| failover (kill -9 of the leader -> next TSO) | p50 s | max s | runs |")
    print("|---|---:|---:|---|")
    print(f"| 3 registries, 3 etcd members | {fo['p50']:.2f} | {fo['max']:.2f} | "
          f"{', '.join(f'{t:.2f}' for t in fo['runs'])} |\n")
    print(f"| TSO, {args.threads} threads | calls/s | p50 ms | p99 ms | ratio to SQLite |")
    print("|---|---:|---:|---:|---:|")
    for name in ("sqlite", "etcd"):
        r = tso[name]
        ratio = r["calls_per_s"] / tso["sqlite"]["calls_per_s"]
        print(f"| {name} | {r['calls_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {ratio:.2f} |")
    print(f"\nWriter transactions (two TSOs each) per second, leader killed at second 3: "
          f"{results['writer_per_second']}")
    print("\n" + json.dumps(results))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16)
    sys.exit(main(parser.parse_args()))
