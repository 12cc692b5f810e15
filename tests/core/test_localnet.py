"""Ports that runs and tests pick for themselves stay out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from meshrun.localnet import NODE_PORTS, chosen_ranges, ephemeral_range, free_port

pytestmark = pytest.mark.unit


def test_picked_ports_are_outside_the_ephemeral_and_node_port_ranges_and_bindable() -> None:
    low, high = ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert not low <= port <= high
        assert not NODE_PORTS[0] <= port <= NODE_PORTS[1]
        assert port >= 1024
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held, socket.socket() as probe:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
        probe.close()
        # Only the held port and one free one to choose from: the held one is skipped.
        monkeypatch.setattr(
            "meshrun.localnet.chosen_ranges",
            lambda _eph: [range(taken, taken + 1), range(free, free + 1)],
        )
        picks = {free_port() for _ in range(20)}
    assert taken not in picks


def test_the_ranges_follow_the_kernels_setting(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("32768\t60999\n")
    assert ephemeral_range(setting) == (32768, 60999)
    assert chosen_ranges((32768, 60999)) == [range(20000, 30000), range(61000, 65536)]
    # A range that starts low leaves the ports between the NodePorts and its own start.
    assert chosen_ranges((40000, 65535)) == [range(20000, 30000), range(32768, 40000)]
    # One that covers everything leaves nothing: free_port falls back to the kernel's choice.
    assert chosen_ranges((1024, 65535)) == []
    setting.write_text("garbage")
    assert ephemeral_range(setting) == (32768, 60999)
