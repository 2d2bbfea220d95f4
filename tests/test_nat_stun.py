"""STUN codec (erdmampi.nat.stun): RFC 5769 test vectors, round trips, and
malformed input (random bytes, truncations, bit flips) raising StunError."""
import random

import pytest

from erdmampi.nat import stun
from erdmampi.nat.stun import ATTR, Message, StunError, check_integrity, decode

TID = bytes.fromhex("b7e7a701bc34d686fa87dfae")
PWD = b"VOkJxbRl1RmTxUk/WvJxBt"

# RFC 5769 section 2.1-2.4 (hex of the sample messages)
SAMPLE_REQUEST = bytes.fromhex(
    "000100582112a442b7e7a701bc34d686fa87dfae"
    "802200105354554e207465737420636c69656e74"
    "002400046e0001ff80290008932ff9b151263b36"
    "000600096576746a3a6836765920202000080014"
    "9aeaa70cbfd8cb56781ef2b5b2d3f249c1b571a2"
    "80280004e57a3bcf")
SAMPLE_IPV4_RESPONSE = bytes.fromhex(
    "0101003c2112a442b7e7a701bc34d686fa87dfae"
    "8022000b7465737420766563746f722000200008"
    "0001a147e112a643000800142b91f599fd9e90c3"
    "8c7489f92af9ba53f06be7d780280004c07d4c96")
SAMPLE_IPV6_RESPONSE = bytes.fromhex(
    "010100482112a442b7e7a701bc34d686fa87dfae"
    "8022000b7465737420766563746f722000200014"
    "0002a1470113a9faa5d3f179bc25f4b5bed2b9d9"
    "00080014a382954e4be67bf11784c97c8292c275"
    "bfe3ed4180280004c8fb0b4c")
SAMPLE_LONG_TERM = bytes.fromhex(
    "000100602112a44278ad3433c6ad72c029da412e"
    "00060012e3839ee38388e383aae38383e382afe3"
    "82b90000001500 1c662f2f3439396b393534643"
    "64f4c33346f4c3946535476793634734100140 00b"
    "6578616d706c652e6f72670000080014f6702465"
    "6dd64a3e02b8e0712e85c9a28ca89666".replace(" ", ""))


def test_sample_request():
    m = decode(SAMPLE_REQUEST)
    assert (m.method, m.cls, m.tid) == (stun.BINDING, stun.REQUEST, TID)
    assert m.text(ATTR.SOFTWARE) == "STUN test client"
    assert m.text(ATTR.USERNAME) == "evtj:h6vY"
    assert m.u32(ATTR.PRIORITY) == 0x6E0001FF
    assert m.get(ATTR.ICE_CONTROLLED) == bytes.fromhex("932ff9b151263b36")
    assert check_integrity(m, PWD)
    assert not check_integrity(m, b"wrong password")
    # re-encoding (RFC 5769 pads with spaces) gives the same bytes, MI and FP included
    assert m.encode(key=PWD, padding=b" ") == SAMPLE_REQUEST


@pytest.mark.parametrize("data,addr", [
    (SAMPLE_IPV4_RESPONSE, ("192.0.2.1", 32853)),
    (SAMPLE_IPV6_RESPONSE, ("2001:db8:1234:5678:11:2233:4455:6677", 32853))])
def test_sample_responses(data, addr):
    m = decode(data)
    assert (m.method, m.cls) == (stun.BINDING, stun.SUCCESS)
    assert m.text(ATTR.SOFTWARE) == "test vector"
    assert m.mapped_address() == addr
    assert check_integrity(m, PWD)
    assert m.encode(key=PWD, padding=b" ") == data
    # built from scratch (zero padding changes the MAC input, so compare fields)
    b = Message(stun.BINDING, stun.SUCCESS, TID).add_text(ATTR.SOFTWARE, "test vector")
    b.add_address(ATTR.XOR_MAPPED_ADDRESS, addr)
    m2 = decode(b.encode(key=PWD))
    assert m2.mapped_address() == addr and check_integrity(m2, PWD)


def test_sample_long_term_auth():
    m = decode(SAMPLE_LONG_TERM)
    user = "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
    assert m.text(ATTR.USERNAME) == user
    assert m.text(ATTR.NONCE) == "f//499k954d6OL34oL9FSTvy64sA"
    assert m.text(ATTR.REALM) == "example.org"
    key = stun.long_term_key(user, "example.org", "TheMatrIX")
    assert check_integrity(m, key)
    assert m.encode(key=key, fingerprint=False) == SAMPLE_LONG_TERM


