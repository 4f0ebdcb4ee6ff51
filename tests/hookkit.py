"""A local alert webhook for the tests of binlake's alerts (the ingest DAG's deadline
alert, the drill DAG's failure callback): a real HTTP server on loopback port 0 that
collects the JSON bodies POSTed to it, as Slack's or Mattermost's incoming webhook
would receive them.

A module of its own (not conftest.py) so test modules in any directory can import it.
"""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class Webhook:
    """A local HTTP endpoint collecting the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                bodies.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
