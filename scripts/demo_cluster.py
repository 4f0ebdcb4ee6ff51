"""Demo act: the registry across hosts. Three hosts (network namespaces on a
bridge, or loopback addresses where namespaces cannot be made) each run an etcd
member and a registry; the act shows `binlake ctl registry`, kills the leader
with -9, partitions the next one, and shows a client's TSOs going on, above
everything handed out before.

Run as root: ``python scripts/demo_cluster.py`` (about 30 s).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from binlake.registry.client import RegistryClient
from binlake.testing.etcdcluster import EtcdCluster
from binlake.testing.netbed import NetBed


def say(msg: str) -> None:
    print(f"[demo-cluster] {msg}", flush=True)


def ctl_registry(addrs: str) -> None:
    subprocess.run([sys.executable, "-m", "binlake.cli", "ctl", "registry", "--registry", addrs], check=False)


def leader_of(reg: RegistryClient) -> str:
    for a in reg.addrs:
        try:
            if reg.member(a, timeout_s=0.5).leader:
                return a
        except Exception:  # an unreachable member is simply not the leader
            continue
    return ""


def main() -> int:
    if not EtcdCluster.available():
        say("etcd is not installed (apt-get install etcd-server)")
        return 2
    why = NetBed.probe()
    if why:
        say(f"no network namespaces here ({why}); hosts are loopback addresses, so no partition round")
    with tempfile.TemporaryDirectory(prefix="binlake-demo-cluster-") as tmp, NetBed(3, loopback=bool(why)) as bed:
        etcd = EtcdCluster(f"{tmp}/etcd", 3, hosts=[h.addr for h in bed.hosts] if not why else None,
                           wraps=[h.wrap for h in bed.hosts] if not why else None).start()
        try:
            port = 8230
            addrs = [f"{h.addr}:{port}" for h in bed.hosts]
            procs = {a: h.spawn([sys.executable, "-m", "binlake.cli", "registry", "--store", etcd.url(), "--addr", a],
                                pathlib.Path(tmp) / f"registry-{h.name}.log")
                     for a, h in zip(addrs, bed.hosts, strict=True)}
            group = ",".join(addrs)
            with RegistryClient(group) as reg:
                first = reg.get_ts()
                say(f"three registries on {group}; a client got TSO {first}")
                ctl_registry(group)
                leader = leader_of(reg)
                say(f"kill -9 the leader {leader}")
                t0 = time.monotonic()
                os.killpg(procs[leader].pid, signal.SIGKILL)
                ts = reg.get_ts()
                say(f"the client got TSO {ts} from {reg.leader} {time.monotonic() - t0:.2f} s later "
                    f"({'above' if ts > first else 'NOT above'} every earlier one)")
                if not why:
                    cut = next(h for h in bed.hosts if f"{h.addr}:{port}" == reg.leader)
                    say(f"partition {cut.name} (the new leader's host) beyond the 3 s lease")
                    bed.partition(cut.name)
                    t0 = time.monotonic()
                    ts2 = reg.get_ts()
                    say(f"the client got TSO {ts2} from {reg.leader} {time.monotonic() - t0:.2f} s later")
                    bed.heal(cut.name)
                    time.sleep(1.0)
                ctl_registry(group)
        finally:
            etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
