"""The I/O boundary of the NAT code: a datagram port.

STUN, TURN and ICE code send and receive through a :class:`DatagramPort` and
never touch sockets.  Two implementations:

* :class:`SocketPort` -- a plain UDP socket (tests, tools, and ranks before the
  engine exists);
* ``EnginePort`` (written against this contract elsewhere) -- the engine's UDP
  socket, shared with QUIC: ``Engine.raw_send(data, host, port)`` and
  ``Engine.raw_recv(timeout)``; the engine hands it every STUN message and every
  datagram from a registered TURN server that is not ChannelData of a bound
  channel.

A port has one reader at a time: callers serialise ``recv`` themselves (the
agent owns the port while it runs; :meth:`erdmampi.nat.turn.TurnClient.maintain`
reads it afterwards, from one thread).
"""
from __future__ import annotations

import socket
import time
from typing import Protocol, runtime_checkable

__all__ = ["DatagramPort", "SocketPort", "Addr", "route_source", "socket_families"]

Addr = "tuple[str, int]"


def route_source(host: str, port: int) -> "str | None":
    """The local address the kernel would use toward ``host:port`` (a name
    or an address; no packet is sent), or None if nothing routes there."""
    try:
        fam, _, _, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return None


def socket_families(host: str) -> "set[int]":
    """The address families a UDP socket bound to ``host`` reaches: both for
    "::" (a dual-stack socket), else the address's own."""
    if host in ("::", ""):
        return {4, 6}
    return {6} if ":" in host else {4}


@runtime_checkable
class DatagramPort(Protocol):
    """What the NAT code needs from a UDP endpoint."""

    def local_address(self) -> "tuple[str, int]":
        """The bound (host, port); host may be ``0.0.0.0`` for a wildcard bind."""

    def send(self, data: bytes, addr: "tuple[str, int]") -> None:
        """Send one datagram to ``addr``; errors of an unreachable network are
        swallowed (UDP gives no delivery guarantee anyway)."""

    def recv(self, timeout: float) -> "tuple[bytes, tuple[str, int]] | None":
        """The next datagram and its source, or None when ``timeout`` seconds
        passed without one."""


class SocketPort:
    """A :class:`DatagramPort` over a plain UDP socket bound to ``(host, port)``
    (port 0: any free port), or over an existing socket (``sock=``, e.g. one made
    inside a network namespace)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0, *, sock: "socket.socket | None" = None,
                 rcvbuf: int = 1 << 20):
        if sock is None:
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(fam, socket.SOCK_DGRAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
                sock.bind((host, int(port)))
            except OSError:
                sock.close()
                raise
        elif sock.type != socket.SOCK_DGRAM:
            raise ValueError("SocketPort needs a UDP (SOCK_DGRAM) socket")
        self.sock = sock
        self._closed = False

    def local_address(self) -> "tuple[str, int]":
        h, p = self.sock.getsockname()[:2]
        return h, p

    def send(self, data: bytes, addr: "tuple[str, int]") -> None:
        try:
            self.sock.sendto(data, (addr[0], int(addr[1])))
        except (BlockingIOError, InterruptedError):
            pass                                    # a full buffer is a lost datagram
        except OSError as e:
            # EHOSTUNREACH/ENETUNREACH/ECONNREFUSED (ICMP of an earlier send): a
            # candidate that does not work, as far as a connectivity check cares
            if e.errno not in _TRANSIENT:
                raise

    def recv(self, timeout: float) -> "tuple[bytes, tuple[str, int]] | None":
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                left = 0.0
            self.sock.settimeout(left if left > 0 else 0.0)
            try:
                data, addr = self.sock.recvfrom(65536)
                return data, (addr[0], addr[1])
            except (socket.timeout, BlockingIOError):
                return None
            except OSError as e:
                if e.errno not in _TRANSIENT or time.monotonic() >= deadline:
                    if e.errno in _TRANSIENT:
                        return None
                    raise

    def close(self):
        if not self._closed:
            self._closed = True
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"SocketPort({self.local_address() if not self._closed else 'closed'})"


import errno as _errno  # noqa: E402

_TRANSIENT = {_errno.EHOSTUNREACH, _errno.ENETUNREACH, _errno.ECONNREFUSED, _errno.EPERM,
              _errno.EHOSTDOWN, _errno.ENETDOWN}
