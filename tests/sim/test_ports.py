"""free_port: servers' ports come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from sdcdev.sim import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    floor = ports._ephemeral_floor()
    drawn = {ports.free_port() for _ in range(50)}
    assert all(ports.PORT_FLOOR <= p < floor for p in drawn), sorted(drawn)
    assert len(drawn) > 40  # a random draw, not a counter or one fixed port
    for port in list(drawn)[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_a_server_holds_is_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # A range of one port that is taken, and one that is free, above it.
        monkeypatch.setattr(ports, "PORT_FLOOR", taken)
        monkeypatch.setattr(ports, "_ephemeral_floor", lambda: taken + 1001)
        drawn = {ports.free_port() for _ in range(30)}
    assert taken not in drawn


def test_a_range_with_no_room_below_it_falls_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel_floor = ports._ephemeral_floor()
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: ports.PORT_FLOOR + 10)
    port = ports.free_port()
    assert port >= kernel_floor  # the kernel's choice: no draw from a 10-port range
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
