"""The local machine's network, for runs and tests on one host.

Ports that a run or a test picks for itself (a rendezvous, a metrics or health endpoint) come
from outside the kernel's ephemeral range. That range is where every socket bound to port 0 and
every outgoing connection gets its port: gloo's pair listeners, the TCPStore's clients, the
HTTP clients of the operator. A port picked by binding to 0 and released at once can be taken
by one of those before its owner listens, and a health poll aimed at it then feeds HTTP to a
trainer's gloo socket (a broken pipe, an aborted rank, a rendezvous that never completes).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default when /proc cannot be read.
DEFAULT_EPHEMERAL = (32768, 60999)
# Kubernetes' NodePort range: kube-proxy may hold these on a node.
NODE_PORTS = (30000, 32767)
# Below this, ports are the usual homes of well-known services (kubelet 10250, etcd 2379, ...).
LOWEST = 20000
_ATTEMPTS = 200


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range, both ends included."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def chosen_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """The ranges a picked port comes from: at or above LOWEST, outside the ephemeral range and
    the NodePort range. Empty when the ephemeral range leaves no room (the caller then falls
    back to the kernel's choice)."""
    taken = sorted([ephemeral, NODE_PORTS])
    ranges: list[range] = []
    start = LOWEST
    for low, high in taken:
        if low > start:
            ranges.append(range(start, low))
        start = max(start, high + 1)
    if start <= 65535:
        ranges.append(range(start, 65536))
    return [r for r in ranges if len(r) >= 100]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the kernel's
    ephemeral range (random, checked by a bind)."""
    ranges = chosen_ranges(ephemeral_range())
    if ranges:
        weights = [len(r) for r in ranges]
        for _ in range(_ATTEMPTS):
            port = random.choice(random.choices(ranges, weights)[0])
            if _bindable(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
