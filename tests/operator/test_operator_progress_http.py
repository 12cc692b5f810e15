"""Reading rank 0's /progress endpoint from a real HTTP server on this machine."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from meshrun_operator.observe import PodView
from meshrun_operator.progress import ProgressReader

from meshrun.localnet import free_port

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
    refused = ProgressReader(enabled=True, port=free_port(), retry_after=60)
    assert asyncio.run(refused.read(pod0("127.0.0.1"))) is None
    # Refused means "not listening yet": the next resync asks again and gets the report.
    refused.port = server
    assert asyncio.run(refused.read(pod0("127.0.0.1"))) == REPORT


def test_a_silent_pod_is_not_asked_again_for_a_while() -> None:
    # A socket that is listening but never answers: the request times out, like an
    # unroutable KWOK pod IP on a real network.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        reader = ProgressReader(
            enabled=True, timeout=0.2, retry_after=60, port=int(silent.getsockname()[1])
        )
        assert asyncio.run(reader.read(pod0("127.0.0.1"))) is None
        assert reader._failed_until.get("127.0.0.1", 0) > 0
