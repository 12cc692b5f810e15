"""Reading rank 0's /progress endpoint from a real HTTP server on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from meshrun_operator.seen.progress import ProgressReader
from meshrun_operator.seen.views import PodView

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


async def read_once(reader: ProgressReader, pod: PodView) -> dict[str, object] | None:
    try:
        return await reader.read(pod)
    finally:
        await reader.close()


def test_progress_is_read_from_the_endpoint(server: int) -> None:
    reader = ProgressReader(enabled=True, port=server)
    assert asyncio.run(read_once(reader, pod0("127.0.0.1"))) == REPORT


def test_disabled_pending_or_unreachable_pods_give_none(server: int) -> None:
    async def scenario() -> None:
        assert await ProgressReader(False, port=server).read(pod0("127.0.0.1")) is None
        reader = ProgressReader(enabled=True, port=server)
        assert await reader.read(pod0("127.0.0.1", phase="Pending")) is None
        assert await reader.read(pod0(None)) is None
        refused = ProgressReader(enabled=True, port=free_port(), retry_after=60)
        assert await refused.read(pod0("127.0.0.1")) is None
        # Refused means "not listening yet": the next resync asks again and gets the report.
        refused.port = server
        assert await refused.read(pod0("127.0.0.1")) == REPORT
        await refused.close()

    asyncio.run(scenario())


def test_a_silent_pod_is_not_asked_again_for_a_while() -> None:
    # A socket that is listening but never answers: the request times out, like an
    # unroutable KWOK pod IP on a real network.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        reader = ProgressReader(
            enabled=True, timeout=0.2, retry_after=60, port=int(silent.getsockname()[1])
        )
        assert asyncio.run(read_once(reader, pod0("127.0.0.1"))) is None
        assert reader._failed_until.get("127.0.0.1", 0) > 0


def serve(reply: Callable[[socket.socket], None]) -> tuple[int, threading.Event]:
    """A one-connection TCP server on 127.0.0.1 that answers with ``reply``; the event is set
    when the client has gone (the reader gave up)."""
    listener = socket.create_server(("127.0.0.1", 0))
    gone = threading.Event()

    def run() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                with contextlib.suppress(OSError):
                    reply(connection)
                gone.set()

    threading.Thread(target=run, daemon=True).start()
    return int(listener.getsockname()[1]), gone


def dribble(connection: socket.socket) -> None:
    """Headers at once, then one byte of body every 0.1 s, for 30 s: every single read is
    quick, only the whole is slow."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    for _ in range(300):
        connection.sendall(b" ")
        time.sleep(0.1)


def flood(connection: socket.socket) -> None:
    """A well-formed, endless answer: no Content-Length, bytes as fast as they go."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    chunk = b"{" + b" " * 65535
    while True:
        connection.sendall(chunk)


@pytest.mark.parametrize(("reply", "limit_s"), [(dribble, 1.0), (flood, 5.0)])
def test_a_trainer_that_dribbles_or_floods_costs_one_bounded_read(
    reply: Callable[[socket.socket], None], limit_s: float
) -> None:
    port, gone = serve(reply)
    reader = ProgressReader(enabled=True, timeout=0.5, retry_after=60, port=port)
    started = time.monotonic()
    assert asyncio.run(read_once(reader, pod0("127.0.0.1"))) is None
    assert time.monotonic() - started < limit_s
    assert gone.wait(10), "the reader kept the connection open"
    assert reader._failed_until.get("127.0.0.1", 0) > time.monotonic()  # not asked again soon


class IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def test_an_ipv6_pod_ip_is_bracketed_in_the_url() -> None:
    httpd = IPv6Server(("::1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        reader = ProgressReader(enabled=True, port=int(httpd.server_address[1]))
        assert asyncio.run(read_once(reader, pod0("::1"))) == REPORT
    finally:
        httpd.shutdown()


def test_a_deep_answer_is_refused_and_the_pod_left_alone() -> None:
    deep = b'{"step": 3, "x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"

    def answer(connection: socket.socket) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(deep)}\r\n\r\n".encode()
        connection.sendall(head + deep)

    port, _ = serve(answer)
    reader = ProgressReader(enabled=True, timeout=2.0, retry_after=60, port=port)
    assert asyncio.run(read_once(reader, pod0("127.0.0.1"))) is None
    assert reader._failed_until.get("127.0.0.1", 0) > time.monotonic()  # not asked again soon
