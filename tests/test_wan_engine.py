"""The engine over a shaped, lossy link: two network namespaces joined by a
veth pair with a tbf rate limit and nftables random loss on both sides.

Large rendezvous messages travel as CHUNK frames over several QUIC streams
(docs/wire.md); these tests check that they arrive intact and in MPI order
when packets are lost, and that nothing hangs.  Each rank is a small script
driving ``erdmampi._engine`` directly, run with ``ip netns exec``.  Needs
root; skipped otherwise.
"""
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from harness import REPO, rank_env

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

ADDR = ("10.214.0.1", "10.214.0.2")
PORT = (47101, 47102)


def _run(*args, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


@pytest.fixture
def lossy_link():
    """Namespaces (a, b): 200 Mbit/s each way, 3% random loss each way."""
    tag = secrets.token_hex(3)
    nss = (f"wea{tag}", f"web{tag}")
    devs = (f"wa{tag}", f"wb{tag}")
    try:
        for ns in nss:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", devs[0], "netns", nss[0], "type", "veth", "peer", "name",
             devs[1], "netns", nss[1])
        for ns, dev, addr in zip(nss, devs, ADDR):
            _run("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                 "rate", "200mbit", "burst", "64000", "limit", "500000")
            rules = ("table inet wloss {\n chain in {\n"
                     "  type filter hook input priority 0; policy accept;\n"
                     f"  iifname \"{dev}\" numgen random mod 1000 < 30 drop\n }}\n}}\n")
            subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                           check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        for ns in nss:
            _run("ip", "netns", "del", ns, check=False)
        pytest.skip(f"cannot build the lossy link here: {e}")
    yield nss
    for ns in nss:
        _run("ip", "netns", "del", ns, check=False)


PRELUDE = textwrap.dedent(f"""
    import faulthandler, hashlib, json, sys
    import numpy as np
    faulthandler.enable()
    from erdmampi import _engine as E
    rank = int(sys.argv[1])
    ADDR, PORT = {ADDR!r}, {PORT!r}
    eng = E.Engine.create(rank, 2, bind=ADDR[rank], port=PORT[rank], connect_timeout=20.0,
                          idle_timeout=20.0, insecure=True, **json.loads(sys.argv[2]))
    eng.set_peer(1 - rank, ADDR[1 - rank], PORT[1 - rank], "")
    eng.connect()
    P = E.buffer_pointer
    T = 60.0  # no wait may take longer than this
    def payload(i, n):
        return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)
    def check(st, i, n, buf):
        assert st.error == 0, E.strerror(st.error)
        assert st.nbytes == n, (i, st.nbytes, n)
        want = hashlib.sha256(payload(i, n).tobytes()).hexdigest()
        assert hashlib.sha256(buf[:n].tobytes()).hexdigest() == want, ("corrupt", i, n)
    def lanes_up(n, timeout=20.0):
        # wait until n extra lanes are ready (they come up in the background)
        import time
        end = time.monotonic() + timeout
        while eng.stats()["lanes_ready"] < n:
            assert time.monotonic() < end, ("lanes not up", eng.stats())
            time.sleep(0.02)
    def finish(extra=None):
        tok = np.zeros(1, np.uint8)
        if rank == 0:
            eng.send(P(tok), 1, 1, 99, 0)
        else:
            eng.recv(P(tok), 1, 0, 99, 0)
        print(json.dumps({{"rank": rank, "stats": eng.stats(), **(extra or {{}})}}), flush=True)
        eng.shutdown(10.0)
""")


def _ranks(nss, script, args, timeout):
    """Run rank r as ``script r *args[r]`` in namespace nss[r]; every rank
    must exit 0; returns the last JSON line each printed."""
    import json
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(script), str(r),
                               *args[r]], env=rank_env(), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r, ns in enumerate(nss)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, "\n".join(f"rank {k} rc {o[0]}:\n{o[1]}{o[2]}" for k, o in enumerate(outs))
    return [json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
            for _, out, _ in outs]


def _job(nss, tmp_path, body, cfg=("{}", "{}"), timeout=150):
    """Run rank 0 in nss[0], rank 1 in nss[1]; returns their JSON reports."""
    script = tmp_path / "rank.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    return _ranks(nss, script, [(c,) for c in cfg], timeout)


