"""No test reaches outside the machine: connections and name look-ups beyond loopback are refused and recorded.

``install`` patches the socket module for the test process: ``socket.socket.connect`` / ``connect_ex`` (which
``socket.create_connection``, http.client, urllib3, requests and asyncio all go through) and ``socket.getaddrinfo``
(a name look-up for a public host is itself traffic off the machine). A refused attempt raises ``OSError`` where it
was made, as an unreachable network would, so the code under test takes its failure path; and it is recorded, so the
test that made it fails even when a background thread swallowed the error (the conftest fixture checks after each
test). Loopback, the unspecified address (which means this host), ``localhost`` and Unix sockets are allowed.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from typing import Any

LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class NetworkRefused(ConnectionRefusedError):
    """A test tried to reach a host that is not this machine."""


_attempts: list[str] = []
_lock = threading.Lock()


def is_local(host: Any) -> bool:
    """Whether ``host`` (an address literal or a name) is this machine."""
    if host is None or host == "":
        return True  # getaddrinfo(None, port): the local wildcard address
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%", 1)[0].rstrip(".").lower()
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # any other name would need a look-up off the machine
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    return address.is_loopback or address.is_unspecified


def _refuse(what: str) -> NetworkRefused:
    with _lock:
        _attempts.append(what)
    return NetworkRefused(f"tests may not reach outside the machine: {what}")


def take_attempts() -> list[str]:
    """The refused attempts since the last call, cleared."""
    with _lock:
        taken = list(_attempts)
        _attempts.clear()
    return taken


def _guarded_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    def connect(self: socket.socket, address: Any, *args: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and address:
            if not is_local(address[0]):
                raise _refuse(f"connect to {address[0]}:{address[1] if len(address) > 1 else '?'}")
        return original(self, address, *args)

    return connect


def _guarded_getaddrinfo(original: Callable[..., Any]) -> Callable[..., Any]:
    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_local(host):
            raise socket.gaierror(socket.EAI_NONAME, str(_refuse(f"name look-up of {host}")))
        return original(host, *args, **kwargs)

    return getaddrinfo


_installed = False


def install() -> None:
    """Guard the socket module of this process (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    socket.socket.connect = _guarded_connect(socket.socket.connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect(socket.socket.connect_ex)  # type: ignore[method-assign]
    socket.getaddrinfo = _guarded_getaddrinfo(socket.getaddrinfo)
