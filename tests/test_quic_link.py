"""Packet size on a real (virtual) link: two network namespaces joined by a
veth pair.  The engine writes packets as large as the route MTU towards a
peer on a directly attached network (jumbo frames), keeps 1452 bytes on a
standard link and towards a peer behind a gateway, and a 64 MiB message
arrives intact either way.  Needs root; skipped otherwise.  No timings."""
import json
import os
import secrets
import subprocess
import sys

import pytest

from harness import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

NET = "10.97.3"          # the veth pair's subnet (only inside our namespaces)
NET2 = "10.97.4"         # routed bed: the second link, behind a router namespace
MSG = 64 << 20

WORKER = r"""
import hashlib, json, sys
import numpy as np
from erdmampi import _engine as E
rank, bind, peer, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
ports = (47311, 47312)
eng = E.Engine.create(rank=rank, size=2, bind=bind, port=ports[rank], connect_timeout=30.0,
                      idle_timeout=30.0, verbose=1, insecure=True)  # no fingerprint exchange
eng.set_peer(1 - rank, peer, ports[1 - rank], "")
eng.connect()
want = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
out = {"rank": rank}
if rank == 1:
    st = eng.send(E.buffer_pointer(want), n, 0, 5, 0)
    out["error"] = st.error
    tok = np.zeros(8, np.uint8)
    eng.recv(E.buffer_pointer(tok), 8, 0, 6, 0)     # the receiver checked it
else:
    got = np.zeros(n, np.uint8)
    st = eng.recv(E.buffer_pointer(got), n, 1, 5, 0)
    out["error"] = st.error
    out["nbytes"] = st.nbytes
    out["same"] = hashlib.sha256(got).digest() == hashlib.sha256(want).digest()
    eng.send(E.buffer_pointer(np.zeros(8, np.uint8)), 8, 1, 6, 0)
out["stats"] = eng.stats()
eng.shutdown(5.0)
print(json.dumps(out), flush=True)
"""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def veth_pair():
    """make(mtu): namespaces (a, b) joined by a veth pair of that MTU, a at
    NET.1, b at NET.2 (mtu_b: b's end has another MTU).  make(mtu, routed=True): a at NET.1 and b at NET2.1,
    each joined to a router namespace by a veth pair of that MTU (the peers
    are not on-link: a gateway route leads to each)."""
    made = []

    def link(n1, n2, dev1, dev2, addr1, addr2, mtu, mtu2=None):
        _ip("link", "add", dev1, "netns", n1, "type", "veth", "peer", "name", dev2, "netns", n2)
        for ns, dev, addr, m in ((n1, dev1, addr1, mtu), (n2, dev2, addr2, mtu2 or mtu)):
            _ip("-n", ns, "addr", "add", addr + "/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "mtu", str(m))
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def make(mtu, routed=False, mtu_b=None):
        tag = secrets.token_hex(3)
        a, b, r = f"qlta{tag}", f"qltb{tag}", f"qltr{tag}"
        try:
            for ns in (a, b, r) if routed else (a, b):
                _ip("netns", "add", ns)
                made.append(ns)
            if not routed:
                link(a, b, "ta" + tag, "tb" + tag, NET + ".1", NET + ".2", mtu, mtu_b)
                return a, b, NET + ".2"
            link(a, r, "ta" + tag, "tr" + tag, NET + ".1", NET + ".2", mtu)
            link(b, r, "tb" + tag, "ts" + tag, NET2 + ".1", NET2 + ".2", mtu)
            subprocess.run(["ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                           check=True, capture_output=True)
            _ip("-n", a, "route", "add", "default", "via", NET + ".2")
            _ip("-n", b, "route", "add", "default", "via", NET2 + ".2")
            return a, b, NET2 + ".1"
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"cannot build network namespaces here: {e}")

    try:
        yield make
    finally:
        for ns in made:
            _ip("netns", "del", ns, check=False)


def _transfer(a, b, addr_b):
    """Rank 0 in a receives MSG bytes from rank 1 in b; both ranks' records
    and stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("ERDMA_MAX_UDP_PAYLOAD", None)
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", WORKER, str(r),
                               bind, peer, str(MSG)], cwd=str(REPO), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r, ns, bind, peer in ((0, a, NET + ".1", addr_b), (1, b, addr_b, NET + ".1"))]
    res = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            assert p.returncode == 0 and lines, f"rank failed ({p.returncode}): {err[-2000:]}"
            res.append((json.loads(lines[-1]), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return res


def _check_delivered(res):
    (r0, _), (r1, _) = res
    assert r1["error"] == 0
    assert r0["error"] == 0 and r0["nbytes"] == MSG and r0["same"]


@pytest.mark.parametrize("mtu", [9000, 65535])
def test_jumbo_link_uses_large_packets(veth_pair, mtu):
    a, b, addr_b = veth_pair(mtu)
    res = _transfer(a, b, addr_b)
    _check_delivered(res)
    size = min(mtu - 28, 65000)
    for (rec, err), peer in zip(res, (NET + ".2", NET + ".1")):
        assert f"]: {peer} is on a link with a larger MTU: {size}-byte packets" in err
    # the payload went in packets of about that size (1452-byte ones would
    # take MSG / 1452 ~ 46000)
    assert res[0][0]["stats"]["pkts_recv"] < 2 * MSG // size + 1000
    assert res[1][0]["stats"]["pkts_sent"] < 2 * MSG // size + 1000


def test_standard_link_keeps_1452(veth_pair):
    a, b, addr_b = veth_pair(1500)
    res = _transfer(a, b, addr_b)
    _check_delivered(res)
    for _, err in res:
        assert "larger MTU" not in err
    assert res[0][0]["stats"]["pkts_recv"] > MSG // 1452


def test_peers_behind_gateway_keep_1452(veth_pair):
    """Jumbo links on both sides, but a router between them: the route to
    each peer has a gateway, whose path MTU the engine cannot know, so the
    packets stay 1452 bytes (PMTUD's ground) and the message still arrives."""
    a, b, addr_b = veth_pair(9000, routed=True)
    res = _transfer(a, b, addr_b)
    _check_delivered(res)
    for _, err in res:
        assert "larger MTU" not in err
    assert res[0][0]["stats"]["pkts_recv"] > MSG // 1452


def test_peer_with_smaller_mtu_caps_the_sender(veth_pair):
    """b's end of the pair carries 9000 bytes, a's only 1500 (a veth drops
    what its receiving end's MTU does not carry): a announces the packet size
    it takes (QUIC's max_udp_payload_size), so b, which would fill its own
    link's MTU, sends no more than a can receive, and the message arrives."""
    a, b, addr_b = veth_pair(1500, mtu_b=9000)
    res = _transfer(a, b, addr_b)
    _check_delivered(res)
    (r0, err0), (r1, err1) = res
    assert "larger MTU" not in err0
    assert f"]: {NET}.1 is on a link with a larger MTU: 8972-byte packets" in err1
    assert r1["stats"]["pkts_sent"] > MSG // 1452
