"""An independent peer for erdmampi's wire protocol, built on aioquic.

aioquic shares no code with the engine's ngtcp2 + GnuTLS stack, so a
conversation between the two shows that the engine speaks standard QUIC v1 /
TLS 1.3 and that its stream framing is what docs/wire.md says.  The framing
below is written from docs/wire.md, not from ext/src.

Layers, as in aioquic itself:

* ``encode`` / ``FrameReader`` - bytes <-> frames, no I/O;
* ``ErdmaProtocol`` - an aioquic ``QuicConnectionProtocol`` that turns stream 0
  into a queue of frames;
* ``ErdmaPeer`` - one rank's endpoint logic: HELLO, eager and rendezvous
  sends, receives that answer every RTS with a CTS.
"""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import ssl
import struct
from dataclasses import dataclass, field

from aioquic.asyncio import connect, serve
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamDataReceived
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ALPN = "erdma/1"
HEADER = struct.Struct("<BBHIiIQQ")  # type, flags, 0, ctx, tag, 0, len, id
HELLO, EAGER, RTS, CTS, DATA, RATE = 1, 2, 3, 4, 5, 7
TYPE_NAMES = {HELLO: "HELLO", EAGER: "EAGER", RTS: "RTS", CTS: "CTS", DATA: "DATA",
              RATE: "RATE"}
RATE_MIN, RATE_MAX = 1 << 20, 1 << 40
FLAG_SYNC = 1
EAGER_LIMIT = 65536

assert HEADER.size == 32


class WireError(Exception):
    """The other side broke the framing of docs/wire.md."""


# ------------------------------------------------------------------ frames
@dataclass
class Frame:
    type: int
    flags: int = 0
    ctx: int = 0
    tag: int = 0
    length: int = 0
    id: int = 0
    payload: bytes = b""

    @property
    def name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))


def encode(type: int, *, flags: int = 0, ctx: int = 0, tag: int = 0, length: int = 0,
           id: int = 0, payload: bytes = b"") -> bytes:
    """One frame: the 32-byte little-endian header, then the payload."""
    return HEADER.pack(type, flags, 0, ctx, tag, 0, length, id) + bytes(payload)


def payload_length(type: int, length: int) -> int:
    """Payload bytes that follow a header: EAGER and DATA carry ``len`` bytes."""
    return length if type in (EAGER, DATA) else 0


class FrameReader:
    """Reassembles frames from stream bytes that arrive in arbitrary pieces."""

    def __init__(self):
        self._buf = bytearray()
        self._hdr: Frame | None = None
        self._need = 0

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out = []
        while True:
            if self._hdr is None:
                if len(self._buf) < HEADER.size:
                    return out
                type_, flags, res1, ctx, tag, res2, length, id_ = HEADER.unpack_from(self._buf)
                del self._buf[:HEADER.size]
                if type_ not in TYPE_NAMES:
                    raise WireError(f"unknown frame type {type_}")
                if res1 or res2:
                    raise WireError(f"reserved header fields not zero ({res1}, {res2})")
                self._hdr = Frame(type_, flags, ctx, tag, length, id_)
                self._need = payload_length(type_, length)
            if len(self._buf) < self._need:
                return out
            self._hdr.payload = bytes(self._buf[:self._need])
            del self._buf[:self._need]
            out.append(self._hdr)
            self._hdr = None


# ------------------------------------------------------------- identities
@dataclass
class Identity:
    """A self-signed ECDSA P-256 certificate, like the ones the engine makes."""
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @classmethod
    def generate(cls, common_name: str = "aioquic-peer") -> "Identity":
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                               critical=False)
                .sign(key, hashes.SHA256()))
        return cls(cert, key)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.certificate)


