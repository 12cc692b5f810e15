"""A TCP proxy in front of the API server that a test can freeze or cut.

The operator talks to the real API server through it (TLS passes through untouched): frozen, it
keeps every connection open and passes nothing, like an API server that accepts requests and
never answers; cut, it drops every connection and refuses new ones, like a network partition.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import urllib.parse
from pathlib import Path

import yaml


class ApiProxy:
    """Forwards 127.0.0.1:<port> to the API server of ``kubeconfig``."""

    def __init__(self, kubeconfig: str) -> None:
        self.original = yaml.safe_load(Path(kubeconfig).read_text())
        server = urllib.parse.urlsplit(self.original["clusters"][0]["cluster"]["server"])
        self.upstream = (server.hostname or "127.0.0.1", server.port or 443)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.passing = threading.Event()
        self.passing.set()
        self.refusing = False
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def kubeconfig(self, path: Path) -> str:
        """A copy of the kubeconfig that reaches the API server through this proxy (the API
        server's certificate names 127.0.0.1, so TLS still verifies)."""
        config = yaml.safe_load(yaml.safe_dump(self.original))
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return str(path)

    def freeze(self) -> None:
        """Keep the connections, pass nothing: requests wait for an answer that never comes."""
        self.passing.clear()

    def thaw(self) -> None:
        self.passing.set()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self.lock:
            self.refusing = True
            for sock in self.sockets:
                _close(sock)
            self.sockets.clear()

    def restore(self) -> None:
        with self.lock:
            self.refusing = False

    def close(self) -> None:
        self.cut()
        _close(self.listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.refusing:
                    _close(client)
                    continue
                try:
                    server = socket.create_connection(self.upstream, timeout=5)
                except OSError:
                    _close(client)
                    continue
                server.settimeout(None)
                self.sockets.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self.passing.wait()
                readable, _, _ = select.select([src], [], [], 0.1)
                if not readable or not self.passing.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        _close(src)
        _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
