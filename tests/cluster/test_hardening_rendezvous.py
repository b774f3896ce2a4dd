"""Rank 0's rendezvous store listens on the cluster address it was given, not on every interface."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on ``port`` (Linux /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux /proc/net")
def test_rank0_store_binds_only_the_given_address() -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from nbtoolkit.cluster.rank_actor import _rendezvous_store

    port = _free_port()
    store = _rendezvous_store("127.0.0.1", port, 0, 1, 30.0)
    store.set("probe", "1")
    assert store.get("probe") == b"1"
    assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 in /proc's byte order

    # What torch does by itself: the same call without a listening socket binds every interface
    # (that is what the helper avoids; if torch ever changes this, the helper can go).
    other = _free_port()
    default = dist.TCPStore("127.0.0.1", other, 1, is_master=True, timeout=timedelta(seconds=30))
    wildcard = {"00000000", "00000000000000000000000000000000"}
    assert _listening_addresses(other) & wildcard, _listening_addresses(other)
    del default, store
