"""The NAT test bed (erdmampi.testing.natbed): each NAT kind maps and filters as
it claims (STUN answers from coturn, unsolicited datagrams from the public
side), paths can be cut, and teardown leaves nothing behind.  Needs root, nft and
coturn; skipped otherwise."""
import os
import shutil
import subprocess
import threading
import time

import pytest

from erdmampi.nat import stun
from erdmampi.testing import natbed
from erdmampi.testing.natbed import NatBed

_why = natbed.natbed_available(turn=True)
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")

KINDS = ["none", "full_cone", "port_restricted", "symmetric", "udp_blocked"]


def binding(port, server, timeout=1.0):
    """Mapped address from one STUN Binding (retransmitted every 200 ms), or None."""
    req = stun.Message(stun.BINDING)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        port.send(req.encode(), server)
        step = min(0.2, deadline - time.monotonic())
        t_end = time.monotonic() + step
        while time.monotonic() < t_end:
            got = port.recv(max(0.0, t_end - time.monotonic()))
            if got is None:
                break
            m = stun.decode(got[0])
            if m.tid == req.tid:
                return m.mapped_address()
    return None


@pytest.fixture(scope="module")
def bed():
    with NatBed(KINDS) as b:
        b.start_turn()
        yield b


def test_namespaces_exist_and_addresses(bed):
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in bed.namespaces:
        assert ns in listed
    assert bed.host(0).addr == bed.public_address(0)          # none: public itself
    assert bed.host(2).addr.startswith("10.251.")
    assert len(bed.stun_servers) == 2


@pytest.mark.parametrize("site,kind", list(enumerate(KINDS)))
def test_stun_through_each_kind(bed, site, kind):
    p = bed.port(site)
    local = p.local_address()
    mapped = [binding(p, s) for s in bed.stun_servers]
    if kind == "udp_blocked":
        assert mapped == [None, None]
        return
    assert all(m is not None for m in mapped), mapped
    assert {m[0] for m in mapped} == {bed.public_address(site)}
    if kind in ("none", "full_cone", "port_restricted"):
        # endpoint-independent mapping: the same port for both servers (kept as bound)
        assert mapped[0][1] == mapped[1][1] == local[1]
    if kind == "symmetric":
        assert mapped[0][1] != mapped[1][1]
        assert binding(p, bed.stun_servers[0]) == mapped[0]     # same destination: same


def _unsolicited(bed, site, outbound_first):
    """Does a datagram from a fresh public endpoint reach the host's mapped port?"""
    p = bed.port(site)
    mapped = binding(p, bed.stun_servers[0])
    assert mapped is not None
    s = bed.socket("pub", bind=natbed.SERVICE_IPS[1])
    try:
        src = s.getsockname()
        if outbound_first:
            p.send(b"punch", src)
            s.settimeout(1.0)
            assert s.recvfrom(100)[0] == b"punch"
        s.sendto(b"hello", mapped)
        got = p.recv(0.5)
        return got is not None and got[0] == b"hello"
    finally:
        s.close()


def test_filtering(bed):
    assert _unsolicited(bed, 1, outbound_first=False)            # full cone: open
    assert not _unsolicited(bed, 2, outbound_first=False)        # port restricted: closed
    assert _unsolicited(bed, 2, outbound_first=True)             # ... until punched
    assert not _unsolicited(bed, 3, outbound_first=False)        # symmetric: closed


@pytest.mark.skipif(shutil.which("conntrack") is None, reason="conntrack not installed")
def test_cut_and_restore_path(bed):
    p = bed.port(2)
    assert binding(p, bed.stun_servers[0]) is not None
    bed.cut_path(2)
    assert binding(p, bed.stun_servers[0], timeout=0.6) is None
    assert "10.251.2.2" not in bed.conntrack(2) or "UNREPLIED" in bed.conntrack(2)
    bed.restore_path(2)
    assert binding(p, bed.stun_servers[0]) is not None


def test_cut_public_host(bed):
    p = bed.port(0)
    bed.cut_path(0)
    try:
        assert binding(p, bed.stun_servers[0], timeout=0.6) is None
    finally:
        bed.restore_path(0)
    assert binding(p, bed.stun_servers[0]) is not None


def _blast(bed, site, seconds):
    """Bytes that reach a public socket from a host at ``site`` sending
    1000-byte datagrams as fast as it can for ``seconds``."""
    rx = bed.socket("pub", bind=natbed.SERVICE_IPS[1])
    rx.settimeout(0.3)
    got = [0]

    def drain():
        try:
            while True:
                got[0] += len(rx.recv(2048))
        except OSError:       # the timeout once the sender stopped
            pass

    t = threading.Thread(target=drain)
    t.start()
    p = bed.port(site)
    payload, dst = b"x" * 1000, rx.getsockname()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        p.send(payload, dst)
    t.join(10)
    rx.close()
    return got[0]


def test_shaped_uplink(bed):
    bed.shape_uplink(1, 4_000_000)       # 4 Mbit/s: 500 kB/s on the wire
    try:
        shaped = _blast(bed, 1, 1.0)
    finally:
        bed.shape_uplink(1, None)
    # 1000 of every 1042 wire bytes are payload, plus the 1 ms burst and the
    # 64 KiB queue emptying after the sender stopped
    assert 350_000 < shaped < 650_000, shaped
    assert _blast(bed, 1, 0.5) > 2_000_000          # the limit is gone again
    with pytest.raises(natbed.NatBedError):
        bed.shape_uplink(0, 1_000_000)              # a public host has no router


def test_teardown_leaves_nothing():
    b = NatBed(["port_restricted", "none"], hosts=2)
    with pytest.raises(RuntimeError, match="boom"):
        with b:
            b.start_turn(port=3479)
            pid = int((b.tmpdir / "turnserver.pid").read_text().strip()) \
                if (b.tmpdir / "turnserver.pid").exists() else b._procs[0].pid
            assert binding(b.port(0, 1), b.stun_servers[0]) is not None
            raise RuntimeError("boom")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in b.namespaces)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


def test_bad_arguments():
    with pytest.raises(ValueError):
        NatBed(["carrier_grade"])
    with pytest.raises(ValueError):
        NatBed([])
    with pytest.raises(ValueError):
        NatBed(["none", "none"], hosts=[1])
