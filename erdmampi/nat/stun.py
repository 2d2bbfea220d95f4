"""STUN messages (RFC 8489): encode and decode, sans-I/O.

A :class:`Message` is a method, a class and a transaction id plus an ordered
list of ``(type, value_bytes)`` attributes.  Typed helpers read and write the
attributes erdmampi needs (XOR-MAPPED-ADDRESS and the other XOR addresses,
USERNAME, ERROR-CODE, REALM, NONCE, SOFTWARE, LIFETIME, ...).
MESSAGE-INTEGRITY (HMAC-SHA1) and FINGERPRINT (CRC-32 xor 0x5354554e) are
added by :meth:`Message.encode` and checked by :func:`check_integrity` /
:func:`decode` (fingerprint).

Decoding is defensive: a truncated, padded-wrong or otherwise malformed
datagram raises :class:`StunError`, never another exception.

::

    req = Message(BINDING, REQUEST)
    data = req.encode()
    msg = decode(reply_bytes)
    msg.mapped_address()        # ("198.18.0.10", 40000)
"""
from __future__ import annotations

import binascii
import hashlib
import hmac
import ipaddress
import os
import struct
from dataclasses import dataclass, field

__all__ = [
    "StunError", "Message", "decode", "is_stun", "check_integrity", "long_term_key",
    "MAGIC_COOKIE", "REQUEST", "INDICATION", "SUCCESS", "ERROR",
    "BINDING", "ALLOCATE", "REFRESH", "SEND", "DATA", "CREATE_PERMISSION", "CHANNEL_BIND",
    "ATTR",
]

MAGIC_COOKIE = 0x2112A442
_COOKIE_BYTES = struct.pack("!I", MAGIC_COOKIE)
_FINGERPRINT_XOR = 0x5354554E
HEADER = 20

# classes
REQUEST, INDICATION, SUCCESS, ERROR = 0b00, 0b01, 0b10, 0b11
# methods
BINDING = 0x001
ALLOCATE = 0x003
REFRESH = 0x004
SEND = 0x006
DATA = 0x007
CREATE_PERMISSION = 0x008
CHANNEL_BIND = 0x009


class ATTR:
    """Attribute type numbers."""
    MAPPED_ADDRESS = 0x0001
    USERNAME = 0x0006
    MESSAGE_INTEGRITY = 0x0008
    ERROR_CODE = 0x0009
    UNKNOWN_ATTRIBUTES = 0x000A
    CHANNEL_NUMBER = 0x000C
    LIFETIME = 0x000D
    XOR_PEER_ADDRESS = 0x0012
    DATA = 0x0013
    REALM = 0x0014
    NONCE = 0x0015
    XOR_RELAYED_ADDRESS = 0x0016
    REQUESTED_ADDRESS_FAMILY = 0x0017
    REQUESTED_TRANSPORT = 0x0019
    XOR_MAPPED_ADDRESS = 0x0020
    PRIORITY = 0x0024
    USE_CANDIDATE = 0x0025
    MESSAGE_INTEGRITY_SHA256 = 0x001C
    SOFTWARE = 0x8022
    FINGERPRINT = 0x8028
    ICE_CONTROLLED = 0x8029
    ICE_CONTROLLING = 0x802A


_XOR_ADDRS = (ATTR.XOR_MAPPED_ADDRESS, ATTR.XOR_PEER_ADDRESS, ATTR.XOR_RELAYED_ADDRESS)


class StunError(ValueError):
    """A datagram is not a well-formed STUN message, or a check on it failed."""


def is_stun(data: bytes) -> bool:
    """Cheap test (as the engine's demultiplexer does): at least a header, top two
    bits 00, the magic cookie at bytes 4..7 and a length that is a multiple of 4."""
    return (len(data) >= HEADER and data[0] & 0xC0 == 0 and data[4:8] == _COOKIE_BYTES
            and (data[2] << 8 | data[3]) % 4 == 0)


