"""What the autoscaler reads off a replica's metrics page: JSON or the Prometheus text format."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from aisched.service.autoscaler import MetricError, http_get, parse_scrape

PAGES: list[tuple[str, bytes, dict[str, float]]] = [
    ("json", b'{"rps": 12.5}', {"rps": 12.5}),
    ("json both", b'{"rps": 3, "latency_ms": 80}', {"rps": 3.0, "latency_ms": 80.0}),
    ("prometheus gauge", b"# TYPE rps gauge\nrps 7.5\n", {"rps": 7.5}),
    (
        "prometheus labels: rps summed, latency averaged",
        b'rps{route="/a"} 2\nrps{route="/b"} 3\nlatency_ms{route="/a"} 100\n'
        b'latency_ms{route="/b"} 50\n',
        {"rps": 5.0, "latency_ms": 75.0},
    ),
    (
        "other metrics ignored",
        b"# TYPE http_requests_total counter\nhttp_requests_total 9000\nlatency_ms 40\n",
        {"latency_ms": 40.0},
    ),
]


@pytest.mark.parametrize(
    ("body", "figures"), [(b, f) for _, b, f in PAGES], ids=[n for n, *_ in PAGES]
)
def test_a_metrics_page_gives_its_figures(body: bytes, figures: dict[str, float]) -> None:
    assert parse_scrape(body) == figures


BAD: list[tuple[str, bytes, str]] = [
    ("no figure of ours", b"http_requests_total 9000\n", "no JSON object and no Prometheus"),
    ("negative", b"rps -1\n", "rps: expected a number of at least 0"),
    ("unknown json name", b'{"qps": 1}', "qps: unknown metric"),
]


@pytest.mark.parametrize(("body", "message"), [(b, m) for _, b, m in BAD], ids=[n for n, *_ in BAD])
def test_a_page_without_a_usable_figure_says_why(body: bytes, message: str) -> None:
    with pytest.raises(MetricError, match=message):
        parse_scrape(body)


@pytest.fixture
def exporter() -> Iterator[tuple[int, Gauge]]:
    """A replica's metrics endpoint as model servers serve it: prometheus_client's exposition."""
    registry = CollectorRegistry()
    rps = Gauge("rps", "requests per second", registry=registry)
    Counter("requests", "requests served", registry=registry).inc(10)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], rps
    finally:
        server.shutdown()
        server.server_close()


def test_a_prometheus_exporter_is_read_over_http(exporter: tuple[int, Gauge]) -> None:
    port, rps = exporter
    rps.set(4.25)
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", 5.0)
    assert status == 200
    assert parse_scrape(body) == {"rps": 4.25}


@pytest.fixture
def dripping() -> Iterator[int]:
    """A replica that answers its metrics page a byte at a time, each byte well within a
    read's timeout, for far longer than the probe's timeout."""
    page = b'{"rps": 1}' + b" " * 60
    head = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(page)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                self.wfile.write(head)
                for i in range(len(page)):
                    self.wfile.write(page[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:  # the autoscaler hung up: what a bounded fetch does
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_dripped_past_the_timeout_is_not_waited_for(dripping: int) -> None:
    # Each byte comes 0.1 s after the last, within a read's 0.5 s, but the page would take
    # 7 s: the autoscaler, one thread for every user's services, gives up at 0.5 s in all.
    assert http_get(f"http://127.0.0.1:{dripping}/metrics", 0.5) == (0, b"")


def test_a_metrics_path_with_a_query_is_asked_for_whole() -> None:
    # Model servers often choose the format by a query: `/metrics?format=json`.
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert http_get(f"http://127.0.0.1:{port}/metrics?format=json", 5.0) == (200, b"{}")
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/metrics?format=json"]
