"""TURN client (erdmampi.nat.turn) against a real coturn in the NAT bed:
allocation, refused credentials, permissions, channels, data both ways through
the relay, refresh, stale nonce; ChannelData framing.  Needs root, nft, coturn."""
import time

import pytest

from erdmampi.nat import NatError
from erdmampi.nat.turn import (TurnClient, TurnError, channel_unwrap, channel_wrap,
                               is_channel_data)
from erdmampi.testing import natbed
from erdmampi.testing.natbed import NatBed

_why = natbed.natbed_available(turn=True)
needs_bed = pytest.mark.skipif(_why is not None, reason=_why or "")


# ---- framing (no bed) -------------------------------------------------------------

def test_channel_framing():
    f = channel_wrap(0x4001, b"abc")
    assert f == b"\x40\x01\x00\x03abc" and is_channel_data(f)
    assert channel_unwrap(f) == (0x4001, b"abc")
    assert channel_unwrap(f + b"\0") == (0x4001, b"abc")           # padding ignored
    assert channel_unwrap(channel_wrap(0x4FFF, b"")) == (0x4FFF, b"")
    for bad in (b"", b"\x40\x01\x00", b"\x40\x01\x00\x05abc", b"\x00\x01\x00\x00",
                b"\x50\x00\x00\x00"):
        with pytest.raises(TurnError):
            channel_unwrap(bad)
    for ch in (0x3FFF, 0x5000):
        with pytest.raises(TurnError):
            channel_wrap(ch, b"x")
    assert issubclass(TurnError, NatError)


def test_malformed_answers_raise_turn_error():
    """A 'server' (a UDP socket on loopback) answers with attributes that do not parse:
    the client raises TurnError (before: StunError escaped, e.g. a 3-byte ERROR-CODE)."""
    import socket
    import threading

    from erdmampi.nat import stun
    from erdmampi.nat.port import SocketPort
    from erdmampi.nat.stun import ATTR, Message

    answers = [
        lambda m: Message(m.method, stun.ERROR, m.tid).add(ATTR.ERROR_CODE, b"\0\0\4"),
        lambda m: Message(m.method, stun.ERROR, m.tid).add_error(401)
        .add(ATTR.REALM, b"\xff\xfe").add_text(ATTR.NONCE, "n"),
        lambda m: Message(m.method, stun.SUCCESS, m.tid).add(ATTR.XOR_RELAYED_ADDRESS, b"\0\1"),
        lambda m: Message(m.method, stun.SUCCESS, m.tid)
        .add_address(ATTR.XOR_RELAYED_ADDRESS, ("198.18.0.1", 5)).add(ATTR.LIFETIME, b"\0"),
    ]
    for answer in answers:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv:
            srv.bind(("127.0.0.1", 0))
            srv.settimeout(3)

            def serve():
                data, addr = srv.recvfrom(2048)
                srv.sendto(answer(stun.decode(data)).encode(), addr)

            t = threading.Thread(target=serve, daemon=True)
            t.start()
            port = SocketPort("127.0.0.1", 0)
            try:
                c = TurnClient(port, srv.getsockname(), "u", "p", timeout=2)
                with pytest.raises(TurnError, match="malformed Allocate response"):
                    c.allocate()
                assert c.relayed is None
            finally:
                port.close()
                t.join(3)


# ---- against coturn -----------------------------------------------------------------

@pytest.fixture(scope="module")
def bed():
    with NatBed(["port_restricted", "none", "udp_blocked"]) as b:
        b.start_turn()
        yield b


def _client(bed, site=0, password=natbed.TURN_PASSWORD, **kw):
    return TurnClient(bed.port(site), bed.turn_server, natbed.TURN_USER, password, **kw)


