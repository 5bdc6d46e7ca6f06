"""A minimal inference replica, standard library only: what a `service` job runs.

Listens on $AISCHED_SERVICE_HOST:$AISCHED_SERVICE_PORT (the scheduler picks both: the port,
and its node's address, loopback on one machine). `GET /healthz`
answers 200 once serving (the readiness check); `GET /metrics` answers `{"rps": N}`, the
requests per second this replica served over the last few seconds (the autoscaler scrapes
it); any other path is a "request" and answers `ok`. SIGTERM stops it cleanly.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WINDOW_S = 2.0
served: collections.deque[float] = collections.deque()
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        now = time.monotonic()
        with lock:
            while served and now - served[0] > WINDOW_S:
                served.popleft()
            if self.path == "/metrics":
                body = json.dumps({"rps": len(served) / WINDOW_S}).encode()
            elif self.path == "/healthz":
                body = b"ready"
            else:
                served.append(now)
                body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per request would flood the job's log


def main() -> None:
    host = os.environ.get("AISCHED_SERVICE_HOST", "127.0.0.1")
    server = ThreadingHTTPServer((host, int(os.environ["AISCHED_SERVICE_PORT"])), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"serving on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
