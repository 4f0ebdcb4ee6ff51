"""Demo act: back up an existing MariaDB with no application changes.

A MariaDB server with its binlog on (ROW, full images) plays an application's
database; ``binlake source mysql`` follows it as a replica and writes every
transaction to the demo's Pumps. The application writes plain SQL (inserts,
updates, a primary-key change, DDL in the middle); the source is killed with
-9 half way and restarted. At the end, the rows rebuilt from the Pumps'
binlogs alone must equal the server's tables (checksums), with every upstream
transaction served exactly once. Skipped with a message when MariaDB is not
installed.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

BINLAKE = pathlib.Path(sys.executable).parent / "binlake"


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _sql(port: int, *stmts: str) -> list[Any]:
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True, database="shop")
    out: list[Any] = []
    try:
        with conn.cursor() as cur:
            for s in stmts:
                cur.execute(s)
                out = list(cur.fetchall())
    finally:
        conn.close()
    return out


def _position(data_dir: pathlib.Path) -> tuple[str, int]:
    try:
        pos = json.loads((data_dir / "state.json").read_text()).get("position") or ["", 0]
    except (OSError, ValueError):
        return "", 0
    return str(pos[0]), int(pos[1])


def act_sources(cluster: Any, root: pathlib.Path) -> int:
    from binlake.client.reader import pull_window
    from binlake.registry.client import RegistryClient
    from binlake.source.replay import Replay
    from binlake.sql import checksum
    from binlake.stack.localdb import LocalMariaDB

    if not LocalMariaDB.available():
        _say("act 6 skipped: MariaDB is not installed (apt-get install mariadb-server)")
        return 0
    _say("act 6: back up an existing MariaDB (binlog_format=ROW) with `binlake source mysql`")
    server = LocalMariaDB(root / "mariadb-upstream", binlog=True).start()
    port = server.port
    data = root / "source-mysql"
    log = root / "source-mysql.log"
    procs: list[subprocess.Popen[bytes]] = []

    def start_source() -> subprocess.Popen[bytes]:
        with log.open("ab") as f:
            p = subprocess.Popen([str(BINLAKE), "source", "mysql", "--dsn", f"mysql://root@127.0.0.1:{port}",
                                  "--server-id", "901", "--registry", cluster.registry_addr, "--data-dir", str(data),
                                  "--tables", "shop.*"], stdout=f, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(p)
        return p

    try:
        server.create_database("shop")
        _sql(port, "CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(40), total DECIMAL(12,2))")
        # The acts before this one wrote their own binlogs; this act reads from here on.
        with RegistryClient(cluster.registry_addr) as reg:
            begin_ts = reg.get_ts()
        src = start_source()
        while _position(data)[0] == "":
            time.sleep(0.1)
        txns = 0
        for i in range(1, 41):
            _sql(port, "BEGIN", f"INSERT INTO orders (id, customer, total) VALUES ({i}, 'c{i % 7}', {i}.50)",
                 f"UPDATE orders SET total = total + 1 WHERE id = {max(1, i - 3)}", "COMMIT")
            txns += 1
            if i == 20:
                _sql(port, "ALTER TABLE orders ADD COLUMN status ENUM('new','paid') NULL")
                src.send_signal(signal.SIGKILL)
                src.wait()
                _say("  source killed with -9 after 20 transactions and a DDL; restarting it")
                src = start_source()
        _sql(port, "UPDATE orders SET id = 100, status = 'paid' WHERE id = 1")
        txns += 1
        end = _sql(port, "SHOW MASTER STATUS")[0]
        deadline = time.monotonic() + 120
        while _position(data) < (str(end[0]), int(end[1])):
            if time.monotonic() > deadline or src.poll() is not None:
                _say(f"FAILED: the source did not catch up; log {log}")
                return 1
            time.sleep(0.1)
        src.send_signal(signal.SIGTERM)
        src.wait(30)
        with RegistryClient(cluster.registry_addr) as reg:
            end_ts = reg.get_ts()
        mine = list(pull_window(cluster.pump_addrs, begin_ts, end_ts, wait=True, wait_timeout_s=60))
        replay = Replay().apply(mine)
        up = checksum.checksum(server.url_for("shop"), schema=replay.schema())
        dml = sum(1 for b in mine if not b.ddl_query)
        ok = replay.checksums() == up and dml == txns
        print(f"  upstream transactions: {txns}; served by the Pumps (after the duplicate rule): {dml}; "
              f"DDL binlogs: {sum(1 for b in mine if b.ddl_query)}")
        print(f"  orders: upstream {up.get('orders')}, rebuilt from binlogs {replay.checksums().get('orders')}")
        print("VERDICT (act 6):", "PASS - the source backed up the MariaDB through a kill -9: every transaction "
              "exactly once, rows equal" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()

