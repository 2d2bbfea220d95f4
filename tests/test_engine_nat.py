"""The engine's NAT side (ext/src/erdma_nat.c): STUN/TURN demultiplexing on the
QUIC socket, the raw side channel (before and after connect), TURN relay tunnels
through a real coturn (always, and as a fallback when the direct path is cut
mid-transfer), malformed input, and the authenticated join (strangers never
reach matching).  Relay tests run in a private network namespace (root)."""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from erdmampi import _engine
from erdmampi._engine import ANY_SOURCE, ANY_TAG, Engine, EngineError
from erdmampi.nat.engine_port import EnginePort

pytestmark = pytest.mark.timeout(120)

CTX = 5
WAIT = 30.0
MAGIC = 0x2112A442
SIZES = [0, 1, 100, 1400, 65536, 65537, 1 << 20, 8 << 20]


# ---------------------------------------------------------------- helpers
def stun_binding(tid: bytes | None = None, attrs: bytes = b"") -> bytes:
    """A STUN Binding request (RFC 8489 header + raw attributes)."""
    tid = tid or os.urandom(12)
    return struct.pack("!HHI12s", 0x0001, len(attrs), MAGIC, tid) + attrs


def payload(n: int, seed: int) -> bytes:
    """n bytes that differ at every offset from other seeds' (catches shifts)."""
    block = bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(4099))
    return (block * (n // len(block) + 1))[:n]


def host_port(eng: Engine) -> tuple[str, int]:
    host, port = eng.local_addr.rsplit(":", 1)
    return host, int(port)


def post_send(eng: Engine, data: bytes, dest: int, tag: int):
    buf = bytearray(data) or bytearray(1)
    cbuf = _engine.ffi.from_buffer(buf)
    return eng.isend(int(_engine.ffi.cast("uintptr_t", cbuf)), len(data), dest, tag, CTX,
                     keep=(buf, cbuf))


def exchange(a: Engine, b: Engine, sizes, seed=0, tag0=100):
    """a sends every size to b (b -> a echoes the count); contents checked."""
    recvs = [b.irecv_alloc(a.rank, tag0 + i, CTX) for i in range(len(sizes))]
    sends = [post_send(a, payload(n, seed + i), b.rank, tag0 + i) for i, n in enumerate(sizes)]
    for i, (r, n) in enumerate(zip(recvs, sizes)):
        st = r.wait(WAIT)
        assert st.error == 0 and st.nbytes == n and st.source == a.rank
        assert bytes(r.take()) == payload(n, seed + i), f"message {i} ({n} B) corrupted"
        r.free()
    for s in sends:
        assert s.wait(WAIT).error == 0
        s.free()


def connect_all(*engines):
    errors = []

    def go(e):
        try:
            e.connect()
        except Exception as exc:  # reported below
            errors.append(exc)
    ts = [threading.Thread(target=go, args=(e,)) for e in engines]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    assert not errors, errors


@pytest.fixture
def engines():
    made = []

    def make(rank, size=2, **kw):
        kw.setdefault("connect_timeout", 20.0)
        kw.setdefault("idle_timeout", 20.0)
        e = Engine.create(rank, size, **kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown(timeout=5.0)


def pair(make, **kw):
    a, b = make(0, **kw), make(1, **kw)
    a.set_peer(1, *host_port(b), b.fingerprint)
    b.set_peer(0, *host_port(a), a.fingerprint)
    return a, b


# ------------------------------------------------------ raw side channel
def test_raw_send_recv_before_connect(engines):
    e = engines(0)
    port = EnginePort(e)
    assert port.local_address() == host_port(e)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(5)
        req = stun_binding()
        s.sendto(req, port.local_address())
        got = port.recv(5.0)
        assert got == (req, s.getsockname())
        port.send(b"reply", s.getsockname())
        assert s.recvfrom(100) == (b"reply", port.local_address())
        # not STUN (wrong cookie / bits / length; the shared-memory doorbell): not queued
        bad_cookie = bytearray(stun_binding()); bad_cookie[4] ^= 1
        bad_len = stun_binding()[:2] + b"\x00\x04" + stun_binding()[4:]
        for d in (bytes(bad_cookie), bad_len, b"\x80" + req[1:], b"\x00", req[:19]):
            s.sendto(d, port.local_address())
        assert port.recv(0.3) is None
        st = e.stats()
        assert st["raw_queued"] == 1 and st["raw_dropped"] == 0 and st["pkts_recv"] == 6
    t0 = time.monotonic()
    assert e.raw_recv(0.2) is None
    assert 0.15 < time.monotonic() - t0 < 5
    with pytest.raises(EngineError):
        e.raw_send(b"x", "not-an-address.invalid", 1)


def test_raw_queue_is_bounded(engines):
    e, other = pair(engines)
    connect_all(e, other)  # the progress thread reads the socket; nobody reads the queue
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(400):
            s.sendto(stun_binding(struct.pack("!I8x", i)), host_port(e))
            if i % 50 == 0:
                time.sleep(0.01)
    deadline = time.monotonic() + 10
    while e.stats()["raw_queued"] + e.stats()["raw_dropped"] < 400:
        assert time.monotonic() < deadline, e.stats()
        time.sleep(0.01)
    got = []
    while (d := e.raw_recv(0.5)) is not None:
        got.append(struct.unpack_from("!I", d[0], 8)[0])
    st = e.stats()
    assert len(got) == 256 == st["raw_queued"] and st["raw_dropped"] == 144
    assert got == list(range(256))  # in order, the newest dropped


def test_demux_under_concurrent_quic(engines):
    a, b = pair(engines)
    connect_all(a, b)
    n_stun = 200
    seen = []

    def reader():
        while (d := a.raw_recv(2.0)) is not None:
            seen.append(d[0])
            if len(seen) == n_stun:
                return

    def blaster():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(n_stun):
                s.sendto(stun_binding(struct.pack("!I8x", i)), host_port(a))
                if i % 20 == 0:
                    time.sleep(0.005)
    rt, bt = threading.Thread(target=reader), threading.Thread(target=blaster)
    rt.start()
    bt.start()
    exchange(a, b, SIZES, seed=1)
    exchange(b, a, SIZES, seed=2, tag0=200)
    bt.join(30)
    rt.join(30)
    assert sorted(struct.unpack_from("!I", d, 8)[0] for d in seen) == list(range(n_stun))
    assert a.stats()["raw_dropped"] == 0
    assert a.peer_route(1) == "direct" and a.peer_route(0) == "self"


def test_malformed_datagrams_do_not_crash(engines):
    """Random bytes, truncated STUN, ChannelData with wrong lengths or unbound
    channels from a registered TURN address, garbage on a bound channel: the
    engines survive and keep delivering messages intact."""
    a, b = pair(engines)
    rng = random.Random(6)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as turn, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
        turn.bind(("127.0.0.1", 0))
        a.add_turn_server(*turn.getsockname())
        # a FALLBACK tunnel: garbage on its channel must not flip the route
        a.set_peer_relay(1, *turn.getsockname(), 0x4001, "127.0.0.1", 9, fallback=True)
        connect_all(a, b)
        stun = stun_binding(attrs=b"\x80\x22\x00\x04abcd")
        cases = [b"", b"\x40", b"\x40\x01", b"\x40\x01\x00", b"\x40\x01\x00\x05abc",
                 b"\x40\x01\xff\xff" + b"x" * 10, b"\x40\x01\x00\x01" + b"xxxxxxxx",
                 b"\x4f\xff\x00\x00", b"\x40\x02\x00\x03abc", b"\x40\x01\x00\x00",
                 stun[:4], stun[:19], stun[:20], stun + b"\0", stun[:-1]]
        for _ in range(2000):
            n = rng.choice([0, 1, 3, 4, 5, 19, 20, 21, 24, 64, 1200, 1500, rng.randrange(3000)])
            d = bytearray(rng.randbytes(n))
            if n >= 4 and rng.random() < 0.5:
                d[0] = 0x40 | (d[0] & 0x0F)
                if rng.random() < 0.5:
                    d[1] = 0x01
                    d[2:4] = struct.pack("!H", max(0, n - 4 + rng.choice([-1, 0, 1, 3, 4])))
            elif n >= 8 and rng.random() < 0.5:
                d[0] &= 0x3F
                d[4:8] = struct.pack("!I", MAGIC)
            cases.append(bytes(d))
        for d in cases:
            turn.sendto(d, host_port(a))
            other.sendto(d, host_port(a))
            other.sendto(d, host_port(b))
        exchange(a, b, [0, 5, 70000, 1 << 20], seed=3)
        exchange(b, a, [7, 1 << 20], seed=4, tag0=300)
        while a.raw_recv(0.2) is not None:
            pass
    st = a.stats()
    # from the TURN address: ChannelData of the bound channel went to QUIC (and
    # was rejected there), the rest to the raw queue (a socket may lose some)
    assert st["relay_recv"] > 0
    assert st["raw_queued"] + st["raw_dropped"] > len(cases) // 2
    assert st["relay_sent"] == 0
    assert a.peer_route(1) == "direct"  # garbage on the channel is not the peer
    assert a.peer_error(1) == 0 and b.peer_error(0) == 0


def test_relay_api_validation(engines):
    a = engines(0, size=3)
    with pytest.raises(EngineError):
        a.set_peer_relay(0, "127.0.0.1", 3478, 0x4001, "127.0.0.1", 5000)  # self
    with pytest.raises(EngineError):
        a.set_peer_relay(3, "127.0.0.1", 3478, 0x4001, "127.0.0.1", 5000)  # no such rank
    for ch in (0x3FFF, 0x5000, 0):
        with pytest.raises(EngineError):
            a.set_peer_relay(1, "127.0.0.1", 3478, ch, "127.0.0.1", 5000)
    a.set_peer_relay(1, "127.0.0.1", 3478, 0x4001, "127.0.0.1", 5000)
    with pytest.raises(EngineError):  # one peer per (server, channel)
        a.set_peer_relay(2, "127.0.0.1", 3478, 0x4001, "127.0.0.1", 5001)
    a.set_peer_relay(2, "127.0.0.1", 3479, 0x4001, "127.0.0.1", 5001)  # other server: fine
    assert a.peer_route(1) == "relay" and a.peer_route(2) == "relay"
    a.clear_peer_relay(1)
    assert a.peer_route(1) == "direct"
    a.set_peer_relay(1, "127.0.0.1", 3478, 0x4001, "127.0.0.1", 5000, fallback=True)
    assert a.peer_route(1) == "direct"
    with pytest.raises(ValueError):
        Engine.create(0, 2, keepalive=-1)
    with pytest.raises(ValueError):
        Engine.create(0, 2, path_timeout=0)


# ------------------------------------------------------------ coturn bed
_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(ns: str, fn):
    """Run fn() in a thread that entered network namespace ns (sockets it makes stay there)."""
    out = {}

    def work():
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {ns}")
            finally:
                os.close(fd)
            out["v"] = fn()
        except BaseException as e:
            out["e"] = e
    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


class RelayBed:
    """A private namespace with loopback only, coturn on 127.0.0.1 and an nft
    table whose 'cut' chain drops UDP between chosen ports."""
    USER, PASSWORD, REALM = "natc", "natcpass", "natc"
    PORT = 3478

    def __init__(self):
        self.ns = f"natc-{os.getpid()}-{random.randrange(1 << 20)}"
        self.tmp = Path(tempfile.mkdtemp(prefix="natc-"))
        self.proc = None

    def sh(self, *argv, input=None, check=True):
        return subprocess.run(["ip", "netns", "exec", self.ns, *map(str, argv)], input=input,
                              capture_output=True, text=True, check=check, timeout=20)

    def start(self):
        subprocess.run(["ip", "netns", "add", self.ns], check=True, timeout=20)
        self.sh("ip", "link", "set", "lo", "up")
        self.sh("nft", "-f", "-", input=(
            "table inet natc {\n  chain out {\n    type filter hook output priority 0; "
            "policy accept;\n  }\n}\n"))
        log = open(self.tmp / "turn.log", "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "turnserver", "-n", "--listening-ip=127.0.0.1",
             "--relay-ip=127.0.0.1", f"--listening-port={self.PORT}", "--lt-cred-mech",
             f"--user={self.USER}:{self.PASSWORD}", f"--realm={self.REALM}", "--no-cli",
             "--no-tls", "--no-dtls", "--log-file=stdout", "--simple-log",
             "--min-port=49160", "--max-port=49400", f"--pidfile={self.tmp / 'turn.pid'}",
             f"--userdb={self.tmp / 'turndb'}", "--allow-loopback-peers"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        s = in_netns(self.ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        try:
            s.settimeout(0.2)
            deadline = time.monotonic() + 15
            while True:
                assert self.proc.poll() is None, (self.tmp / "turn.log").read_text()
                assert time.monotonic() < deadline, "coturn did not answer"
                req = stun_binding()
                s.sendto(req, ("127.0.0.1", self.PORT))
                try:
                    if s.recvfrom(2048)[0][8:20] == req[8:20]:
                        break
                except OSError:
                    pass
        finally:
            s.close()
        return self

    def engine(self, rank, size=2, **kw):
        kw.setdefault("connect_timeout", 30.0)
        kw.setdefault("idle_timeout", 30.0)
        return in_netns(self.ns, lambda: Engine.create(rank, size, **kw))

    def cut(self, port_a, port_b):
        """Drop UDP between the two ports (both directions), counted."""
        for s, d in ((port_a, port_b), (port_b, port_a)):
            self.sh("nft", "add", "rule", "inet", "natc", "out", "udp", "sport", s, "udp",
                    "dport", d, "counter", "drop")

    def restore(self):
        """Undo every cut."""
        self.sh("nft", "flush", "chain", "inet", "natc", "out")

    def dropped(self) -> int:
        out = self.sh("nft", "list", "chain", "inet", "natc", "out").stdout
        return sum(int(w.split()[1]) for w in out.split("counter")[1:])

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        subprocess.run(["ip", "netns", "del", self.ns], timeout=20, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


_why = None
if os.geteuid() != 0:
    _why = "needs root (network namespace)"
elif not (shutil.which("turnserver") and shutil.which("nft")):
    _why = "needs coturn and nft"
needs_bed = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture
def bed():
    b = RelayBed()
    try:
        yield b.start()
    finally:
        b.close()


def setup_relay(bed, fallback, **kw):
    """Two engines, a TURN allocation each (through their EnginePorts), channels
    bound to each other's relayed address, relay tunnels set; not connected."""
    from erdmampi.nat.turn import TurnClient
    engs = [bed.engine(r, **kw) for r in (0, 1)]
    server = ("127.0.0.1", bed.PORT)
    turns = [TurnClient(EnginePort(e), server, bed.USER, bed.PASSWORD) for e in engs]
    relayed = [t.allocate() for t in turns]
    for i, (e, t) in enumerate(zip(engs, turns)):
        peer = relayed[1 - i]
        t.create_permission([peer])
        ch = t.channel_bind(peer)
        e.set_peer(1 - i, *host_port(engs[1 - i]), engs[1 - i].fingerprint)
        e.set_peer_relay(1 - i, *server, ch, *peer, fallback=fallback)
    return engs, turns


@needs_bed
@pytest.mark.slow
@pytest.mark.parametrize("pkt", [0, 1452], ids=["loopback-64k", "pkt1452"])
def test_relay_always_through_coturn(bed, pkt):
    (a, b), turns = setup_relay(bed, fallback=False, max_udp_payload=pkt)
    try:
        # the direct path is cut from the start: only the relay can carry QUIC
        bed.cut(host_port(a)[1], host_port(b)[1])
        assert a.peer_route(1) == b.peer_route(0) == "relay"
        connect_all(a, b)
        exchange(a, b, SIZES, seed=5)
        exchange(b, a, SIZES, seed=6, tag0=400)
        sa, sb = a.stats(), b.stats()
        assert sa["relay_sent"] > 0 and sa["relay_recv"] > 0
        assert sb["relay_sent"] > 0 and sb["relay_recv"] > 0
        # every QUIC packet went through the relay, none tried the direct path
        assert sa["relay_sent"] == sa["pkts_sent"] and sb["relay_sent"] == sb["pkts_sent"]
        assert bed.dropped() == 0
        assert a.peer_route(1) == b.peer_route(0) == "relay"
    finally:
        for e in (a, b):
            e.shutdown(5.0)


def all_arrived_once(b, recvs, sends, sizes, total):
    """Message i (payload(sizes[i], i)) arrived intact at b, every send
    completed, and b received ``total`` messages in all: none lost, none twice."""
    for i, r in enumerate(recvs):
        st = r.wait(WAIT)
        assert st.error == 0 and st.nbytes == sizes[i]
        assert bytes(r.take()) == payload(sizes[i], i), f"message {i} corrupted"
        r.free()
    for s in sends:
        assert s.wait(WAIT).error == 0
    assert b.iprobe(ANY_SOURCE, ANY_TAG, CTX) is None
    assert b.stats()["msgs_recv"] == total


def fallback_run(a, b, cut, dropped):
    """a and b connected over the direct path with FALLBACK tunnels; numbered
    messages (eager, and a rendezvous one every 50) flow while cut() kills the
    direct path: every message arrives once, intact, and both ends end up on
    the relay."""
    assert a.peer_route(1) == b.peer_route(0) == "direct"
    exchange(a, b, [10, 1 << 20], seed=7)
    assert a.stats()["relay_sent"] == 0 and b.stats()["relay_sent"] == 0
    n = 200
    sizes = [(1 << 20) + i if i % 50 == 25 else 20000 + i for i in range(n)]
    recvs = [b.irecv_alloc(0, 1000 + i, CTX) for i in range(n)]
    sends = []
    for i in range(n):
        sends.append(post_send(a, payload(sizes[i], i), 1, 1000 + i))
        if i == n // 3:
            cut()
        time.sleep(0.005)
    all_arrived_once(b, recvs, sends, sizes, 2 + n)
    assert dropped() > 0  # the direct path really was used, and cut
    assert a.peer_route(1) == "relay" and b.peer_route(0) == "relay"
    assert a.stats()["relay_sent"] > 0 and b.stats()["relay_sent"] > 0
    exchange(b, a, [3, 1 << 20], seed=8, tag0=500)  # both ways afterwards


@needs_bed
@pytest.mark.slow
def test_relay_fallback_when_direct_path_is_cut(bed):
    (a, b), turns = setup_relay(bed, fallback=True, path_timeout=1.0, keepalive=0.5,
                                max_udp_payload=1452, verbose=1)
    try:
        connect_all(a, b)
        fallback_run(a, b, lambda: bed.cut(host_port(a)[1], host_port(b)[1]), bed.dropped)
    finally:
        for e in (a, b):
            e.shutdown(5.0)


@needs_bed
@pytest.mark.slow
def test_relay_fallback_returns_to_direct_when_restored(bed):
    """Messages flow while the direct path is cut (both ends move to the relay)
    and then restored (both move back, found by the probes of the direct path):
    every message arrives once and intact, and traffic leaves the relay."""
    (a, b), turns = setup_relay(bed, fallback=True, path_timeout=1.0, keepalive=0.5,
                                direct_recheck=1.0, max_udp_payload=1452, verbose=1)
    recvs, sends, sizes = [], [], []

    def pump(k):
        for _ in range(k):
            i = len(sizes)
            sizes.append((1 << 20) + i if i % 50 == 25 else 20000 + i)
            recvs.append(b.irecv_alloc(0, 1000 + i, CTX))
            sends.append(post_send(a, payload(sizes[i], i), 1, 1000 + i))
            time.sleep(0.005)

    def pump_until(route, limit):
        t0 = time.monotonic()
        while not (a.peer_route(1) == b.peer_route(0) == route):
            assert time.monotonic() - t0 < limit, \
                f"routes {a.peer_route(1)}/{b.peer_route(0)}, not {route}, after {limit} s"
            pump(5)
        return time.monotonic() - t0
    try:
        connect_all(a, b)
        assert a.peer_route(1) == b.peer_route(0) == "direct"
        pump(50)
        bed.cut(host_port(a)[1], host_port(b)[1])
        pump_until("relay", 20)
        pump(50)
        assert bed.dropped() > 0
        relayed = a.stats()["relay_sent"]
        assert relayed > 0
        bed.restore()
        back = pump_until("direct", 20)
        pump(50)
        all_arrived_once(b, recvs, sends, sizes, len(sizes))
        sa, sb = a.stats(), b.stats()
        for st in (sa, sb):
            assert st["to_relay"] == 1 and st["to_direct"] == 1, st
        assert sa["direct_probes"] + sb["direct_probes"] > 0
        from erdmampi.diagnostics import stats_lines
        assert any("1 move(s) to the relay, 1 back to the direct path" in ln
                   for ln in stats_lines(a)), stats_lines(a)
        assert back < 10, f"back to the direct path after {back:.1f} s"
        # on the direct path again: nothing more goes through the relay
        before = a.stats()["relay_sent"], b.stats()["relay_sent"]
        exchange(a, b, [10, 1 << 20], seed=9, tag0=5000)
        exchange(b, a, [10, 1 << 20], seed=10, tag0=6000)
        assert (a.stats()["relay_sent"], b.stats()["relay_sent"]) == before
        assert a.peer_route(1) == b.peer_route(0) == "direct"
    finally:
        for e in (a, b):
            e.shutdown(5.0)


@needs_bed
@pytest.mark.slow
def test_relay_first_moves_to_direct_once_it_answers(bed):
    """A pair that starts on the relay (relay_first: the checks found no
    direct path in time) connects there, and moves to the direct path once
    that passes packets, with its messages intact."""
    from erdmampi.nat.turn import TurnClient
    engs = [bed.engine(r, path_timeout=1.0, keepalive=0.5, direct_recheck=1.0,
                       max_udp_payload=1452, verbose=1) for r in (0, 1)]
    a, b = engs
    try:
        server = ("127.0.0.1", bed.PORT)
        turns = [TurnClient(EnginePort(e), server, bed.USER, bed.PASSWORD) for e in engs]
        relayed = [t.allocate() for t in turns]
        bed.cut(host_port(a)[1], host_port(b)[1])   # no direct path at first
        for i, (e, t) in enumerate(zip(engs, turns)):
            t.create_permission([relayed[1 - i]])
            ch = t.channel_bind(relayed[1 - i])
            e.set_peer(1 - i, *host_port(engs[1 - i]), engs[1 - i].fingerprint)
            e.set_peer_relay(1 - i, *server, ch, *relayed[1 - i], relay_first=True)
        assert a.peer_route(1) == b.peer_route(0) == "relay"
        connect_all(a, b)
        exchange(a, b, SIZES, seed=13)
        assert a.peer_route(1) == b.peer_route(0) == "relay"
        t0 = time.monotonic()
        while bed.dropped() == 0:      # probes of the direct path go out, and are cut
            assert time.monotonic() - t0 < 5, "no probe of the direct path in 5 s"
            exchange(a, b, [20000], seed=13, tag0=8000)
        assert a.peer_route(1) == b.peer_route(0) == "relay"
        bed.restore()
        t0 = time.monotonic()
        k = 0
        while not (a.peer_route(1) == b.peer_route(0) == "direct"):
            assert time.monotonic() - t0 < 10, "still on the relay 10 s after the path opened"
            exchange(a, b, [20000], seed=14 + k, tag0=9000 + k)
            k += 1
        exchange(a, b, SIZES, seed=15, tag0=10000)
        exchange(b, a, SIZES, seed=16, tag0=11000)
        for e in engs:
            st = e.stats()
            assert st["to_direct"] == 1 and st["to_relay"] == 0, st
    finally:
        for e in engs:
            e.shutdown(5.0)


@needs_bed
@pytest.mark.slow
def test_relay_fallback_stays_on_relay_when_rechecks_are_off(bed):
    """ERDMA_DIRECT_RECHECK=0: a restored direct path is not taken back."""
    (a, b), turns = setup_relay(bed, fallback=True, path_timeout=1.0, keepalive=0.5,
                                direct_recheck=0, max_udp_payload=1452)
    try:
        connect_all(a, b)
        bed.cut(host_port(a)[1], host_port(b)[1])
        t0 = time.monotonic()
        while not (a.peer_route(1) == b.peer_route(0) == "relay"):
            assert time.monotonic() - t0 < 20
            exchange(a, b, [20000], seed=11, tag0=7000)
        bed.restore()
        for k in range(20):
            exchange(a, b, [20000], seed=12, tag0=8000 + k)
            time.sleep(0.1)
        assert a.peer_route(1) == b.peer_route(0) == "relay"
        assert a.stats()["direct_probes"] == b.stats()["direct_probes"] == 0
    finally:
        for e in (a, b):
            e.shutdown(5.0)


def _quic_initial(host, port):
    """A valid QUIC Initial datagram (aioquic's ClientHello): anyone can make
    one whose protection the receiver's AEAD accepts."""
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    c = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=["x"]))
    c.connect((host, port), now=time.time())
    return c.datagrams_to_send(now=time.time())[0][0]


SPOOF_MARK = 0x5E


@needs_bed
@pytest.mark.slow
def test_spoofed_initials_do_not_hold_a_dead_direct_path_open(bed):
    """The direct path between two FALLBACK ranks is cut; a third party sends
    each rank valid QUIC Initials with the other rank's address and port as
    their source.  Only the peer's own 1-RTT packets count as signs of life,
    so both still move to the relay within path_timeout and the message goes
    through.  (Before: every Initial counted, neither rank ever fell back and
    the message never arrived.)"""
    (a, b), turns = setup_relay(bed, fallback=True, path_timeout=1.0, keepalive=0.5,
                                max_udp_payload=1452)
    raw = in_netns(bed.ns, lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW,
                                                  socket.IPPROTO_RAW))
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, SPOOF_MARK)
    stop, sent = threading.Event(), [0]

    def spoof():
        pa, pb = host_port(a), host_port(b)
        while not stop.is_set():
            for src, dst in ((pa, pb), (pb, pa)):
                q = _quic_initial(*dst)
                udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(q), 0) + q
                ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                                 socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
                raw.sendto(ip + udp, (dst[0], 0))
                sent[0] += 1
            stop.wait(0.3)  # more often than path_timeout, fewer than the pending caps

    t = threading.Thread(target=spoof, daemon=True)
    try:
        connect_all(a, b)
        exchange(a, b, [10], seed=9)
        assert a.peer_route(1) == b.peer_route(0) == "direct"
        # the cut drops the ranks' own datagrams, not the forged ones
        bed.sh("nft", "insert", "rule", "inet", "natc", "out", "meta", "mark", SPOOF_MARK,
               "accept")
        bed.cut(host_port(a)[1], host_port(b)[1])
        t.start()
        r = b.irecv_alloc(0, 77, CTX)
        s = post_send(a, payload(5000, 1), 1, 77)
        st = r.wait(15.0)
        assert st.error == 0 and bytes(r.take()) == payload(5000, 1)
        r.free()
        assert s.wait(WAIT).error == 0
        assert sent[0] >= 4 and bed.dropped() > 0
        assert a.peer_route(1) == "relay" and b.peer_route(0) == "relay"
    finally:
        stop.set()
        if t.is_alive():
            t.join(5)
        raw.close()
        for e in (a, b):
            e.shutdown(5.0)


@needs_bed
@pytest.mark.slow
def test_relay_fallback_between_namespaces():
    """Two hosts in their own namespaces on the NAT bed's public network; an
    nft rule in each drops traffic to and from the other mid-transfer (the TURN
    server stays reachable)."""
    from erdmampi.nat.turn import TurnClient
    from erdmampi.testing import natbed
    with natbed.NatBed(["none", "none"]) as nb:
        server = nb.start_turn()
        engs = [in_netns(nb.host(i).ns, lambda i=i: Engine.create(
            i, 2, bind=nb.host(i).addr, connect_timeout=30.0, idle_timeout=30.0,
            path_timeout=1.0, keepalive=0.5, verbose=1)) for i in (0, 1)]
        try:
            turns = [TurnClient(EnginePort(e), server, natbed.TURN_USER, natbed.TURN_PASSWORD)
                     for e in engs]
            relayed = [t.allocate() for t in turns]
            for i, (e, t) in enumerate(zip(engs, turns)):
                t.create_permission([relayed[1 - i]])
                ch = t.channel_bind(relayed[1 - i])
                e.set_peer(1 - i, *host_port(engs[1 - i]), engs[1 - i].fingerprint)
                e.set_peer_relay(1 - i, *server, ch, *relayed[1 - i], fallback=True)
            connect_all(*engs)

            def cut():
                for i in (0, 1):
                    other = nb.host(1 - i).addr
                    nb.run(nb.host(i), ["nft", "-f", "-"], input=(
                        "table ip natccut {\n  chain o {\n    type filter hook output priority 0;"
                        f" policy accept;\n    ip daddr {other} counter drop;\n  }}\n"
                        "  chain i {\n    type filter hook input priority 0; policy accept;\n"
                        f"    ip saddr {other} counter drop;\n  }}\n}}\n"))

            def dropped():
                out = "".join(nb.run(nb.host(i), ["nft", "list", "table", "ip", "natccut"]).stdout
                              for i in (0, 1))
                return sum(int(w.split()[0]) for w in out.split("packets")[1:])
            fallback_run(*engs, cut, dropped)
        finally:
            for e in engs:
                e.shutdown(5.0)


# ----------------------------------------------------- authenticated join
def test_stranger_engine_is_refused(engines):
    """An engine with its own identity claims rank 1 to rank 0, which pins the
    real rank 1's certificate: refused, and nothing it sent is matched."""
    victim = engines(0, connect_timeout=15.0)
    real = engines(1, connect_timeout=15.0)
    stranger = engines(1, connect_timeout=2.0)
    victim.set_peer(1, *host_port(real), real.fingerprint)
    real.set_peer(0, *host_port(victim), victim.fingerprint)
    stranger.set_peer(0, *host_port(victim), victim.fingerprint)
    done, stop = threading.Event(), threading.Event()
    connecting = threading.Thread(target=lambda: (victim.connect(), done.set()))
    connecting.start()

    def spam():
        # once its connect has begun the stranger may post sends: EAGER frames
        # queue right behind its HELLO
        while not stop.is_set():
            try:
                post_send(stranger, b"\x80\x04 pickle bomb", 0, 1).free()
            except EngineError:
                pass
            time.sleep(0.001)
    spammer = threading.Thread(target=spam)
    spammer.start()
    try:
        with pytest.raises(EngineError):
            stranger.connect()
    finally:
        stop.set()
        spammer.join(10)
    time.sleep(0.3)
    assert victim.stats()["msgs_recv"] == 0
    assert victim.iprobe(ANY_SOURCE, ANY_TAG, CTX) is None
    assert not done.is_set()
    real.connect()  # the real rank still gets in
    connecting.join(20)
    assert done.is_set()
    exchange(real, victim, [5], seed=9)
    assert victim.stats()["msgs_recv"] == 1


def test_aioquic_stranger_never_reaches_matching(engines):
    """A raw QUIC client with a valid handshake but an unknown certificate sends
    HELLO and an EAGER frame in one flight: the HELLO is refused and the EAGER
    is never parsed."""
    pytest.importorskip("aioquic")
    import asyncio
    from quic_peer import ErdmaPeer, Identity, client, configuration

    eng = engines(0, connect_timeout=2.0)
    eng.set_peer(1, "127.0.0.1", 9, Identity.generate("rank-1").fingerprint)
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        async with client(host, port, configuration(True, Identity.generate("stranger"))) as proto:
            peer = ErdmaPeer(proto, rank=1, size=2)
            peer.send_hello()
            sending = asyncio.ensure_future(peer.send(b"\x80\x04evil pickle", tag=1, ctx=CTX))
            with pytest.raises(EngineError):
                await connecting
            sending.cancel()
            assert "HELLO" not in peer.received
    asyncio.run(asyncio.wait_for(main(), 30))
    assert eng.stats()["msgs_recv"] == 0 and eng.stats()["unexpected"] == 0
    assert eng.iprobe(ANY_SOURCE, ANY_TAG, CTX) is None


def test_keepalive_option(engines):
    a, b = pair(engines, keepalive=0.2)
    connect_all(a, b)
    before = a.stats()["pkts_sent"]
    time.sleep(1.5)  # idle: PINGs (and their ACKs) keep flowing
    assert a.stats()["pkts_sent"] - before >= 2
    c, d = pair(engines, keepalive=0)
    connect_all(c, d)
    time.sleep(0.3)
    before = c.stats()["pkts_sent"]
    time.sleep(1.5)
    assert c.stats()["pkts_sent"] - before == 0  # off: an idle connection stays silent


# ------------------------------------------- behind real NATs (erdmampi.testing.natbed)
@needs_bed
@pytest.mark.slow
def test_relay_between_symmetric_nats():
    """Both ranks behind symmetric NATs (a new random port per destination): no
    direct path exists; the TURN tunnel through coturn in the public network
    carries the job, on the ranks' own engine sockets."""
    from erdmampi.nat.turn import TurnClient
    from erdmampi.testing import natbed
    with natbed.NatBed(["symmetric", "symmetric"]) as nb:
        server = nb.start_turn()
        engs = [in_netns(nb.host(i).ns, lambda i=i: Engine.create(
            i, 2, bind=nb.host(i).addr, connect_timeout=30.0, idle_timeout=30.0))
            for i in (0, 1)]
        try:
            turns = [TurnClient(EnginePort(e), server, natbed.TURN_USER, natbed.TURN_PASSWORD)
                     for e in engs]
            relayed = [t.allocate() for t in turns]
            # the server saw the NAT's address, not the host's
            assert turns[0].mapped[0] == nb.public_address(0) != nb.host(0).addr
            for i, (e, t) in enumerate(zip(engs, turns)):
                t.create_permission([relayed[1 - i]])
                ch = t.channel_bind(relayed[1 - i])
                e.set_peer(1 - i, *host_port(engs[1 - i]), engs[1 - i].fingerprint)
                e.set_peer_relay(1 - i, *server, ch, *relayed[1 - i])
            connect_all(*engs)
            exchange(engs[0], engs[1], SIZES, seed=10)
            exchange(engs[1], engs[0], SIZES, seed=11, tag0=600)
            for e in engs:
                st = e.stats()
                assert st["relay_sent"] == st["pkts_sent"] > 0 and st["relay_recv"] > 0
                assert e.peer_route(1 - e.rank) == "relay"
            # the TURN client still works on the port while QUIC runs (refresh)
            assert turns[0].refresh() > 0
        finally:
            for e in engs:
                e.shutdown(5.0)