def _type_to_fields(t: int) -> "tuple[int, int]":
    method = (t & 0x000F) | ((t & 0x00E0) >> 1) | ((t & 0x3E00) >> 2)
    cls = ((t & 0x0010) >> 4) | ((t & 0x0100) >> 7)
    return method, cls


def _fields_to_type(method: int, cls: int) -> int:
    if not 0 <= method < 0x1000:
        raise StunError(f"STUN method {method:#x} out of range")
    return ((method & 0x000F) | ((method & 0x0070) << 1) | ((method & 0x0F80) << 2)
            | ((cls & 1) << 4) | ((cls & 2) << 7))


def long_term_key(username: str, realm: str, password: str) -> bytes:
    """The long-term credential key: MD5(username ":" realm ":" password)."""
    return hashlib.md5(f"{username}:{realm}:{password}".encode()).digest()


def _pad4(n: int) -> int:
    return (n + 3) & ~3


def _encode_addr(addr: "tuple[str, int]", xor: bool, tid: bytes) -> bytes:
    host, port = addr
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise StunError(f"not an IP address: {host!r}") from None
    if not 0 <= int(port) <= 0xFFFF:
        raise StunError(f"port {port!r} out of range")
    raw = ip.packed
    family = 0x01 if ip.version == 4 else 0x02
    port = int(port)
    if xor:
        port ^= MAGIC_COOKIE >> 16
        mask = _COOKIE_BYTES + tid
        raw = bytes(a ^ b for a, b in zip(raw, mask))
    return struct.pack("!BBH", 0, family, port) + raw


def _decode_addr(value: bytes, xor: bool, tid: bytes) -> "tuple[str, int]":
    if len(value) < 4:
        raise StunError(f"address attribute too short ({len(value)} bytes)")
    family, port = value[1], value[2] << 8 | value[3]
    n = {1: 4, 2: 16}.get(family)
    if n is None:
        raise StunError(f"address family {family:#x} unknown")
    if len(value) != 4 + n:
        raise StunError(f"address attribute of family {family} has {len(value)} bytes")
    raw = value[4:]
    if xor:
        port ^= MAGIC_COOKIE >> 16
        raw = bytes(a ^ b for a, b in zip(raw, _COOKIE_BYTES + tid))
    return str(ipaddress.ip_address(raw)), port