def fingerprint_of(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate, lowercase hex: the engine's fingerprint."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def configuration(is_client: bool, identity: Identity | None = None, alpn: str = ALPN,
                  idle_timeout: float = 10.0) -> QuicConfiguration:
    """aioquic settings for an erdma peer.  Certificates are checked by
    fingerprint (as the engine does), not against a CA, hence CERT_NONE."""
    cfg = QuicConfiguration(is_client=is_client, alpn_protocols=[alpn],
                            idle_timeout=idle_timeout, verify_mode=ssl.CERT_NONE,
                            server_name="localhost" if is_client else None,
                            max_datagram_size=1452)
    if identity is not None:
        cfg.certificate = identity.certificate
        cfg.private_key = identity.private_key
    return cfg


# -------------------------------------------------------------- protocol
class ErdmaProtocol(QuicConnectionProtocol):
    """Stream 0 as a queue of frames (None once the connection is gone)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.frames: asyncio.Queue = asyncio.Queue()
        self.alpn: str | None = None
        self.stream_id: int | None = 0 if self._quic.configuration.is_client else None
        self.terminated: ConnectionTerminated | None = None
        # server side: resolves to stream 0's id once the client opens it (None if never)
        self.opened = asyncio.get_running_loop().create_future()
        self._reader = FrameReader()

    def quic_event_received(self, event) -> None:
        if isinstance(event, HandshakeCompleted):
            self.alpn = event.alpn_protocol
        elif isinstance(event, StreamDataReceived):
            if self.stream_id is None:
                self.stream_id = event.stream_id
                if not self.opened.done():
                    self.opened.set_result(event.stream_id)
            if event.stream_id != self.stream_id:
                self._fail(WireError(f"data on unexpected stream {event.stream_id}"))
                return
            try:
                for f in self._reader.feed(event.data):
                    self.frames.put_nowait(f)
            except WireError as exc:
                self._fail(exc)
        elif isinstance(event, ConnectionTerminated):
            self.terminated = event
            if not self.opened.done():
                self.opened.set_result(None)  # no stream 0 before the end
            self.frames.put_nowait(None)

    @property
    def peer_certificate(self) -> x509.Certificate | None:
        return self._quic.tls._peer_certificate  # aioquic keeps it after the handshake

    def write(self, data: bytes) -> None:
        self._quic.send_stream_data(self.stream_id, data)
        self.transmit()

    def _fail(self, exc: Exception) -> None:
        self.frames.put_nowait(exc)
        self.close(error_code=0x1, reason_phrase=str(exc))


# ------------------------------------------------------------------ peer
@dataclass
class Message:
    """A message received by the aioquic peer."""
    ctx: int
    tag: int
    data: bytes
    rendezvous: bool   # arrived as RTS -> CTS -> DATA
    sync: bool         # the RTS carried flags&1


@dataclass
class ErdmaPeer:
    """One rank's side of the framing, over an ErdmaProtocol.

    A background task dispatches incoming frames: EAGER and completed
    rendezvous messages go to ``inbox``; every RTS is answered with a CTS at
    once (this peer always has room); CTS frames release waiting sends.
    ``received`` logs the type of every frame in arrival order.
    """
    proto: ErdmaProtocol
    rank: int
    size: int
    eager_limit: int = EAGER_LIMIT
    peer_rank: int | None = None
    received: list = field(default_factory=list)

    def __post_init__(self):
        loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.hello = loop.create_future()
        self._cts: dict[int, asyncio.Future] = {}
        self._rndv: dict[int, Frame] = {}   # our receive id -> the RTS
        self.rates: list[int] = []           # RATE frames the engine sent us
        self._next_id = 1000                # unlike the engine's ids, on purpose
        self._task = loop.create_task(self._dispatch())

    # -- sending
    def send_hello(self, rank: int | None = None, size: int | None = None) -> None:
        self.proto.write(encode(HELLO, ctx=self.rank if rank is None else rank,
                                length=self.size if size is None else size))

    async def send(self, data: bytes, tag: int, ctx: int, sync: bool = False) -> str:
        """Send like the engine does; returns "eager" or "rendezvous"."""
        if len(data) <= self.eager_limit and not sync:
            self.proto.write(encode(EAGER, ctx=ctx, tag=tag, length=len(data), payload=data))
            return "eager"
        sid = self._new_id()
        fut = self._cts[sid] = asyncio.get_running_loop().create_future()
        self.proto.write(encode(RTS, flags=FLAG_SYNC if sync else 0, ctx=ctx, tag=tag,
                                length=len(data), id=sid))
        receiver_id = await fut
        self.proto.write(encode(DATA, length=len(data), id=receiver_id, payload=data))
        return "rendezvous"

    # -- receiving
    async def wait_hello(self) -> Frame:
        return await self.hello

    async def recv(self) -> Message:
        item = await self.inbox.get()
        if isinstance(item, Exception):
            self.inbox.put_nowait(item)
            raise item
        return item

    def close(self) -> None:
        self._task.cancel()
        self.proto.close()

    # Private
    def _new_id(self) -> int:
        self._next_id += 7
        return self._next_id

    async def _dispatch(self) -> None:
        try:
            while True:
                f = await self.proto.frames.get()
                if f is None:
                    raise ConnectionError("connection closed")
                if isinstance(f, Exception):
                    raise f
                self.received.append(f.name)
                self._handle(f)
        except Exception as exc:  # noqa: BLE001 - handed to every waiter
            for fut in [self.hello, *self._cts.values()]:
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # a waiter may never come: don't log it as lost
            self.inbox.put_nowait(exc)

    def _handle(self, f: Frame) -> None:
        if not self.hello.done():
            if f.type != HELLO:
                raise WireError(f"first frame is {f.name}, not HELLO")
            self.peer_rank = f.ctx
            self.hello.set_result(f)
            return
        if f.type == HELLO:
            raise WireError("second HELLO")
        if f.type == EAGER:
            self.inbox.put_nowait(Message(f.ctx, f.tag, f.payload, False, False))
        elif f.type == RTS:
            rid = self._new_id()
            self._rndv[rid] = f
            self.proto.write(encode(CTS, id=f.id, length=rid))
        elif f.type == DATA:
            rts = self._rndv.pop(f.id, None)
            if rts is None:
                raise WireError(f"DATA for unknown receive id {f.id}")
            if f.length != rts.length:
                raise WireError(f"DATA carries {f.length} bytes, RTS announced {rts.length}")
            self.inbox.put_nowait(Message(rts.ctx, rts.tag, f.payload, True,
                                          bool(rts.flags & FLAG_SYNC)))
        elif f.type == CTS:
            fut = self._cts.pop(f.id, None)
            if fut is None:
                raise WireError(f"CTS for unknown send id {f.id}")
            fut.set_result(f.length)
        elif f.type == RATE:
            # the rate our packets reach the engine at: this peer does not pace
            if not RATE_MIN <= f.length <= RATE_MAX:
                raise WireError(f"RATE of {f.length} bytes/s")
            self.rates.append(f.length)


# -------------------------------------------------------- conveniences
def client(host: str, port: int, cfg: QuicConfiguration, made: list | None = None):
    """``async with client(...) as proto``: an aioquic client connection.
    ``made`` (if given) collects the protocol even when the handshake fails."""
    def factory(*args, **kwargs):
        proto = ErdmaProtocol(*args, **kwargs)
        if made is not None:
            made.append(proto)
        return proto
    return connect(host, port, configuration=cfg, create_protocol=factory)


async def server(host: str, port: int, cfg: QuicConfiguration):
    """Start an aioquic server; returns (server, future of its first ErdmaProtocol)."""
    first = asyncio.get_running_loop().create_future()

    def factory(*args, **kwargs):
        proto = ErdmaProtocol(*args, **kwargs)
        if not first.done():
            first.set_result(proto)
        return proto

    srv = await serve(host, port, configuration=cfg, create_protocol=factory)
    return srv, first
