"""Connections from strangers cannot crash, stall or exhaust a rank.

A rank accepts QUIC connections before it knows who is calling: the HELLO
names the caller.  These tests attack that window with real QUIC clients
(aioquic, via tests/quic_peer.py) and raw UDP Initials, against real engines
(docs/wire.md, "Certificates and authentication" and "QUIC settings"):

* the client certificate is required and checked inside the TLS handshake;
* an accepted connection has a small flow-control window until its HELLO;
* one without a HELLO after ``hello_timeout`` is closed;
* a full table of such connections drops its oldest; one host gets a bounded
  share; past half the table, Initials from unknown hosts must come back with
  a Retry token, so spoofed sources take no slot.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("aioquic")

from aioquic.quic.connection import QuicConnection  # noqa: E402

from erdmampi._engine import ERR_AUTH, Engine, EngineError  # noqa: E402

from quic_peer import ErdmaPeer, ErdmaProtocol, Identity, configuration  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
SIZE = 2
TABLE = 9 * SIZE + 16  # pending connections a rank of a SIZE-rank job holds
JOB_START_BOUND = 10.0  # seconds a 2-rank job may take to start under attack
ALERT_CERT_REQUIRED = 0x100 + 116
ALERT_BAD_CERT = 0x100 + 42


def host_port(eng: Engine) -> tuple[str, int]:
    host, port = eng.local_addr.rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def engines():
    made = []

    def make(rank: int, size: int = SIZE, **kw) -> Engine:
        kw.setdefault("connect_timeout", 20.0)
        kw.setdefault("idle_timeout", 20.0)
        eng = Engine.create(rank, size, bind="127.0.0.1", port=0, **kw)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.shutdown(timeout=2.0)


def job_pair(make, **kw):
    """Ranks 0 and 1 of a job, each given the other's fingerprint."""
    a, b = make(0, **kw), make(1, **kw)
    a.set_peer(1, *host_port(b), b.fingerprint)
    b.set_peer(0, *host_port(a), a.fingerprint)
    return a, b


def in_thread(fn):
    """Run fn in a thread; returns a function waiting for its result."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def wait(timeout):
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError("still running")
        if "error" in out:
            raise out["error"]
        return out.get("value")
    return wait


async def open_client(src: str, host: str, port: int, identity=None, connect=True,
                      idle_timeout: float = 30.0) -> ErdmaProtocol:
    """An aioquic client connection from local address src (a loopback host)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((src, 0))
    conn = QuicConnection(configuration=configuration(True, identity, idle_timeout=idle_timeout))
    _, proto = await loop.create_datagram_endpoint(lambda: ErdmaProtocol(conn), sock=sock)
    proto.connect((host, port))
    if connect:
        await proto.wait_connected()
    return proto


def initial_datagram(host: str, port: int) -> bytes:
    """A fresh client Initial (new connection IDs) made by aioquic."""
    conn = QuicConnection(configuration=configuration(True))
    now = time.monotonic()
    conn.connect((host, port), now=now)
    return conn.datagrams_to_send(now=now)[0][0]


