"""Reading rank 0's /progress endpoint from a real HTTP server on this machine."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from meshrun_operator.observe import PodView
from meshrun_operator.progress import ProgressReader

pytestmark = pytest.mark.unit

REPORT = {
    "step": 12,
    "totalSteps": 20,
    "loss": 3.5,
    "tokensPerSecond": 900.0,
    "stepTimeSeconds": 0.25,
    "updatedAt": 1767225600.0,
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(REPORT).encode() if self.path == "/progress" else b""
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


def pod0(ip: str | None, phase: str = "Running") -> PodView:
    return PodView(name="job-0", index=0, attempt=0, phase=phase, pod_ip=ip)


def test_progress_is_read_from_the_endpoint(server: int) -> None:
    reader = ProgressReader(enabled=True, port=server)
    assert asyncio.run(reader.read(pod0("127.0.0.1"))) == REPORT


def test_disabled_pending_or_unreachable_pods_give_none(server: int) -> None:
    assert asyncio.run(ProgressReader(False, port=server).read(pod0("127.0.0.1"))) is None
    reader = ProgressReader(enabled=True, port=server)
    assert asyncio.run(reader.read(pod0("127.0.0.1", phase="Pending"))) is None
    assert asyncio.run(reader.read(pod0(None))) is None
    closed = ProgressReader(enabled=True, port=1, retry_after=60)
    assert asyncio.run(closed.read(pod0("127.0.0.1"))) is None
    # The failure is remembered: the next call does not even try.
    closed.port = server
    assert asyncio.run(closed.read(pod0("127.0.0.1"))) is None