def test_large_messages_intact_over_lossy_link(lossy_link, tmp_path):
    """8 MiB, 24 MiB and an odd size, both ways, several in flight at once,
    over 3% loss: every byte checked, the payload spread over data streams."""
    sizes = [8 << 20, 24 << 20, (3 << 20) + 12345]
    reports = _job(lossy_link, tmp_path, f"""
        sizes = {sizes!r}
        lanes_up(1)  # a job on two hosts gets a second lane by default
        out = [payload(10 * rank + i, n) for i, n in enumerate(sizes)]
        inb = [np.zeros(n + 64, np.uint8) for n in sizes]
        rr = [eng.irecv(P(b), len(b), 1 - rank, i, 7) for i, b in enumerate(inb)]
        sr = [eng.isend(P(b), len(b), 1 - rank, i, 7) for i, b in enumerate(out)]
        for r in sr:
            assert r.wait(T).error == 0
        for i, r in enumerate(rr):
            check(r.wait(T), 10 * (1 - rank) + i, sizes[i], inb[i])
        finish()
    """)
    for rep in reports:
        st = rep["stats"]
        # several chunks per message, received on the data streams
        assert st["chunks_sent"] >= sum(sizes) // (1 << 20)
        assert st["chunks_recv"] >= sum(sizes) // (1 << 20)
        # the loss was real: more packets went out than the payload needs
        assert st["pkts_sent"] > sum(sizes) // 1452
        # a job on two hosts gets a second lane by default
        assert st["lane_chunks_sent"] > 0 and st["lane_chunks_recv"] > 0, st


def test_order_preserved_under_loss(lossy_link, tmp_path):
    """Many messages of mixed sizes (eager and rendezvous) on one tag and
    on ANY_TAG arrive in the order they were sent, despite chunks of later
    messages overtaking earlier ones on other streams."""
    body = """
        rng = np.random.default_rng(5)
        sizes = [int(x) for x in rng.choice([0, 100, 4000, 65536, 70000, 300000, 1 << 20,
                                              (2 << 20) + 7], 120)]
        if rank == 1:
            bufs = [payload(i, n) for i, n in enumerate(sizes)]
            for i, b in enumerate(bufs):
                if len(b) >= 8:
                    b[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
            reqs = [eng.isend(P(b), len(b), 0, 5, 3, sync=(i % 17 == 0))
                    for i, b in enumerate(bufs)]
            for r in reqs:
                assert r.wait(T).error == 0
        else:
            bufs = [np.zeros(max(n, 1), np.uint8) for n in sizes]
            reqs = [eng.irecv(P(b), len(b), 1, 5 if i % 2 else E.ANY_TAG, 3)
                    for i, b in enumerate(bufs)]
            for i, r in enumerate(reqs):
                st = r.wait(T)
                assert st.error == 0 and st.tag == 5, (i, st)
                assert st.nbytes == sizes[i], (i, st.nbytes, sizes[i])
                if sizes[i] >= 8:
                    seq = int(np.frombuffer(bufs[i][:8].tobytes(), np.int64)[0])
                    assert seq == i, ("out of order", i, seq)
                    want = payload(i, sizes[i])
                    assert (bufs[i][8:sizes[i]] == want[8:]).all(), ("corrupt", i)
        finish()
    """
    reports = _job(lossy_link, tmp_path, body)
    assert reports[0]["stats"]["chunks_recv"] > 0


def test_lanes_share_the_payload(lossy_link, tmp_path):
    """Rank 1 (the QUIC client) opens 3 connections to rank 0, which takes
    the lanes its peer offers without configuring any: large messages both
    ways, several at once, over 3 % loss, arrive intact with their chunks
    spread over all lanes; small ones keep MPI order on the main one."""
    sizes = [8 << 20, (5 << 20) + 4321, 12 << 20]
    reports = _job(lossy_link, tmp_path, f"""
        sizes = {sizes!r}
        lanes_up(2)
        out = [payload(10 * rank + i, n) for i, n in enumerate(sizes)]
        inb = [np.zeros(n, np.uint8) for n in sizes]
        small = [np.zeros(8, np.uint8) for _ in range(50)]
        rr = [eng.irecv(P(b), len(b), 1 - rank, i, 7) for i, b in enumerate(inb)]
        rs = [eng.irecv(P(b), 8, 1 - rank, 100, 7) for b in small]
        sr = [eng.isend(P(b), len(b), 1 - rank, i, 7) for i, b in enumerate(out)]
        seq = [np.array([k], np.int64).view(np.uint8) for k in range(50)]
        ss = [eng.isend(P(b), 8, 1 - rank, 100, 7) for b in seq]
        for r in sr + ss:
            assert r.wait(T).error == 0
        for i, r in enumerate(rr):
            check(r.wait(T), 10 * (1 - rank) + i, sizes[i], inb[i])
        for k, r in enumerate(rs):
            assert r.wait(T).error == 0
            assert int(small[k].view(np.int64)[0]) == k, "small messages out of order"
        finish()
    """, cfg=('{}', '{"lanes": 3}'))
    for rep in reports:
        st = rep["stats"]
        # both directions used the extra lanes, and the main one too
        assert st["lane_chunks_sent"] > 0 and st["lane_chunks_recv"] > 0, st
        assert st["chunks_sent"] > st["lane_chunks_sent"], st