def wait_until(cond, timeout: float, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


# ----------------------------------------------------------- certificates
def test_empty_fingerprint_refused_unless_insecure(engines, monkeypatch):
    monkeypatch.delenv("ERDMA_INSECURE", raising=False)
    secure = engines(0)
    with pytest.raises(EngineError) as info:
        secure.set_peer(1, "127.0.0.1", 9, "")
    assert info.value.code == ERR_AUTH and "insecure" in str(info.value)
    with pytest.raises(EngineError):
        secure.set_peer(1, "127.0.0.1", 9, None)
    secure.set_peer(1, "127.0.0.1", 9, Identity.generate().fingerprint)  # a real one: fine
    engines(0, insecure=True).set_peer(1, "127.0.0.1", 9, "")
    monkeypatch.setenv("ERDMA_INSECURE", "1")
    engines(0).set_peer(1, "127.0.0.1", 9, "")
    with pytest.raises(EngineError):  # explicit beats the environment
        engines(0, insecure=False).set_peer(1, "127.0.0.1", 9, "")


@pytest.mark.parametrize("presented", ["none", "foreign"])
def test_stranger_fails_inside_tls_handshake(engines, presented):
    """No certificate, or one that is not a job member's: the TLS handshake
    fails (alert), the connection is freed at once, no stream byte is read."""
    a, b = job_pair(engines, hello_timeout=30.0)
    host, port = host_port(a)
    waiting = in_thread(a.connect)

    async def main():
        identity = None if presented == "none" else Identity.generate("erdma-rank-1")
        proto = await open_client("127.0.0.1", host, port, identity)
        peer = ErdmaPeer(proto, rank=1, size=SIZE)
        peer.send_hello()  # would claim rank 1, if the handshake had let it in
        await asyncio.wait_for(proto.wait_closed(), 10)
        return proto.terminated.error_code, peer.received

    code, received = asyncio.run(main())
    assert code == (ALERT_CERT_REQUIRED if presented == "none" else ALERT_BAD_CERT)
    assert received == []
    assert wait_until(lambda: a.stats()["conns_pending"] == 0, 2.0)
    b.connect()  # the real rank 1 still gets in
    waiting(10)


# ------------------------------------------------------------- the floods
FLOOD = 100


@pytest.mark.parametrize("mode", ["secure", "insecure"])
def test_hello_flood_does_not_stop_job_start(engines, mode):
    """FLOOD anonymous clients that never send a HELLO, then a real job starts.

    secure: clients without a certificate from the ranks' own host (they fail
    in TLS).  insecure (empty fingerprints: the handshake lets anyone in):
    FLOOD clients from FLOOD other hosts, which complete the handshake and
    sit; the table fills, Retry and eviction make room.  Before admission
    control the table filled with 34 of them and the job never started."""
    if mode == "secure":
        a, b = job_pair(engines)
    else:
        a, b = engines(0, insecure=True), engines(1, insecure=True)
        a.set_peer(1, *host_port(b), "")
        b.set_peer(0, *host_port(a), "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)

    async def main():
        async def one(i):
            src = "127.0.0.1" if mode == "secure" else f"127.0.1.{i + 1}"
            try:
                return await asyncio.wait_for(open_client(src, host, port), 8.0)
            except (asyncio.TimeoutError, ConnectionError):
                return None
        flood = [asyncio.ensure_future(one(i)) for i in range(FLOOD)]
        await asyncio.sleep(1.0)  # the flood is under way
        t0 = time.monotonic()
        rank1 = in_thread(b.connect)
        started = None
        while started is None and time.monotonic() - t0 < 15.0:
            try:
                rank1(0)
                rank0(0)
                started = time.monotonic() - t0
            except TimeoutError:
                await asyncio.sleep(0.05)
        clients = [c for c in await asyncio.gather(*flood) if c is not None]
        if mode == "secure":  # each one's TLS alert is on its way
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in clients],
                               timeout=5.0)
        for c in clients:
            c.close()
        return started, clients

    started, clients = asyncio.run(main())
    st = a.stats()
    print(f"{mode}: job started after {started} s; {len(clients)} flood handshakes done; {st}")
    assert started is not None and started < JOB_START_BOUND
    assert st["conns_pending"] <= TABLE
    if mode == "secure":
        assert all(c.terminated and c.terminated.error_code == ALERT_CERT_REQUIRED
                   for c in clients)
    else:
        assert st["retries_sent"] > 0 and st["pending_dropped"] > 0


def test_full_table_evicts_strangers_before_a_peer_host(engines):
    """A handshake from the published host of rank 1 (a raw Initial, left
    half-open) survives while 60 validated strangers from other hosts churn
    the full table: its retransmitted Initial still finds its connection
    (no Retry comes back, as it would for a new one).  Before: it was the
    oldest connection in its handshake, the first one dropped."""
    a = engines(0, insecure=True, connect_timeout=3.0)
    a.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind(("127.0.0.1", 0))
    raw.settimeout(0.5)
    first = initial_datagram(host, port)
    try:
        raw.sendto(first, (host, port))
        raw.recv(65536)  # the server's first flight: the connection exists

        async def main():
            return [await asyncio.wait_for(open_client(f"127.0.8.{i + 1}", host, port), 10)
                    for i in range(60)]
        clients = asyncio.run(main())
        st = a.stats()
        assert st["pending_dropped"] >= 60 - TABLE + 1 and st["retries_sent"] > 0, st
        raw.sendto(first, (host, port))
        got = []
        try:
            while True:
                got.append(raw.recv(65536)[0])
        except socket.timeout:
            pass
        assert not any(b & 0xf0 == 0xf0 for b in got), "a Retry: the connection was dropped"
        del clients
    finally:
        raw.close()
    with pytest.raises(EngineError):
        rank0(15)


