"""The engine's own UDP socket as a :class:`~erdmampi.nat.port.DatagramPort`.

STUN, TURN and ICE checks then use the very socket (and so the very NAT
bindings) that QUIC uses afterwards.  The engine demultiplexes what arrives
(docs/wire.md, "Demultiplexing"): this port sees STUN messages and whatever a
registered TURN server sends besides ChannelData of a channel bound to a
peer's relay tunnel; QUIC never reaches it.  It works before
``Engine.connect`` (the reading thread drives the socket itself until the
engine's progress thread runs).
"""
from __future__ import annotations

from erdmampi.nat.port import socket_families

__all__ = ["EnginePort"]


class EnginePort:
    """:class:`~erdmampi.nat.port.DatagramPort` over an :class:`erdmampi._engine.Engine`."""

    def __init__(self, engine):
        self.engine = engine

    def local_address(self) -> "tuple[str, int]":
        host, port = self.engine.local_addr.rsplit(":", 1)
        return host.strip("[]"), int(port)

    def send(self, data: bytes, addr: "tuple[str, int]") -> None:
        host = str(addr[0])
        if (6 if ":" in host else 4) not in socket_families(self.local_address()[0]):
            return  # the other address family: unreachable from this socket
        self.engine.raw_send(data, host, int(addr[1]))

    def recv(self, timeout: float) -> "tuple[bytes, tuple[str, int]] | None":
        got = self.engine.raw_recv(timeout)
        if got is None:
            return None
        data, host, port = got
        return data, (host, port)

    def add_turn_server(self, addr: "tuple[str, int]") -> None:
        """Tell the engine that datagrams from ``addr`` come from a TURN server
        (ChannelData from there is relay traffic): a TCP/TLS shim's address."""
        self.engine.add_turn_server(str(addr[0]), int(addr[1]))

    def close(self) -> None:
        """The engine owns the socket: nothing to close."""

    def __repr__(self):
        return f"EnginePort({self.local_address()})"