def test_round_trip_all_attributes():
    m = Message(stun.ALLOCATE, stun.ERROR)
    m.add_error(438, "Stale Nonce").add_text(ATTR.REALM, "r").add_text(ATTR.NONCE, "n0")
    m.add_address(ATTR.XOR_PEER_ADDRESS, ("198.18.0.7", 1))
    m.add_address(ATTR.XOR_PEER_ADDRESS, ("::1", 65535))
    m.add_address(ATTR.MAPPED_ADDRESS, ("10.0.0.1", 5))
    m.add_u32(ATTR.LIFETIME, 600).add(ATTR.DATA, b"\x01\x02\x03")
    raw = m.encode(key=b"k")
    d = decode(raw)
    assert (d.method, d.cls, d.tid) == (stun.ALLOCATE, stun.ERROR, m.tid)
    assert d.error() == (438, "Stale Nonce")
    assert d.addresses(ATTR.XOR_PEER_ADDRESS) == [("198.18.0.7", 1), ("::1", 65535)]
    assert d.address(ATTR.MAPPED_ADDRESS) == ("10.0.0.1", 5)
    assert d.u32(ATTR.LIFETIME) == 600 and d.get(ATTR.DATA) == b"\x01\x02\x03"
    assert check_integrity(d, b"k") and not check_integrity(d, b"K")
    assert stun.is_stun(raw) and not stun.is_stun(b"\x40" + raw[1:])
    assert d.error() is not None and decode(Message(stun.BINDING).encode()).error() is None


@pytest.mark.parametrize("method", [stun.BINDING, stun.ALLOCATE, stun.REFRESH, stun.SEND,
                                    stun.DATA, stun.CREATE_PERMISSION, stun.CHANNEL_BIND, 0xFFF])
@pytest.mark.parametrize("cls", [stun.REQUEST, stun.INDICATION, stun.SUCCESS, stun.ERROR])
def test_type_bits_round_trip(method, cls):
    d = decode(Message(method, cls).encode())
    assert (d.method, d.cls) == (method, cls)


def test_bad_build_arguments():
    with pytest.raises(StunError):
        Message(stun.BINDING, tid=b"short")
    with pytest.raises(StunError):
        Message(stun.BINDING).add_address(ATTR.XOR_MAPPED_ADDRESS, ("not-an-ip", 1))
    with pytest.raises(StunError):
        Message(stun.BINDING).add_address(ATTR.XOR_MAPPED_ADDRESS, ("1.2.3.4", 70000))
    with pytest.raises(StunError):
        Message(stun.BINDING).add_error(200)
    with pytest.raises(StunError):
        Message(0x1000).encode()


def test_fingerprint_and_integrity_detect_changes():
    raw = bytearray(SAMPLE_REQUEST)
    raw[30] ^= 0x01                     # inside SOFTWARE
    with pytest.raises(StunError, match="FINGERPRINT"):
        decode(bytes(raw))
    # without FINGERPRINT, the change is caught by MESSAGE-INTEGRITY instead
    m = decode(SAMPLE_LONG_TERM)
    raw = bytearray(SAMPLE_LONG_TERM)
    raw[60] ^= 0x01
    m2 = decode(bytes(raw))
    key = stun.long_term_key("\u30de\u30c8\u30ea\u30c3\u30af\u30b9", "example.org", "TheMatrIX")
    assert check_integrity(m, key) and not check_integrity(m2, key)


def test_truncations_raise():
    for sample in (SAMPLE_REQUEST, SAMPLE_IPV4_RESPONSE, SAMPLE_IPV6_RESPONSE, SAMPLE_LONG_TERM):
        for n in range(len(sample)):
            with pytest.raises(StunError):
                decode(sample[:n])
        with pytest.raises(StunError):
            decode(sample + b"\0\0\0\0")


def test_garbage_raises_stun_error_only():
    rng = random.Random(1234)
    samples = [SAMPLE_REQUEST, SAMPLE_IPV4_RESPONSE, SAMPLE_IPV6_RESPONSE, SAMPLE_LONG_TERM]
    for i in range(20000):
        kind = i % 3
        if kind == 0:       # random bytes
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120)))
        elif kind == 1:     # a valid header, random body with a consistent length
            n = rng.randrange(0, 25) * 4
            body = bytes(rng.getrandbits(8) for _ in range(n))
            data = bytes([0, 1, n >> 8, n & 255]) + SAMPLE_REQUEST[4:20] + body
        else:               # a sample with a few bytes flipped
            data = bytearray(rng.choice(samples))
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            data = bytes(data)
        try:
            m = decode(data)
        except StunError:
            continue
        # whatever decodes must answer every typed accessor without crashing
        for t, _ in m.attrs:
            for f in (m.address, m.text, m.u32):
                try:
                    f(t)
                except StunError:
                    pass
        try:
            m.error()
        except StunError:
            pass
        check_integrity(m, PWD)


def test_non_bytes_input():
    with pytest.raises(StunError):
        decode(12345)
