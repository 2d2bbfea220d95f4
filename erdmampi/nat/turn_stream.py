"""TURN over TCP and TLS for a UDP-only client: a local datagram <-> stream shim.

A site whose network drops all UDP still reaches a TURN server over TCP (or
TLS over TCP, usually on port 443) and gets a UDP *relayed* address that its
peers send to (RFC 8656: the client-to-server leg is TCP or TLS, the relayed
leg stays UDP).  The engine and :class:`~erdmampi.nat.turn.TurnClient` only
speak datagrams, so :class:`TurnStreamShim` stands in for the server:

* it binds a UDP socket on this host (:attr:`TurnStreamShim.address`, on
  loopback by default: unreachable from other hosts) that the client treats as the TURN server (``TurnClient(port, shim.address, ...)``,
  ``Engine.add_turn_server(*shim.address)``);
* every datagram the client sends there (a STUN message or ChannelData) goes
  to the real server over one TCP/TLS connection, framed as RFC 8656 section 12.5
  asks: STUN messages are delimited by their length field, ChannelData is
  padded to a multiple of 4 bytes;
* every message read from the stream goes back to the client as one datagram
  (ChannelData without its padding), sent from :attr:`address`, so the engine
  recognises it as coming from "the TURN server" and unwraps ChannelData of
  bound channels as relay traffic.

The allocation belongs to the TCP connection: when the connection ends, the
allocation is gone (:attr:`error` says why; later transactions time out).  The
first address that sends to the shim is its client; datagrams from any other
address are dropped.  One thread per shim, non-blocking sockets and a
selector; datagrams that arrive while more than ``max_backlog`` bytes wait for
the stream are dropped (the stream's backpressure becomes loss, as on UDP).
"""
from __future__ import annotations

import logging
import selectors
import socket
import ssl
import struct
import threading

from erdmampi.nat import NatError

__all__ = ["TurnStreamShim", "tls_context"]

log = logging.getLogger("erdmampi.nat")