def _recv_relayed(client, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.backlog.popleft() if client.backlog else \
            client.port.recv(deadline - time.monotonic())
        if got is None:
            return None
        r = client.handle(*got)
        if r is not None:
            return r
    return None


@needs_bed
def test_allocate(bed):
    c = _client(bed)
    relayed = c.allocate()
    assert relayed[0] == natbed.SERVICE_IPS[0] and 49160 <= relayed[1] <= 49999
    assert c.mapped == (bed.public_address(0), c.port.local_address()[1])
    assert c.realm == natbed.TURN_REALM and c.lifetime > 0
    assert c.allocate() == relayed                      # idempotent
    c.close()
    assert c.relayed is None


@needs_bed
def test_wrong_password_refused(bed):
    c = _client(bed, password="not-the-password")
    with pytest.raises(TurnError, match=r"refused the credentials of user 'natuser'.*401") as e:
        c.allocate()
    assert e.value.code == 401 and c.relayed is None


@needs_bed
def test_server_unreachable(bed):
    c = _client(bed, site=2, timeout=1.0)
    with pytest.raises(TurnError, match="no answer to Allocate within 1 s"):
        c.allocate()


@needs_bed
def test_requires_allocation(bed):
    with pytest.raises(TurnError, match="no allocation"):
        _client(bed).create_permission([("198.18.0.9", 1)])


@needs_bed
def test_data_both_ways_indications_and_channels(bed):
    c = _client(bed)
    relayed = c.allocate()
    peer = bed.port(1)
    paddr = (bed.public_address(1), peer.local_address()[1])
    # no permission yet: the relay drops the peer's datagram
    peer.send(b"too early", relayed)
    assert _recv_relayed(c, 0.5) is None
    c.create_permission([paddr])
    assert paddr[0] in c.permissions
    peer.send(b"ping", relayed)
    assert _recv_relayed(c) == (b"ping", paddr)          # Data indication
    c.send(b"pong", paddr)                                # Send indication
    got = peer.recv(2.0)
    assert got == (b"pong", relayed)
    ch = c.channel_bind(paddr)
    assert 0x4000 <= ch <= 0x4FFF and c.relay_info(paddr) == {
        "turn_server": bed.turn_server, "channel": ch, "peer": paddr}
    assert c.channel_bind(paddr) == ch                    # refresh keeps the number
    big = bytes(range(256)) * 4
    c.send(big, paddr)                                     # ChannelData
    assert peer.recv(2.0) == (big, relayed)
    peer.send(b"over the channel", relayed)
    raw = None
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        raw = c.port.recv(1.0)
        if raw and raw[1] == bed.turn_server:
            break
    assert raw is not None and is_channel_data(raw[0])     # the server used the channel
    assert c.handle(*raw) == (b"over the channel", paddr)
    # a second peer gets the next channel
    peer2 = bed.port(1)
    p2 = (bed.public_address(1), peer2.local_address()[1])
    assert c.channel_bind(p2) == ch + 1
    # refresh and maintenance
    assert c.refresh() > 0
    assert c.maintain() == []                             # nothing due now
    done = c.maintain(now=time.monotonic() + 10_000)      # everything due
    assert "allocation" in done and f"channel {ch:#x}" in done
    c.send(b"after maintain", paddr)
    assert peer.recv(2.0) == (b"after maintain", relayed)
    c.close()
    peer.send(b"after close", relayed)
    assert _recv_relayed(c, 0.5) is None


@needs_bed
@pytest.mark.slow
def test_stale_nonce_is_renewed(bed):
    port = 3480
    bed.start_turn(port=port, extra=["--stale-nonce=1"])
    c = TurnClient(bed.port(0), (natbed.SERVICE_IPS[0], port), natbed.TURN_USER,
                   natbed.TURN_PASSWORD)
    c.allocate()
    first = c.nonce
    time.sleep(2.5)
    assert c.refresh() > 0                                # 438 -> new nonce -> retried
    assert c.nonce != first
    c.close()


@needs_bed
@pytest.mark.skipif(__import__("shutil").which("conntrack") is None,
                    reason="conntrack not installed")
@pytest.mark.parametrize("kind", ["port_restricted", "symmetric"])
def test_maintain_across_a_cut_path(kind):
    """A cut path makes maintain() fail within its timeout; after the path comes
    back with its NAT mappings flushed, a port-keeping NAT still reaches the same
    allocation, a symmetric one does not (437, named)."""
    with NatBed([kind, "none"]) as bed:
        bed.start_turn()
        c = _client(bed, timeout=1.0)
        relayed = c.allocate()
        peer = bed.port(1)
        paddr = (bed.public_address(1), peer.local_address()[1])
        ch = c.channel_bind(paddr)
        later = time.monotonic() + 10_000
        bed.cut_path(0)
        t = time.monotonic()
        with pytest.raises(TurnError, match="no answer to Refresh within 1 s"):
            c.maintain(now=later)
        assert time.monotonic() - t < 3
        bed.restore_path(0)
        if kind == "port_restricted":
            assert "allocation" in c.maintain(now=later)
            c.send(b"\x41back", paddr)
            assert peer.recv(2.0) == (b"\x41back", relayed)
            peer.send(b"\x41and forth", relayed)
            assert _recv_relayed(c) == (b"\x41and forth", paddr)
            assert c.channels[paddr] == ch
        else:
            with pytest.raises(TurnError, match="437.*allocation is gone") as e:
                c.maintain(now=later)
            assert e.value.code == 437
