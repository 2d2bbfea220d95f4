"""The engine's QUIC against an independent implementation (aioquic).

aioquic (pure Python QUIC + TLS 1.3) plays one rank of a 2-rank world
through tests/quic_peer.py, which speaks the framing of docs/wire.md; the
other rank is a real engine in this process.  Both roles are covered: aioquic
as the client (rank 1) and as the server (rank 0).
"""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("aioquic")

from erdmampi import _engine  # noqa: E402
from erdmampi._engine import ANY_SOURCE, ANY_TAG, Engine, EngineError  # noqa: E402

from quic_peer import (ALPN, ErdmaPeer, Identity, client, configuration,  # noqa: E402
                       fingerprint_of, server)

pytestmark = pytest.mark.timeout(60)

CTX = 7                 # any communicator context id
WAIT = 20.0             # seconds any single engine wait may take
REFUSE_TIMEOUT = 1.5    # engine connect_timeout where a connection must fail


def pattern(n: int, seed: int) -> bytes:
    """n bytes that differ at every offset from other seeds' (catches shifts)."""
    return bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def run(coro, timeout: float = 45.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def make_engine():
    made = []

    def make(rank: int, size: int = 2, **kw) -> Engine:
        kw.setdefault("connect_timeout", 10.0)
        kw.setdefault("idle_timeout", 10.0)
        kw.setdefault("insecure", True)  # most peers here are given no fingerprint
        eng = Engine.create(rank, size, bind="127.0.0.1", port=0, **kw)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.shutdown(timeout=5.0)


def host_port(eng: Engine) -> tuple[str, int]:
    host, port = eng.local_addr.rsplit(":", 1)
    return host, int(port)


def engine_send_all(eng: Engine, msgs, dest: int):
    """Post every (data, tag, sync) send, then wait for all of them."""
    reqs = []
    for data, tag, sync in msgs:
        buf = bytearray(data) or bytearray(1)  # a valid address even for 0 bytes
        cbuf = _engine.ffi.from_buffer(buf)
        addr = int(_engine.ffi.cast("uintptr_t", cbuf))
        reqs.append(eng.isend(addr, len(data), dest, tag, CTX, sync=sync, keep=(buf, cbuf)))
    for r in reqs:
        st = r.wait(WAIT)
        assert st.error == 0
        r.free()


def engine_wait_recv(req):
    st = req.wait(WAIT)
    data = bytes(req.take())
    req.free()
    return st, data


async def exchange(eng: Engine, peer: ErdmaPeer) -> None:
    """Messages both ways between the engine and the aioquic peer."""
    other = peer.rank

    # aioquic -> engine: eager (empty, small, exactly the eager limit),
    # rendezvous (large, and a small synchronous send, which always uses RTS).
    to_engine = [(b"", 10, False, "eager"),
                 (b"ping from aioquic", 11, False, "eager"),
                 (pattern(65536, 1), 12, False, "eager"),
                 (pattern(300_000, 2), 13, False, "rendezvous"),
                 (b"synchronous", 14, True, "rendezvous")]
    # Post the receives in order before anything is sent: the ANY_TAG one
    # must not be posted ahead of the others, or it may match their message.
    posted = [eng.irecv_alloc(ANY_SOURCE if tag == 12 else other,
                              ANY_TAG if tag == 13 else tag, CTX)
              for _, tag, _, _ in to_engine]
    receives = [asyncio.ensure_future(asyncio.to_thread(engine_wait_recv, req))
                for req in posted]
    for data, tag, sync, how in to_engine:
        assert await peer.send(data, tag=tag, ctx=CTX, sync=sync) == how
    for fut, (data, tag, _, _) in zip(receives, to_engine):
        st, got = await fut
        assert (st.source, st.tag, st.error, st.nbytes) == (other, tag, 0, len(data))
        assert got == data

    # engine -> aioquic: sizes around the eager limit, 1 MiB, a synchronous send.
    to_peer = [(b"", 20, False), (b"pong from the engine", 21, False),
               (pattern(65536, 3), 22, False), (pattern(65537, 4), 23, False),
               (pattern(1 << 20, 5), 24, False), (b"ssend", 25, True)]
    sending = asyncio.ensure_future(asyncio.to_thread(engine_send_all, eng, to_peer, other))
    for data, tag, sync in to_peer:
        m = await peer.recv()
        assert (m.ctx, m.tag) == (CTX, tag)
        assert m.data == data
        assert m.rendezvous == (len(data) > 65536 or sync)
        assert m.sync == sync
    await sending  # every engine send completed (rendezvous ones after our CTS)
    stats = eng.stats()
    assert stats["msgs_recv"] >= len(to_engine) and stats["msgs_sent"] >= len(to_peer)


# ------------------------------------------------- aioquic client, engine server
def test_aioquic_client_talks_to_engine_server(make_engine):
    eng = make_engine(0)
    eng.set_peer(1, "127.0.0.1", 9, "")  # the server learns rank 1 from its HELLO
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        async with client(host, port, configuration(True)) as proto:
            assert proto.alpn == ALPN
            # the engine's published fingerprint is SHA-256 of the DER cert it presents
            assert fingerprint_of(proto.peer_certificate) == eng.fingerprint
            peer = ErdmaPeer(proto, rank=1, size=2)
            peer.send_hello()
            hello = await peer.wait_hello()
            assert (hello.ctx, hello.length, hello.tag, hello.flags, hello.id) == (0, 2, 0, 0, 0)
            await connecting
            await exchange(eng, peer)
            # a graceful engine shutdown closes the connection with application error 0
            await asyncio.to_thread(eng.shutdown, 5.0)
            await asyncio.wait_for(proto.wait_closed(), 5)
            assert proto.terminated is not None and proto.terminated.error_code == 0
            assert proto.terminated.frame_type is None  # an application close
            assert peer.received[0] == "HELLO" and peer.received.count("HELLO") == 1

    run(main())


def test_engine_reports_the_arrival_rate(make_engine):
    """During a bulk transfer from the aioquic peer the engine tells it the
    rate its packets arrive at (RATE frames, docs/wire.md): each report
    higher than the one before and within the frame's bounds."""
    eng = make_engine(0)
    eng.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        async with client(host, port, configuration(True)) as proto:
            peer = ErdmaPeer(proto, rank=1, size=2)
            peer.send_hello()
            await peer.wait_hello()
            await connecting
            data = pattern(8 << 20, 9)
            req = eng.irecv_alloc(1, 30, CTX)
            recv = asyncio.ensure_future(asyncio.to_thread(engine_wait_recv, req))
            assert await peer.send(data, tag=30, ctx=CTX) == "rendezvous"
            st, got = await recv
            assert (st.error, got == data) == (0, True)
            for _ in range(100):
                if peer.rates:
                    break
                await asyncio.sleep(0.02)
            assert peer.rates, eng.stats()
            assert all(b > a for a, b in zip(peer.rates, peer.rates[1:])), peer.rates
            assert eng.stats()["rate_reports_sent"] >= len(peer.rates)
            await asyncio.to_thread(eng.shutdown, 5.0)

    run(main())


def test_engine_refuses_wrong_alpn_then_accepts_right_one(make_engine):
    eng = make_engine(0)
    eng.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        made = []
        with pytest.raises(ConnectionError):
            async with client(host, port, configuration(True, alpn="h3", idle_timeout=1.0),
                              made):
                pass
        assert made and made[0].alpn is None  # the handshake never completed
        assert not connecting.done()
        async with client(host, port, configuration(True)) as proto:
            peer = ErdmaPeer(proto, rank=1, size=2)
            peer.send_hello()
            await peer.wait_hello()
            await connecting

    run(main())


def test_engine_reports_alpn_failure_to_client(make_engine):
    """RFC 9001 4.8: a TLS alert becomes a CONNECTION_CLOSE with CRYPTO_ERROR
    0x100 + alert; no_application_protocol is alert 120 (RFC 9001 8.1)."""
    eng = make_engine(0, connect_timeout=REFUSE_TIMEOUT)
    eng.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(eng)

    async def main():
        made = []
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        with pytest.raises(ConnectionError):
            async with client(host, port, configuration(True, alpn="h3", idle_timeout=5.0),
                              made):
                pass
        assert made[0].terminated.error_code == 0x100 + 120, made[0].terminated
        with pytest.raises(EngineError):
            await connecting

    run(main())


# TLS alerts (RFC 8446 6.2) as QUIC CRYPTO_ERROR codes (RFC 9001 4.8)
ALERTS = {"other": 0x100 + 42,   # bad_certificate: not a job member's
          "none": 0x100 + 116}   # certificate_required


@pytest.mark.parametrize("presented", ["expected", "other", "none"])
def test_engine_server_checks_client_certificate(make_engine, presented):
    """The server requires a client certificate and takes only a job member's:
    anything else fails inside the TLS handshake (docs/wire.md)."""
    expected = Identity.generate("rank-1")
    identity = {"expected": expected, "other": Identity.generate("impostor"),
                "none": None}[presented]
    eng = make_engine(0, connect_timeout=10.0 if presented == "expected" else REFUSE_TIMEOUT,
                      insecure=False)
    eng.set_peer(1, "127.0.0.1", 9, expected.fingerprint)
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        if presented == "expected":
            async with client(host, port, configuration(True, identity)) as proto:
                assert proto.alpn == ALPN
                peer = ErdmaPeer(proto, rank=1, size=2)
                peer.send_hello()
                await peer.wait_hello()
                await connecting
            return
        # TLS 1.3: the client is done once it sent its Finished; the server's
        # verdict on its certificate follows as a TLS alert, in CONNECTION_CLOSE
        # with CRYPTO_ERROR (0x100 + alert), before the engine reads stream data
        async with client(host, port, configuration(True, identity)) as proto:
            peer = ErdmaPeer(proto, rank=1, size=2)
            peer.send_hello()
            await asyncio.wait_for(proto.wait_closed(), WAIT)
            assert proto.terminated.error_code == ALERTS[presented], proto.terminated
            assert "HELLO" not in peer.received  # the engine never greeted the impostor
        with pytest.raises(EngineError):
            await connecting

    run(main())


@pytest.mark.parametrize("first", [
    pytest.param(dict(rank=1, size=3), id="wrong-world-size"),
    pytest.param(dict(rank=0, size=2), id="claims-servers-rank"),
    pytest.param(None, id="eager-before-hello"),
])
def test_engine_server_refuses_bad_hello(make_engine, first):
    eng = make_engine(0, connect_timeout=REFUSE_TIMEOUT)
    eng.set_peer(1, "127.0.0.1", 9, "")
    host, port = host_port(eng)

    async def main():
        connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
        async with client(host, port, configuration(True)) as proto:
            peer = ErdmaPeer(proto, rank=1, size=2)
            if first is None:
                await peer.send(b"too early", tag=1, ctx=CTX)
            else:
                peer.send_hello(**first)
            with pytest.raises(EngineError):
                await connecting
            assert "HELLO" not in peer.received

    run(main())


# ------------------------------------------------- aioquic server, engine client
async def start_server(identity: Identity, alpn: str = ALPN):
    srv, first = await server("127.0.0.1", 0, configuration(False, identity, alpn=alpn))
    port = srv._transport.get_extra_info("sockname")[1]
    return srv, first, port


def test_engine_client_talks_to_aioquic_server(make_engine):
    identity = Identity.generate("rank-0")

    async def main():
        srv, first, port = await start_server(identity)
        try:
            eng = make_engine(1)
            eng.set_peer(0, "127.0.0.1", port, identity.fingerprint)
            connecting = asyncio.ensure_future(asyncio.to_thread(eng.connect))
            proto = await asyncio.wait_for(first, WAIT)
            assert await asyncio.wait_for(proto.opened, WAIT) == 0  # client bidi stream 0
            assert proto.alpn == ALPN
            peer = ErdmaPeer(proto, rank=0, size=2)
            hello = await peer.wait_hello()  # the client speaks first
            assert (hello.ctx, hello.length, hello.tag, hello.flags, hello.id) == (1, 2, 0, 0, 0)
            assert not connecting.done()     # ... and waits for ours
            peer.send_hello()
            await connecting
            await exchange(eng, peer)
            await asyncio.to_thread(eng.shutdown, 5.0)
            await asyncio.wait_for(proto.wait_closed(), 5)
            assert proto.terminated.error_code == 0
        finally:
            srv.close()

    run(main())


@pytest.mark.parametrize("case", ["wrong-fingerprint", "wrong-alpn"])
def test_engine_client_refuses_server(make_engine, case):
    identity = Identity.generate("rank-0")

    async def main():
        srv, first, port = await start_server(identity, alpn="h3" if case == "wrong-alpn"
                                              else ALPN)
        try:
            eng = make_engine(1, connect_timeout=REFUSE_TIMEOUT)
            fp = Identity.generate("other").fingerprint if case == "wrong-fingerprint" \
                else identity.fingerprint
            eng.set_peer(0, "127.0.0.1", port, fp)
            with pytest.raises(EngineError) as info:
                await asyncio.to_thread(eng.connect)
            if case == "wrong-fingerprint":
                # refused right after the handshake, not by running out of time
                assert info.value.code == _engine.ERR_PEER
            if first.done():  # the engine never opened stream 0, so never sent HELLO
                assert (await first).stream_id is None
        finally:
            srv.close()

    run(main())
