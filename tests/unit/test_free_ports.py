"""Ports for the processes a stack starts are taken below the kernel's ephemeral range, where an outgoing
connection's local port can never take one between its choice and the process's bind."""

from __future__ import annotations

import socket

from gpusched_common.infra import processes


def test_a_free_port_is_below_the_ephemeral_range_and_free(monkeypatch):
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: 32_768)
    ports = [processes.free_port() for _ in range(20)]
    assert all(processes._LOWEST_PORT <= p < 32_768 for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # nothing listens there


def test_a_port_in_use_is_not_given(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        monkeypatch.setattr(processes.random, "randrange", lambda low, high: port)  # the only choice: in use
        given = processes.free_port()
        assert given != port  # after 50 refusals it falls back to a port the kernel picks


def test_without_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: processes._LOWEST_PORT + 10)
    assert processes.free_port() > 0