_CHUNK = 256 * 1024
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def tls_context(ca_file: "str | None" = None, verify: bool = True) -> ssl.SSLContext:
    """A client context: the system CAs (or ``ca_file``), host name checked; with
    ``verify=False`` no certificate check at all (a test server's self-signed
    certificate)."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class TurnStreamShim:
    """Forward datagrams between a local UDP socket and a TURN server's TCP/TLS port.

    :param server: ``(host, port)`` of the TURN server's TCP (or TLS) listener.
    :param transport: ``"tcp"`` or ``"tls"``.
    :param bind_host: the local address of the shim's UDP socket (127.0.0.1: a
        client socket bound to any local address reaches it).
    :param tls: an :class:`ssl.SSLContext` for ``"tls"`` (default: :func:`tls_context`).
    :param server_name: the name the server's certificate must carry (default:
        the host of ``server``).
    :param connect_timeout: seconds for the TCP connect and the TLS handshake.
    :param sock_factory: ``() -> socket`` for the stream socket (e.g. one made inside
        a network namespace); default :func:`socket.socket` of the server's family.
    :raises NatError: the server cannot be reached or the TLS handshake failed.
    """

    def __init__(self, server, transport: str = "tcp", bind_host: str = "127.0.0.1", *,
                 tls: "ssl.SSLContext | None" = None, server_name: "str | None" = None,
                 connect_timeout: float = 5.0, max_backlog: int = 4 << 20):
        if transport not in ("tcp", "tls"):
            raise ValueError(f"transport must be 'tcp' or 'tls', not {transport!r}")
        self.server = (str(server[0]), int(server[1]))
        self.transport = transport
        self.max_backlog = int(max_backlog)
        self.error: "str | None" = None
        self.client: "tuple[str, int] | None" = None
        #: counters: datagrams/bytes each way, datagrams dropped
        self.stats = {"to_server": 0, "to_server_bytes": 0, "from_server": 0,
                      "from_server_bytes": 0, "dropped": 0}
        where = f"TURN server {self.server[0]}:{self.server[1]} over {transport.upper()}"
        self.label = f"{self.server[0]}:{self.server[1]} ({transport})"
        try:
            tcp = socket.create_connection(self.server, timeout=connect_timeout)
        except OSError as e:
            raise NatError(f"{where}: cannot connect ({e.strerror or e}; TCP to the server "
                           "blocked, or the server down?)") from None
        try:
            tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if transport == "tls":
                ctx = tls if tls is not None else tls_context()
                try:
                    tcp = ctx.wrap_socket(tcp, server_hostname=server_name or self.server[0])
                except ssl.SSLCertVerificationError as e:
                    raise NatError(f"{where}: the server's certificate failed verification "
                                   f"({e.verify_message or e}; set ERDMA_TURN_CA to the CA "
                                   "file that signed it)") from None
                except (ssl.SSLError, OSError) as e:
                    raise NatError(f"{where}: TLS handshake failed ({e})") from None
            tcp.setblocking(False)
            fam = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
            udp = socket.socket(fam, socket.SOCK_DGRAM)
            try:
                for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                    udp.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
                udp.bind((bind_host, 0))
                udp.setblocking(False)
            except OSError:
                udp.close()
                raise
        except BaseException:
            tcp.close()
            raise
        self._tcp, self._udp = tcp, udp
        self.address: "tuple[str, int]" = udp.getsockname()[:2]
        self._out = bytearray()              # framed bytes waiting for the stream
        self._chunk: "bytes | None" = None   # what the last stream send left over
        self._in = bytearray()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="erdma-turn-stream", daemon=True)
        self._thread.start()

    # -- public
    @property
    def alive(self) -> bool:
        return self.error is None and not self._stop

    def close(self) -> None:
        """Stop forwarding and close the connection (the server then frees the
        allocation)."""
        if self._stop:
            return
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(2.0)
        for s in (self._tcp, self._udp, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"TurnStreamShim({self.address[0]}:{self.address[1]} -> {self.label}"
                f"{', ' + self.error if self.error else ''})")

    # -- the forwarding thread
    def _run(self):
        sel = selectors.DefaultSelector()
        sel.register(self._udp, selectors.EVENT_READ, "udp")
        sel.register(self._tcp, selectors.EVENT_READ, "tcp")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        writing = False
        try:
            while not self._stop:
                for key, _ in sel.select(1.0):
                    if key.data == "udp":
                        self._from_client()
                    elif key.data == "tcp":
                        self._from_server()
                    if self._stop:
                        return
                self._flush()
                want = bool(self._out or self._chunk)
                if want != writing:
                    writing = want
                    sel.modify(self._tcp, selectors.EVENT_READ | (selectors.EVENT_WRITE if want
                                                                   else 0), "tcp")
        except _StreamClosed as e:
            self.error = str(e)
            if not self._stop:
                log.warning("TURN %s: %s (the relayed allocation is gone)", self.label, e)
        except Exception as e:  # noqa: BLE001 -- a dead shim must say why
            self.error = f"forwarding failed: {e!r}"
            log.warning("TURN %s: %s", self.label, self.error)
        finally:
            sel.close()

    def _from_client(self):
        udp, st = self._udp, self.stats
        for _ in range(256):
            try:
                data, src = udp.recvfrom(65536)
            except _WOULD_BLOCK:
                break
            except OSError:
                continue                    # an ICMP error of an earlier send
            src = src[:2]
            if self.client is None:
                self.client = src
            elif src != self.client or not data:
                st["dropped"] += 1
                continue
            if len(self._out) > self.max_backlog:
                st["dropped"] += 1
                continue
            self._out += data
            if 0x40 <= data[0] <= 0x4F and len(data) & 3:
                self._out += b"\0" * (4 - (len(data) & 3))   # ChannelData over a stream
            st["to_server"] += 1
            st["to_server_bytes"] += len(data)
            if len(self._out) >= _CHUNK:
                self._flush()

    def _flush(self):
        tcp = self._tcp
        while self._chunk or self._out:
            if self._chunk is None:
                self._chunk = bytes(self._out[:_CHUNK])
                del self._out[:len(self._chunk)]
            try:
                n = tcp.send(self._chunk)       # TLS: all or SSLWantWrite (same bytes again)
            except _WOULD_BLOCK:
                return
            except OSError as e:
                raise _StreamClosed(f"sending to the server failed ({e})") from None
            self._chunk = self._chunk[n:] or None

    def _from_server(self):
        tcp = self._tcp
        tls = isinstance(tcp, ssl.SSLSocket)
        for _ in range(64):             # TLS: one record (<= 16 KiB) per recv
            try:
                got = tcp.recv(_CHUNK)
            except _WOULD_BLOCK:
                break
            except OSError as e:
                raise _StreamClosed(f"the connection failed ({e})") from None
            if not got:
                self._deliver()
                raise _StreamClosed("the server closed the connection")
            self._in += got
            if not tls and len(got) < _CHUNK:
                break
        self._deliver()

    def _deliver(self):
        buf, off, n = self._in, 0, len(self._in)
        udp, client, st = self._udp, self.client, self.stats
        view = memoryview(buf)              # slices without copies; released before del
        try:
            off = self._frames(buf, view, n, udp, client, st)
        finally:
            view.release()
        if off:
            del buf[:off]

    @staticmethod
    def _frames(buf, view, n, udp, client, st) -> int:
        off = 0
        unpack, sendto = struct.unpack_from, udp.sendto
        while n - off >= 4:
            b0 = buf[off]
            length = unpack("!H", buf, off + 2)[0]
            if 0x40 <= b0 <= 0x4F:                   # ChannelData, padded on a stream
                size, step = 4 + length, (4 + length + 3) & ~3
            elif b0 & 0xC0 == 0:                     # a STUN message
                size = step = 20 + length
            else:
                raise _StreamClosed(f"the server sent a frame starting with {b0:#04x}: "
                                    "not STUN or ChannelData")
            if n - off < step:
                break
            if client is not None:
                try:
                    sendto(view[off:off + size], client)
                    st["from_server"] += 1
                    st["from_server_bytes"] += size
                except OSError:             # a full buffer (or ICMP error): a lost datagram
                    st["dropped"] += 1
            off += step
        return off


class _StreamClosed(Exception):
    pass
