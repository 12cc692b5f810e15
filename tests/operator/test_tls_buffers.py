"""The operator's TLS connections read through 16 KiB buffers, not asyncio's 256 KiB."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ssl

import pytest
from meshrun_operator.client.rest import TLS_READ_BUFFER, smaller_tls_buffers

pytestmark = pytest.mark.unit


def new_protocol() -> asyncio.sslproto.SSLProtocol:
    loop = asyncio.new_event_loop()
    try:
        context = ssl.create_default_context()
        return asyncio.sslproto.SSLProtocol(loop, asyncio.Protocol(), context, None)
    finally:
        loop.close()


def test_new_tls_connections_read_through_the_smaller_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # monkeypatch puts asyncio's own size back after the test.
    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size", 256 * 1024)
    assert len(new_protocol()._ssl_buffer) == 256 * 1024
    smaller_tls_buffers()
    assert len(new_protocol()._ssl_buffer) == TLS_READ_BUFFER == 16 * 1024
    # It never grows a buffer that is already smaller.
    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size", 4 * 1024)
    smaller_tls_buffers()
    assert asyncio.sslproto.SSLProtocol.max_size == 4 * 1024
