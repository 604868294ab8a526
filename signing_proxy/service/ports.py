"""``run --workers N``: the ports an instance serves are its own, never shared with another instance.

Every listener of a ``--workers`` instance carries SO_REUSEPORT, which lets any process of the same
user bind beside it: a second instance on the same address would be given a share of the clients.
The parent probes each address as a single process binds it (``refuse_shared``: EADDRINUSE when
anything listens there) and then holds it for its life with a bound, never listening socket
(``reserve_port``, ``reserve_addresses``) that its own workers bind beside and another instance's
probe does not (``_hold``), so no worker need be listening for the address to be held.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["refuse_shared", "reserve_addresses", "reserve_port"]


def refuse_shared(host: str, port: int) -> None:
    """Bind ``host:port`` once without SO_REUSEPORT, as a single process does, and let go: OSError
    (EADDRINUSE) when anything listens there. Another ``run --workers`` instance's sockets carry
    SO_REUSEPORT, so ours bound beside them without an error, and the kernel balanced clients between
    two configurations and key stores. SO_REUSEADDR, as every listener here: the connections of an
    instance stopped a moment ago (TIME_WAIT) hold no port. Port 0 is a new port: nothing to check."""
    if port == 0:
        return
    for family, kind, proto, _name, address in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    ):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio binds it: the IPv6 address only
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """Bind (without listening) a SO_REUSEPORT socket; workers bind the same port beside it, and a
    port of 0 is resolved here, once (``_hold``: no other instance binds it meanwhile)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = _hold(family, (host, port))
    return sock, int(sock.getsockname()[1])


def reserve_addresses(host: str, port: int) -> list[socket.socket]:
    """``reserve_port`` on each address ``host:port`` names (a fixed port), as ``refuse_shared``
    probes them and a worker binds them: ``publish.listen`` and ``admin.listen`` were held by the
    workers' listeners alone, and another instance's probe passed while none of ours listened."""
    held: list[socket.socket] = []
    try:
        for family, _kind, _proto, _name, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            held.append(_hold(family, address, v6only=family == socket.AF_INET6))
    except OSError:
        for sock in held:
            sock.close()
        raise
    return held


def _hold(family: int, address: tuple[Any, ...], *, v6only: bool = False) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket: the workers' listeners bind beside it (same user).
    SO_REUSEADDR is set for the bind (an instance stopped a moment ago leaves connections in
    TIME_WAIT) and cleared after it: left set, another instance's probe (``refuse_shared``, which
    sets it too) bound beside this socket whenever no worker of ours listened (starting, or every
    one restarting), and both instances then served the port."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if v6only:  # as asyncio binds it: the IPv6 address only
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except OSError:
        sock.close()
        raise
    return sock
