"""A TURN client (RFC 8656) over a :class:`~erdmampi.nat.port.DatagramPort`.

::

    turn = TurnClient(port, ("198.18.0.1", 3478), "user", "pass")
    relayed = turn.allocate()                 # (host, port) peers can send to
    turn.create_permission([peer])
    ch = turn.channel_bind(peer)              # 0x4000..0x4FFF
    turn.send(b"hi", peer)                    # ChannelData once bound, else a Send indication
    data, src = turn.handle(*port.recv(1.0))  # Data indication / ChannelData -> payload
    turn.maintain()                           # refresh what is about to expire
    turn.close()                              # Refresh lifetime 0

Long-term credentials: the first Allocate gets ``401`` with REALM and NONCE; every
later request carries USERNAME, REALM, NONCE and MESSAGE-INTEGRITY keyed with
``MD5(user:realm:password)``; a ``438 Stale Nonce`` answer is retried once with
the new nonce.

Transactions are blocking (retransmitted with doubling RTO, bounded total
time) and read the port themselves: datagrams that are not the awaited response
are kept, in order, in :attr:`TurnClient.backlog` for whoever owns the port.
Only one thread may read the port at a time: :meth:`maintain` is meant for a
daemon thread (every ~30 s) while nothing else reads the port -- e.g. during a
job, when the engine passes only STUN and unbound-TURN datagrams to the port.
"""
from __future__ import annotations

import collections
import struct
import threading
import time

from erdmampi.nat import NatError, stun
from erdmampi.nat.stun import ATTR, Message, StunError

__all__ = ["TurnClient", "TurnError", "channel_wrap", "channel_unwrap", "is_channel_data",
           "CHANNEL_MIN", "CHANNEL_MAX"]

CHANNEL_MIN, CHANNEL_MAX = 0x4000, 0x4FFF
UDP = 17
PERMISSION_LIFETIME = 300.0
CHANNEL_LIFETIME = 600.0


class TurnError(NatError):
    """A TURN request failed (refused, timed out) or a frame is malformed.
    ``code`` is the STUN error code when the server answered with one."""

    def __init__(self, msg, code=None):
        super().__init__(msg)
        self.code = code


def channel_wrap(channel: int, data: bytes) -> bytes:
    """A ChannelData frame (over UDP: no padding)."""
    if not CHANNEL_MIN <= channel <= CHANNEL_MAX:
        raise TurnError(f"channel {channel:#x} outside 0x4000..0x4FFF")
    if len(data) > 0xFFFF:
        raise TurnError("ChannelData payload longer than 65535 bytes")
    return struct.pack("!HH", channel, len(data)) + bytes(data)


def is_channel_data(data: bytes) -> bool:
    return len(data) >= 4 and 0x40 <= data[0] <= 0x4F


def channel_unwrap(data: bytes) -> "tuple[int, bytes]":
    """``(channel, payload)`` of a ChannelData frame; trailing padding is ignored."""
    if len(data) < 4:
        raise TurnError(f"ChannelData truncated: {len(data)} bytes")
    channel, length = struct.unpack_from("!HH", data, 0)
    if not CHANNEL_MIN <= channel <= CHANNEL_MAX:
        raise TurnError(f"not ChannelData: channel {channel:#x}")
    if 4 + length > len(data):
        raise TurnError(f"ChannelData says {length} bytes, frame holds {len(data) - 4}")
    return channel, bytes(data[4:4 + length])


def _peer_key(addr) -> "tuple[str, int]":
    return str(addr[0]), int(addr[1])


