"""Loopback ports for the servers the demo and the tests start (etcd, kube-apiserver, ...)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port :func:`free_port` draws from.
PORT_FLOOR = 10000


def _ephemeral_floor() -> int:
    """The lowest port the kernel gives outgoing connections (Linux), else 32768."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port for a server that is about to be started.

    The port is drawn at random *below* the kernel's ephemeral range, and
    checked by binding it. A port the kernel hands out (``bind(0)``) comes from
    the range that every outgoing connection on the machine also draws from,
    so between the check and the server's own bind a client socket of another
    process (a parallel test group, the scheduler's watch) could take it: etcd
    then died with "address already in use". Below the range only another
    server can take it, and a random draw makes two parallel start-ups meeting
    on one port unlikely (1 in ~20,000). When the range starts too low to leave
    room, the kernel's choice is used.
    """
    ceiling = _ephemeral_floor() - 1
    rng = random.SystemRandom()
    if ceiling - PORT_FLOOR >= 1000:
        for _ in range(100):
            port = rng.randint(PORT_FLOOR, ceiling)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