def test_spoofed_initials_get_retry_not_slots(engines):
    """Initials from 200 source hosts that never read a reply (as spoofed
    ones): past half the table each gets a stateless Retry and no slot, and
    a real job starts at once, its rank 1 (an engine, ngtcp2) following a
    Retry too.  Before: 34 of them filled the table."""
    a, b = job_pair(engines)
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    socks = []
    try:
        for i in range(200):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((f"127.0.2.{i + 1}", 0))
            s.setblocking(False)
            socks.append(s)
            s.sendto(initial_datagram(host, port), (host, port))
        assert wait_until(lambda: a.stats()["retries_sent"] >= 200 - TABLE // 2, 5.0)
        st = a.stats()
        assert st["conns_pending"] <= TABLE // 2, st
        retries = 0
        for s in socks:  # the Retry went back to the source address
            try:
                retries += (s.recv(2048)[0] & 0xf0) == 0xf0  # long header, type Retry
            except BlockingIOError:
                pass
        assert retries >= 200 - TABLE // 2
        before = a.stats()["retries_sent"]
        t0 = time.monotonic()
        b.connect()
        rank0(JOB_START_BOUND)
        assert time.monotonic() - t0 < JOB_START_BOUND
        assert a.stats()["retries_sent"] > before
    finally:
        for s in socks:
            s.close()


def test_one_host_gets_a_bounded_share(engines):
    """30 half-open handshakes from one host no rank was published at take 8
    slots (the rest are dropped, no Retry: the table is not half full);
    another host still gets in.  Before: all 30 took a slot."""
    a = engines(0, insecure=True, connect_timeout=3.0)
    a.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    socks = []
    try:
        for i in range(31):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.5.1" if i < 30 else "127.0.5.2", 0))
            socks.append(s)
            s.sendto(initial_datagram(host, port), (host, port))
            time.sleep(0.002)
        assert wait_until(lambda: a.stats()["conns_pending"] == 9, 3.0)
        time.sleep(0.2)
        st = a.stats()
        assert (st["conns_pending"], st["retries_sent"]) == (9, 0), st
    finally:
        for s in socks:
            s.close()
    with pytest.raises(EngineError):
        rank0(15)


V6_SHARE = textwrap.dedent("""
    import json, socket, sys, time
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[1] + "/tests")
    from erdmampi._engine import Engine
    from test_admission import initial_datagram, in_thread, wait_until
    eng = Engine.create(0, 2, bind="fd00::1", connect_timeout=3.0, insecure=True)
    eng.set_peer(1, "fd00:0:0:1::1", 9, "")
    host, port = eng.local_addr.rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    rank0 = in_thread(eng.connect)
    socks = []
    for i in range(30):  # 30 addresses of one /64
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.bind((f"fd00::{i + 0x100:x}", 0))
        socks.append(s)
        s.sendto(initial_datagram(host, port), (host, port))
        time.sleep(0.002)
    wait_until(lambda: eng.stats()["conns_pending"] >= 8, 3.0)
    time.sleep(0.3)
    print(json.dumps(eng.stats()), flush=True)
    try:
        rank0(10)
    except Exception:
        pass
    eng.shutdown(1.0)
""")


def test_ipv6_slash64_is_one_source(tmp_path):
    """30 addresses of one IPv6 /64 share one host's 8 pending connections
    (in a network namespace with those addresses on its loopback).  Before:
    each address was a host of its own (17 took slots, the rest got Retry)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 for a network namespace")
    ns = f"erdma-adm-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def ip(*args):
            subprocess.run(["ip", "-n", ns, *args], check=True)
        ip("link", "set", "lo", "up")
        for i in [1] + list(range(0x100, 0x100 + 30)):
            ip("-6", "addr", "add", f"fd00::{i:x}/64", "dev", "lo", "nodad")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", V6_SHARE,
                              str(ROOT)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        st = json.loads(out.stdout.splitlines()[0])
        assert (st["conns_pending"], st["retries_sent"]) == (8, 0), st
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_spoofed_share_does_not_grow_with_job_size(engines):
    """A rank of a 200-rank job (a table of 1816): 300 Initials from as many
    hosts take 64 slots (about 90 KiB each), the rest get a Retry.  Before:
    half the table, 908 slots, about 80 MiB."""
    a = engines(0, size=200, insecure=True, connect_timeout=3.0)
    for r in range(1, 200):
        a.set_peer(r, "127.0.9.9", 9, "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    socks = []
    try:
        for i in range(300):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((f"127.0.{6 + i // 200}.{1 + i % 200}", 0))
            socks.append(s)
            s.sendto(initial_datagram(host, port), (host, port))
        assert wait_until(lambda: a.stats()["retries_sent"] >= 300 - 64, 5.0)
        st = a.stats()
        assert (st["conns_pending"], st["retries_sent"]) == (64, 300 - 64), st
    finally:
        for s in socks:
            s.close()
    with pytest.raises(EngineError):
        rank0(15)


def test_retry_then_connect_from_unknown_host(engines):
    """Under load a client from a host no peer was published at gets a Retry,
    answers it, and completes the handshake (RFC 9000 8.1)."""
    a = engines(0, insecure=True, connect_timeout=5.0)
    a.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    socks = []
    try:
        for i in range(TABLE // 2):  # half the table: half-open handshakes
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((f"127.0.3.{i + 1}", 0))
            socks.append(s)
            s.sendto(initial_datagram(host, port), (host, port))
        assert wait_until(lambda: a.stats()["conns_pending"] == TABLE // 2, 5.0)

        async def main():
            proto = await asyncio.wait_for(open_client("127.0.4.1", host, port), 10)
            retried = proto._quic._retry_count
            proto.close()
            return retried
        assert asyncio.run(main()) == 1
        assert a.stats()["retries_sent"] == 1
    finally:
        for s in socks:
            s.close()
    with pytest.raises(EngineError):
        rank0(30)  # (rank 1 never came)


# -------------------------------------------------------------- deadlines
def test_pending_connections_expire(engines):
    """A half-open handshake and a completed one that never sends its HELLO
    are both closed once hello_timeout (1 s here) has passed."""
    a = engines(0, insecure=True, hello_timeout=1.0, connect_timeout=6.0)
    a.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(a)
    rank0 = in_thread(a.connect)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind(("127.0.0.1", 0))
    try:
        raw.sendto(initial_datagram(host, port), (host, port))  # and nothing more

        async def main():
            proto = await open_client("127.0.0.1", host, port)
            assert wait_until(lambda: a.stats()["conns_pending"] == 2, 2.0)
            t0 = time.monotonic()
            await asyncio.wait_for(proto.wait_closed(), 5.0)  # the engine closed it
            return time.monotonic() - t0
        closed_after = asyncio.run(main())
        assert closed_after < 3.0
        assert wait_until(lambda: a.stats()["conns_pending"] == 0, 2.0)
        assert a.stats()["pending_dropped"] == 2
    finally:
        raw.close()
    with pytest.raises(EngineError):
        rank0(15)


# ----------------------------------------------------------------- memory
VICTIM = textwrap.dedent("""
    import sys
    from erdmampi._engine import Engine
    eng = Engine.create(0, 2, bind="127.0.0.1", connect_timeout=60.0, idle_timeout=60.0,
                        insecure=True)
    eng.set_peer(1, "127.0.0.1", 9, "")
    print(eng.local_addr, flush=True)
    try:
        eng.connect()
    except Exception:
        pass
""")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_stranger_cannot_make_rank_buffer_out_of_order_data():
    """An anonymous client (in an insecure engine, where the handshake lets it
    in) that never sends HELLO writes stream data with a hole at offset 0 on
    two streams: ngtcp2 must hold it all, so the connection window bounds it.
    Before: 16 MiB per stream, 32 MiB per connection; now 64 KiB."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    victim = subprocess.Popen([sys.executable, "-c", VICTIM], stdout=subprocess.PIPE, env=env,
                              text=True)
    try:
        host, port = victim.stdout.readline().strip().rsplit(":", 1)
        time.sleep(0.5)
        before = rss_kib(victim.pid)

        async def main():
            proto = await open_client("127.0.0.1", host, int(port))
            quic = proto._quic
            for sid in (0, 4):
                quic.send_stream_data(sid, bytes(24 << 20))
                quic._streams[sid].sender._pending.subtract(0, 32)  # the hole, never sent
            proto.transmit()
            grown, last, t0 = 0, before, time.monotonic()
            while time.monotonic() - t0 < 8.0:  # until the window (or time) runs out
                await asyncio.sleep(0.5)
                now = rss_kib(victim.pid)
                grown = max(grown, now - before)
                sent = sum(s.sender.highest_offset for s in quic._streams.values())
                if now == last and sent < (1 << 20):
                    break  # flow control holds the client back
                last = now
            proto.close()
            return grown, sent
        grown, sent = asyncio.run(main())
        print(f"victim RSS grew by {grown} KiB; client pushed {sent} bytes")
        assert sent <= 64 << 10
        assert grown < 2048
    finally:
        victim.kill()
        victim.wait()


def test_client_names_a_foreign_certificate(engines, capfd):
    """A rank's published address answered by another engine (another job's
    rank, a process that took the port): the dialling rank fails at once
    and says why, not with a bare ERR_CRYPTO."""
    a, b = job_pair(engines, connect_timeout=10.0)
    other = engines(0, connect_timeout=3.0)  # another job's rank 0
    other.set_peer(1, *host_port(b), b.fingerprint)
    b.set_peer(0, *host_port(other), a.fingerprint)
    serving = in_thread(other.connect)  # it answers handshakes while it connects
    t0 = time.monotonic()
    with pytest.raises(EngineError):
        b.connect()
    assert time.monotonic() - t0 < 5.0
    err = capfd.readouterr().err
    assert "connection to rank 0 lost: the process at its address presented a certificate " \
           "other than the one its rank published" in err, err
    with pytest.raises(EngineError):  # rank 1 never reaches it as itself
        serving(15)