@dataclass
class Message:
    """One STUN message.

    :param method: ``BINDING``, ``ALLOCATE``, ...
    :param cls: ``REQUEST``, ``INDICATION``, ``SUCCESS`` or ``ERROR``.
    :param tid: 12-byte transaction id (random when omitted).
    :param attrs: ``[(type, value), ...]`` in wire order (without integrity/fingerprint
        when building; decoded messages keep every attribute).
    """
    method: int
    cls: int = REQUEST
    tid: bytes = field(default_factory=lambda: os.urandom(12))
    attrs: "list[tuple[int, bytes]]" = field(default_factory=list)
    #: byte offset of MESSAGE-INTEGRITY in the decoded datagram (None: absent)
    _mi_offset: "int | None" = field(default=None, repr=False, compare=False)
    _raw: bytes = field(default=b"", repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.tid, (bytes, bytearray)) or len(self.tid) != 12:
            raise StunError("transaction id must be 12 bytes")
        self.tid = bytes(self.tid)

    # -- generic attributes
    def add(self, atype: int, value: bytes = b"") -> "Message":
        if not 0 <= atype <= 0xFFFF:
            raise StunError(f"attribute type {atype!r} out of range")
        if len(value) > 0xFFFF:
            raise StunError("attribute value longer than 65535 bytes")
        self.attrs.append((atype, bytes(value)))
        return self

    def get(self, atype: int) -> "bytes | None":
        """The first attribute of this type (None when absent)."""
        for t, v in self.attrs:
            if t == atype:
                return v
        return None

    def get_all(self, atype: int) -> "list[bytes]":
        return [v for t, v in self.attrs if t == atype]

    def has(self, atype: int) -> bool:
        return any(t == atype for t, _ in self.attrs)

    # -- typed attributes
    def add_address(self, atype: int, addr: "tuple[str, int]") -> "Message":
        return self.add(atype, _encode_addr(addr, atype in _XOR_ADDRS, self.tid))

    def address(self, atype: int) -> "tuple[str, int] | None":
        v = self.get(atype)
        return None if v is None else _decode_addr(v, atype in _XOR_ADDRS, self.tid)

    def addresses(self, atype: int) -> "list[tuple[str, int]]":
        return [_decode_addr(v, atype in _XOR_ADDRS, self.tid) for v in self.get_all(atype)]

    def mapped_address(self) -> "tuple[str, int] | None":
        """XOR-MAPPED-ADDRESS, or the legacy MAPPED-ADDRESS when only that is present."""
        a = self.address(ATTR.XOR_MAPPED_ADDRESS)
        return a if a is not None else self.address(ATTR.MAPPED_ADDRESS)

    def add_text(self, atype: int, text: str) -> "Message":
        return self.add(atype, text.encode("utf-8"))

    def text(self, atype: int) -> "str | None":
        v = self.get(atype)
        if v is None:
            return None
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise StunError(f"attribute {atype:#06x} is not UTF-8") from None

    def add_u32(self, atype: int, value: int) -> "Message":
        return self.add(atype, struct.pack("!I", value))

    def u32(self, atype: int) -> "int | None":
        v = self.get(atype)
        if v is None:
            return None
        if len(v) != 4:
            raise StunError(f"attribute {atype:#06x} must be 4 bytes, has {len(v)}")
        return struct.unpack("!I", v)[0]

    def add_error(self, code: int, reason: str = "") -> "Message":
        if not 300 <= code <= 699:
            raise StunError(f"error code {code} out of range 300..699")
        return self.add(ATTR.ERROR_CODE, struct.pack("!HBB", 0, code // 100, code % 100)
                        + reason.encode())

    def error(self) -> "tuple[int, str] | None":
        """``(code, reason)`` of ERROR-CODE, or None."""
        v = self.get(ATTR.ERROR_CODE)
        if v is None:
            return None
        if len(v) < 4:
            raise StunError("ERROR-CODE too short")
        code = (v[2] & 0x07) * 100 + v[3]
        return code, v[4:].decode("utf-8", "replace")

    # -- wire format
    def encode(self, key: "bytes | None" = None, fingerprint: bool = True,
               padding: bytes = b"\0") -> bytes:
        """The datagram; with ``key``, MESSAGE-INTEGRITY (HMAC-SHA1 with that key)
        is appended, then FINGERPRINT unless ``fingerprint=False``.  ``padding`` is
        the byte that pads attribute values to 4 (receivers ignore it; RFC 5769's
        vectors use a space)."""
        if len(padding) != 1:
            raise StunError("padding must be one byte")
        body = bytearray()
        for t, v in self.attrs:
            if t in (ATTR.MESSAGE_INTEGRITY, ATTR.FINGERPRINT):
                continue            # recomputed below
            body += struct.pack("!HH", t, len(v)) + v + padding * (_pad4(len(v)) - len(v))
        mtype = _fields_to_type(self.method, self.cls)
        if key is not None:
            # the length in the header covers MESSAGE-INTEGRITY when it is computed
            hdr = struct.pack("!HHI", mtype, len(body) + 24, MAGIC_COOKIE) + self.tid
            mac = hmac.new(key, hdr + bytes(body), hashlib.sha1).digest()
            body += struct.pack("!HH", ATTR.MESSAGE_INTEGRITY, 20) + mac
        if fingerprint:
            hdr = struct.pack("!HHI", mtype, len(body) + 8, MAGIC_COOKIE) + self.tid
            crc = (binascii.crc32(hdr + bytes(body)) & 0xFFFFFFFF) ^ _FINGERPRINT_XOR
            body += struct.pack("!HHI", ATTR.FINGERPRINT, 4, crc)
        if len(body) > 0xFFFF:
            raise StunError("message too long")
        return struct.pack("!HHI", mtype, len(body), MAGIC_COOKIE) + self.tid + bytes(body)

    @property
    def is_request(self):
        return self.cls == REQUEST

    @property
    def is_indication(self):
        return self.cls == INDICATION

    @property
    def is_response(self):
        return self.cls in (SUCCESS, ERROR)

    def response(self, cls: int = SUCCESS) -> "Message":
        """An empty response (same method and transaction id)."""
        return Message(self.method, cls, self.tid)


def decode(data: bytes) -> Message:
    """Parse a datagram; raises :class:`StunError` for anything malformed, including a
    wrong FINGERPRINT.  MESSAGE-INTEGRITY is checked separately
    (:func:`check_integrity`), since only the caller knows the key."""
    try:
        data = bytes(data)
    except TypeError:
        raise StunError("STUN data must be bytes") from None
    if len(data) < HEADER:
        raise StunError(f"STUN message truncated: {len(data)} bytes, header needs 20")
    if data[0] & 0xC0:
        raise StunError("not STUN: top two bits of the first byte are not 00")
    mtype, length, cookie = struct.unpack_from("!HHI", data, 0)
    if cookie != MAGIC_COOKIE:
        raise StunError(f"not STUN: magic cookie {cookie:#010x}")
    if length % 4:
        raise StunError(f"STUN length {length} is not a multiple of 4")
    if HEADER + length != len(data):
        raise StunError(f"STUN length field says {length} bytes of attributes, "
                        f"datagram has {len(data) - HEADER}")
    method, cls = _type_to_fields(mtype)
    msg = Message(method, cls, data[8:20])
    msg._raw = data
    off = HEADER
    seen_mi = seen_fp = False
    while off < len(data):
        if off + 4 > len(data):
            raise StunError("STUN attribute header truncated")
        atype, alen = struct.unpack_from("!HH", data, off)
        end = off + 4 + alen
        if end > len(data):
            raise StunError(f"STUN attribute {atype:#06x} runs past the end of the message")
        value = data[off + 4:end]
        if seen_fp:
            raise StunError("attribute after FINGERPRINT")
        if atype == ATTR.FINGERPRINT:
            if alen != 4:
                raise StunError("FINGERPRINT must be 4 bytes")
            hdr = struct.pack("!HHI", mtype, off + 8 - HEADER, MAGIC_COOKIE) + msg.tid
            want = (binascii.crc32(hdr + data[HEADER:off]) & 0xFFFFFFFF) ^ _FINGERPRINT_XOR
            if struct.unpack("!I", value)[0] != want:
                raise StunError("FINGERPRINT mismatch")
            seen_fp = True
        elif seen_mi:
            pass                    # attributes after MESSAGE-INTEGRITY are ignored
        elif atype == ATTR.MESSAGE_INTEGRITY:
            if alen != 20:
                raise StunError("MESSAGE-INTEGRITY must be 20 bytes")
            msg._mi_offset = off
            seen_mi = True
        if not seen_mi or atype == ATTR.MESSAGE_INTEGRITY or atype == ATTR.FINGERPRINT:
            msg.attrs.append((atype, value))
        off += 4 + _pad4(alen)
    if off != len(data):
        raise StunError("STUN attribute padding runs past the end of the message")
    return msg


def check_integrity(msg: Message, key: bytes) -> bool:
    """True when ``msg`` (from :func:`decode`) carries a MESSAGE-INTEGRITY that
    matches ``key``."""
    off = msg._mi_offset
    if off is None or not msg._raw:
        return False
    raw = msg._raw
    hdr = raw[0:2] + struct.pack("!H", off + 24 - HEADER) + raw[4:HEADER]
    mac = hmac.new(key, hdr + raw[HEADER:off], hashlib.sha1).digest()
    return hmac.compare_digest(mac, raw[off + 4:off + 24])