class TurnClient:
    """One allocation on one TURN server, through ``port``.

    :param port: a :class:`~erdmampi.nat.port.DatagramPort`.
    :param server: ``(host, port)`` of the TURN server.
    :param lifetime: requested allocation lifetime, seconds.
    :param rto: first retransmission timeout; doubled on each retry.
    :param timeout: total time one transaction may take.
    """

    def __init__(self, port, server, username, password, *, lifetime=600, rto=0.2,
                 timeout=5.0, software="erdmampi", transport="udp", shim=None):
        self.port = port
        self.server = _peer_key(server)
        #: how the server is reached: "udp", or "tcp"/"tls" through ``shim`` (a
        #: :class:`~erdmampi.nat.turn_stream.TurnStreamShim` whose address is ``server``)
        self.transport = str(transport)
        self.shim = shim
        self.username, self.password = str(username), str(password)
        self.requested_lifetime = int(lifetime)
        self.rto, self.timeout = float(rto), float(timeout)
        self.software = software
        self.realm: "str | None" = None
        self.nonce: "str | None" = None
        self._key: "bytes | None" = None
        self.relayed: "tuple[str, int] | None" = None    #: relayed transport address
        self.mapped: "tuple[str, int] | None" = None     #: our address as the server sees it
        self.lifetime = 0
        self.expires_at = 0.0
        self.permissions: "dict[str, float]" = {}        #: peer IP -> time installed
        self.channels: "dict[tuple[str, int], int]" = {}  #: peer -> channel number
        self.peer_of_channel: "dict[int, tuple[str, int]]" = {}
        self._channel_time: "dict[int, float]" = {}
        self._next_channel = CHANNEL_MIN
        #: datagrams read during a transaction that were not its response
        self.backlog: "collections.deque[tuple[bytes, tuple[str, int]]]" = \
            collections.deque(maxlen=8192)
        self._lock = threading.RLock()

    # -- requests
    def allocate(self) -> "tuple[str, int]":
        """Allocate a relayed UDP address (authenticating on the way); returns it."""
        with self._lock:
            if self.relayed is not None:
                return self.relayed

            def build():
                m = Message(stun.ALLOCATE)
                m.add(ATTR.REQUESTED_TRANSPORT, struct.pack("!BBBB", UDP, 0, 0, 0))
                m.add_u32(ATTR.LIFETIME, self.requested_lifetime)
                return m
            resp = self._request(build, "Allocate")
            try:
                relayed = resp.address(ATTR.XOR_RELAYED_ADDRESS)
                mapped = resp.address(ATTR.XOR_MAPPED_ADDRESS)
            except StunError as e:
                raise self._malformed("Allocate", e) from None
            if relayed is None:
                raise TurnError(f"TURN server {self._srv()}: Allocate success without "
                                "XOR-RELAYED-ADDRESS")
            self._set_lifetime(resp, "Allocate")
            self.relayed, self.mapped = relayed, mapped
            return relayed

    def refresh(self, lifetime: "int | None" = None) -> int:
        """Refresh the allocation; returns the lifetime granted (0 deletes it)."""
        with self._lock:
            self._need_alloc()
            want = self.requested_lifetime if lifetime is None else int(lifetime)
            resp = self._request(lambda: Message(stun.REFRESH).add_u32(ATTR.LIFETIME, want),
                                 "Refresh")
            self._set_lifetime(resp, "Refresh")
            if want == 0:
                self._forget()
            return self.lifetime

    def create_permission(self, peers) -> None:
        """Install (or refresh) permissions for the IPs of ``peers`` (addresses; the
        port is ignored by TURN).  One request for all of them."""
        with self._lock:
            self._need_alloc()
            ips = sorted({str(p[0]) for p in peers})
            if not ips:
                return

            def build():
                m = Message(stun.CREATE_PERMISSION)
                for ip in ips:
                    m.add_address(ATTR.XOR_PEER_ADDRESS, (ip, 0))
                return m
            self._request(build, f"CreatePermission for {', '.join(ips)}")
            now = time.monotonic()
            for ip in ips:
                self.permissions[ip] = now

    def channel_bind(self, peer) -> int:
        """Bind a channel to ``peer`` (or refresh its binding); returns the number."""
        with self._lock:
            self._need_alloc()
            peer = _peer_key(peer)
            ch = self.channels.get(peer)
            if ch is None:
                if self._next_channel > CHANNEL_MAX:
                    raise TurnError("no free TURN channel numbers left")
                ch = self._next_channel
            self._request(lambda: Message(stun.CHANNEL_BIND)
                          .add(ATTR.CHANNEL_NUMBER, struct.pack("!HH", ch, 0))
                          .add_address(ATTR.XOR_PEER_ADDRESS, peer),
                          f"ChannelBind {ch:#x} to {peer[0]}:{peer[1]}")
            if peer not in self.channels:
                self._next_channel += 1
            self.channels[peer] = ch
            self.peer_of_channel[ch] = peer
            now = time.monotonic()
            self._channel_time[ch] = now
            self.permissions[peer[0]] = now      # a binding installs a permission too
            return ch

    def maintain(self, now: "float | None" = None) -> "list[str]":
        """Refresh the allocation, permissions and channel bindings that would expire
        within the next two minutes (permissions at 4 of their 5 minutes, channels
        at 8 of 10); returns what it refreshed.  Safe to call often (no I/O when
        nothing is due), but only while no other thread reads the port."""
        now = time.monotonic() if now is None else now
        done = []
        with self._lock:
            if self.relayed is None:
                return done
            if now >= self.expires_at - min(120.0, self.lifetime / 2):
                self.refresh()
                done.append("allocation")
            for peer, ch in list(self.channels.items()):
                if now - self._channel_time.get(ch, 0.0) >= CHANNEL_LIFETIME - 120.0:
                    self.channel_bind(peer)
                    done.append(f"channel {ch:#x}")
            bound_ips = {p[0] for p in self.channels}
            due = [ip for ip, t in self.permissions.items()
                   if ip not in bound_ips and now - t >= PERMISSION_LIFETIME - 60.0]
            if due:
                self.create_permission([(ip, 0) for ip in due])
                done.append(f"permissions {', '.join(due)}")
        return done

    def close(self, timeout: float = 1.0) -> None:
        """Delete the allocation (Refresh with lifetime 0); errors are ignored.  A
        TCP/TLS shim is closed too."""
        with self._lock:
            try:
                if self.relayed is None:
                    return
                saved = self.timeout
                self.timeout = timeout
                try:
                    self.refresh(0)
                except (TurnError, OSError):
                    self._forget()
                finally:
                    self.timeout = saved
            finally:
                if self.shim is not None:
                    self.shim.close()

    # -- data
    def send(self, data: bytes, peer) -> None:
        """Send ``data`` to ``peer`` through the relay: ChannelData when a channel is
        bound to it, else a Send indication (needs a permission for its IP)."""
        peer = _peer_key(peer)
        ch = self.channels.get(peer)
        if ch is not None:
            self.port.send(channel_wrap(ch, data), self.server)
            return
        m = Message(stun.SEND, stun.INDICATION).add_address(ATTR.XOR_PEER_ADDRESS, peer)
        m.add(ATTR.DATA, data)
        self.port.send(m.encode(fingerprint=False), self.server)

    def handle(self, data: bytes, addr) -> "tuple[bytes, tuple[str, int]] | None":
        """If ``data`` from ``addr`` is relayed data (a Data indication or ChannelData
        from the server), ``(payload, peer)``; else None (not for this client, or a
        stray response)."""
        if _peer_key(addr) != self.server:
            return None
        if is_channel_data(data):
            try:
                ch, payload = channel_unwrap(data)
            except TurnError:
                return None
            peer = self.peer_of_channel.get(ch)
            return None if peer is None else (payload, peer)
        try:
            m = stun.decode(data)
        except StunError:
            return None
        if m.method == stun.DATA and m.cls == stun.INDICATION:
            try:
                peer = m.address(ATTR.XOR_PEER_ADDRESS)
            except StunError:
                return None
            payload = m.get(ATTR.DATA)
            if peer is None or payload is None:
                return None
            return payload, peer
        return None

    def relay_info(self, peer) -> "dict | None":
        """What the engine needs to send to ``peer`` through this relay:
        ``{"turn_server", "channel", "peer"}`` (None when no channel is bound)."""
        peer = _peer_key(peer)
        ch = self.channels.get(peer)
        if ch is None:
            return None
        return {"turn_server": self.server, "channel": ch, "peer": peer}

    # -- private
    def _srv(self):
        if self.shim is not None:
            return self.shim.label
        return f"{self.server[0]}:{self.server[1]}"

    def _need_alloc(self):
        if self.relayed is None:
            raise TurnError(f"no allocation on TURN server {self._srv()} (call allocate())")

    def _forget(self):
        self.relayed = None
        self.lifetime = 0
        self.expires_at = 0.0
        self.permissions.clear()
        self.channels.clear()
        self.peer_of_channel.clear()
        self._channel_time.clear()

    def _malformed(self, what, e):
        return TurnError(f"TURN server {self._srv()}: malformed {what} response: {e}")

    def _set_lifetime(self, resp, what):
        try:
            lt = resp.u32(ATTR.LIFETIME)
        except StunError as e:
            raise self._malformed(what, e) from None
        if lt is not None:
            self.lifetime = lt
            self.expires_at = time.monotonic() + lt

    def _request(self, build, what) -> Message:
        """Run a request to completion, authenticating (401) and renewing a stale
        nonce (438) as needed; returns the success response or raises TurnError."""
        for attempt in range(3):
            msg = build()
            if self.software:
                msg.add_text(ATTR.SOFTWARE, self.software)
            if self._key is not None:
                msg.add_text(ATTR.USERNAME, self.username).add_text(ATTR.REALM, self.realm)
                msg.add_text(ATTR.NONCE, self.nonce)
            resp = self._transact(msg, what)
            try:
                done = self._answer(resp, what, attempt)
            except StunError as e:          # an attribute the server sent is malformed
                raise self._malformed(what, e) from None
            if done is not None:
                return done
        raise TurnError(f"TURN server {self._srv()}: {what} failed: nonce kept going stale")

    def _answer(self, resp, what, attempt):
        """The success response; None to send the request again; else raises."""
        if resp.cls == stun.SUCCESS:
            if self._key is not None and not stun.check_integrity(resp, self._key):
                raise TurnError(f"TURN server {self._srv()}: {what} response failed "
                                "the MESSAGE-INTEGRITY check")
            return resp
        code, reason = resp.error() or (0, "no ERROR-CODE")
        if code == 401 and self._key is None and attempt == 0:
            self._take_challenge(resp, what)
            return None
        if code == 438:
            nonce = resp.text(ATTR.NONCE)
            if nonce and attempt < 2:
                self.nonce = nonce
                realm = resp.text(ATTR.REALM)
                if realm and realm != self.realm:
                    self._take_challenge(resp, what)
                return None
        if code == 401:
            raise TurnError(f"TURN server {self._srv()} refused the credentials of user "
                            f"{self.username!r} in realm {self.realm!r} "
                            f"(401 {reason.strip() or 'Unauthorized'})", code)
        hint = ""
        if code == 437 and what != "Allocate":
            hint = (" (the allocation is gone: it expired, or our NAT mapping toward "
                    "the server changed)")
        elif code == 403:
            hint = " (the server forbids this peer address)"
        elif code == 486:
            hint = " (the server's allocation quota for this user is used up)"
        raise TurnError(f"TURN server {self._srv()}: {what} failed: {code} "
                        f"{reason.strip()}{hint}", code)

    def _take_challenge(self, resp, what):
        realm, nonce = resp.text(ATTR.REALM), resp.text(ATTR.NONCE)
        if not realm or not nonce:
            raise TurnError(f"TURN server {self._srv()}: {what} got 401 without "
                            "REALM/NONCE", 401)
        self.realm, self.nonce = realm, nonce
        self._key = stun.long_term_key(self.username, realm, self.password)

    def _transact(self, msg: Message, what) -> Message:
        data = msg.encode(key=self._key)
        start = time.monotonic()
        deadline = start + self.timeout
        # over TCP/TLS the stream is reliable: one send, no retransmissions
        rto = self.rto if self.shim is None else float("inf")
        next_send = start
        while True:
            now = time.monotonic()
            if now >= deadline:
                if self.shim is None:
                    why = "UDP to the server blocked or the server down?"
                elif self.shim.error:
                    why = f"the {self.transport.upper()} connection: {self.shim.error}"
                else:
                    why = "the server down?"
                raise TurnError(f"TURN server {self._srv()}: no answer to {what} within "
                                f"{self.timeout:g} s ({why})")
            if now >= next_send:
                self.port.send(data, self.server)
                next_send = now + rto
                rto = min(rto * 2, 1.6)
            got = self.port.recv(max(0.0, min(next_send, deadline) - time.monotonic()))
            if got is None:
                continue
            payload, addr = got
            if _peer_key(addr) == self.server and stun.is_stun(payload):
                try:
                    resp = stun.decode(payload)
                except StunError:
                    resp = None
                if resp is not None and resp.tid == msg.tid and resp.is_response:
                    return resp
            self.backlog.append((payload, addr))
