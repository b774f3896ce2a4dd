"""On each rank: the TCP connections between rank processes, and cutting them to free a blocked rank.

Why: a rank blocked in a gloo collective whose peers stopped waits until a peer's connection
closes. Destroying the process group on the peers closes those connections only when the last
reference to the group goes away, and a DDP model (its C++ reducer), a DeepSpeed engine or an
FSDP2 model holds one: the connections then stay open and the blocked rank waits for the
collective timeout (measured with DDP: 10 s until the peer process exited, not at once).
Gloo's own ``abort()`` and ``shutdown()`` leave the connections open too (torch 2.13).

So the notebook cuts them at the socket: every rank lists the local endpoints of its TCP
sockets (:func:`tcp_endpoints`), and each rank shuts down (``shutdown(SHUT_RDWR)``, which
acts on the connection whoever holds its descriptor) its connections to another rank's
endpoint (:func:`sever`): gloo sees "Connection closed by peer" on both sides and the blocked
collective raises at once. The rendezvous store's connections (the master endpoint) are
left alone; Ray's own connections never join two rank processes (the ranks call only the
notebook and the raylet), so they are untouched.

Linux only (``/proc/self/fd`` and ``/proc/net/tcp``); elsewhere nothing is listed or cut and
the notebook falls back to destroying the group. Imports neither torch nor ray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct

__all__ = ["Endpoint", "sever", "tcp_connections", "tcp_endpoints"]

Endpoint = tuple[str, int]  # (ip, port)

_LISTEN = "0A"  # /proc/net/tcp state of a listening socket


def _ip(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} (32-bit words in host byte order) as text."""
    raw = b"".join(
        struct.pack("=I", int(hex_address[i : i + 8], 16)) for i in range(0, len(hex_address), 8)
    )
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    text = socket.inet_ntop(socket.AF_INET6, raw)
    return text.removeprefix("::ffff:") if text.startswith("::ffff:") and "." in text else text


def _endpoint(field: str) -> Endpoint:
    address, port = field.split(":")
    return _ip(address), int(port, 16)


def _socket_inodes() -> dict[int, int]:
    """inode -> descriptor of this process's sockets."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if link.startswith("socket:["):
                    found[int(link[8:-1])] = int(name)
    return found


def tcp_connections() -> list[tuple[int, Endpoint, Endpoint, bool]]:
    """(descriptor, local endpoint, remote endpoint, listening) of each TCP socket of this process."""
    inodes = _socket_inodes()
    rows = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)  # the header
            for line in lines:
                fields = line.split()
                if len(fields) < 10 or not fields[9].isdigit():
                    continue
                fd = inodes.get(int(fields[9]))
                if fd is None:
                    continue
                with contextlib.suppress(ValueError):
                    rows.append((fd, _endpoint(fields[1]), _endpoint(fields[2]), fields[3] == _LISTEN))
    return rows


def tcp_endpoints() -> list[Endpoint]:
    """The local endpoints of this process's TCP sockets (what peers see as their remote end)."""
    return sorted({local for _fd, local, _remote, _listening in tcp_connections()})


def sever(peers: list[Endpoint], keep: list[Endpoint]) -> int:
    """Shut down this process's TCP connections to any of ``peers``, except those touching ``keep``.

    Returns how many were shut down. The descriptor stays open (its owner closes it); only the
    connection ends, so a thread blocked on it wakes with an error.
    """
    wanted, kept = {tuple(p) for p in peers}, {tuple(k) for k in keep}
    inodes = {fd: inode for inode, fd in _socket_inodes().items()}
    cut = 0
    for fd, local, remote, listening in tcp_connections():
        if listening or remote not in wanted or local in kept or remote in kept:
            continue
        with contextlib.suppress(OSError):
            copy = os.dup(fd)
            try:
                if os.fstat(copy).st_ino != inodes.get(fd):  # the descriptor was reused meanwhile
                    continue
                with socket.socket(fileno=copy) as sock:
                    copy = -1  # the socket object owns (and closes) the duplicate now
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
            finally:
                if copy >= 0:
                    os.close(copy)
    return cut