def test_single_stream_sender_interoperates(lossy_link, tmp_path):
    """A sender configured without data streams (ERDMA_DATA_STREAMS=0) sends
    one DATA frame on the control stream; the receiver takes either form."""
    reports = _job(lossy_link, tmp_path, """
        n = 6 << 20
        out = payload(2 - rank, n)  # (kept alive until the send completes)
        if rank == 1:
            assert eng.isend(P(out), n, 0, 1, 0).wait(T).error == 0
            buf = np.zeros(n, np.uint8)
            check(eng.irecv(P(buf), n, 0, 2, 0).wait(T), 2, n, buf)
        else:
            buf = np.zeros(n, np.uint8)
            check(eng.irecv(P(buf), n, 1, 1, 0).wait(T), 1, n, buf)
            assert eng.isend(P(out), n, 1, 2, 0).wait(T).error == 0
        finish()
    """, cfg=('{}', '{"data_streams": 0}'))
    by_rank = {r["rank"]: r["stats"] for r in reports}
    assert by_rank[1]["chunks_sent"] == 0 and by_rank[0]["chunks_recv"] == 0
    assert by_rank[0]["chunks_sent"] > 0 and by_rank[1]["chunks_recv"] > 0


def test_automatic_lanes_only_between_two_hosts(lossy_link, tmp_path):
    """Rank 0 in one namespace, ranks 1 and 2 at two addresses of the other:
    every rank has QUIC peers at two addresses, so the automatic setting
    opens no extra lane (a second lane is for a job on two hosts); large
    messages still go, as chunks on the main connections."""
    dev = _run("ip", "-n", lossy_link[1], "-o", "link", "show", "type", "veth").stdout
    dev = dev.split(":")[1].strip().split("@")[0]
    _run("ip", "-n", lossy_link[1], "addr", "add", "10.214.0.3/24", "dev", dev)
    addrs, ports = ADDR + ("10.214.0.3",), PORT + (47103,)
    script = tmp_path / "rank3.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        import numpy as np
        from erdmampi import _engine as E
        rank = int(sys.argv[1])
        ADDR, PORT = {addrs!r}, {ports!r}
        eng = E.Engine.create(rank, 3, bind=ADDR[rank], port=PORT[rank], connect_timeout=20.0,
                              idle_timeout=20.0, insecure=True)
        for p in range(3):
            if p != rank:
                eng.set_peer(p, ADDR[p], PORT[p], "")
        eng.connect()
        P = E.buffer_pointer
        n = 3 << 20
        if rank == 0:
            bufs = [np.zeros(n, np.uint8) for _ in range(2)]
            reqs = [eng.irecv(P(b), n, src, 1, 0) for src, b in zip((1, 2), bufs)]
            for src, (r, b) in zip((1, 2), zip(reqs, bufs)):
                st = r.wait(60.0)
                assert st.error == 0 and st.nbytes == n, st
                assert (b == src).all(), "corrupt"
            for dst in (1, 2):
                eng.send(P(np.zeros(1, np.uint8)), 1, dst, 2, 0)
        else:
            out = np.full(n, rank, np.uint8)
            assert eng.isend(P(out), n, 0, 1, 0).wait(60.0).error == 0
            eng.recv(P(np.zeros(1, np.uint8)), 1, 0, 2, 0)
        time.sleep(0.5)  # (a lane would have been up long since)
        print(json.dumps({{"rank": rank, "stats": eng.stats()}}), flush=True)
        eng.shutdown(10.0)
    """))
    reports = _ranks((lossy_link[0], lossy_link[1], lossy_link[1]), script, [()] * 3, 120)
    for rep in reports:
        st = rep["stats"]
        assert st["lanes_ready"] == 0 and st["lane_chunks_sent"] == 0, st
    assert reports[0]["stats"]["chunks_recv"] > 0, reports[0]
