"""ICE-style checks and the all-ranks helper (erdmampi.nat.ice, erdmampi.nat.agent):
sans-I/O pieces, a loopback mesh (no root), and SocketPorts in NATed sites of the
NAT bed: which NAT pairs connect directly, which through the TURN relay, that data
really flows over the chosen path both ways, and the error when UDP is blocked."""
import json
import shutil
import threading
import time

import pytest

from erdmampi.nat import NatError
from erdmampi.nat.agent import NatConfig, establish
from erdmampi.nat.ice import (PairResult, candidate_priority, pair_priority,
                              validate_record)
from erdmampi.nat.port import SocketPort
from erdmampi.nat.turn import channel_unwrap, channel_wrap, is_channel_data
from erdmampi.testing import natbed
from erdmampi.testing.natbed import NatBed

_why = natbed.natbed_available(turn=True)
needs_bed = pytest.mark.skipif(_why is not None, reason=_why or "")


class Store:
    """The rendezvous stand-in: records go through JSON as they would on the wire."""

    def __init__(self):
        self.d, self.c = {}, threading.Condition()

    def publish(self, r, rec):
        with self.c:
            self.d[r] = json.loads(json.dumps(rec))
            self.c.notify_all()

    def fetch(self, r, timeout=30.0):
        with self.c:
            if not self.c.wait_for(lambda: r in self.d, timeout):
                raise TimeoutError(f"no record of rank {r}")
            return self.d[r]


def run_mesh(ports, cfg):
    """establish() on every port in its own thread; {rank: NatResult or exception}."""
    st, out = Store(), {}

    def one(r):
        try:
            out[r] = establish(ports[r], r, len(ports), lambda rec: st.publish(r, rec),
                               st.fetch, cfg)
        except Exception as e:          # reported by the test
            out[r] = e
    th = [threading.Thread(target=one, args=(r,)) for r in range(len(ports))]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    return out


def ok(out):
    bad = {r: v for r, v in out.items() if isinstance(v, Exception)}
    assert not bad, bad
    return out


def exchange(ports, out, a, b, payload):
    """Send payload a->b over a's chosen path; return what b's port delivers
    (ChannelData from b's TURN server unwrapped)."""
    pr = out[a][b]
    if pr.via_relay:
        ports[a].send(channel_wrap(pr.channel, payload), pr.turn_server)
    else:
        ports[a].send(payload, (pr.remote_addr, pr.remote_port))
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        got = ports[b].recv(deadline - time.monotonic())
        if got is None:
            return None
        data, src = got
        back = out[b][a]
        if back.via_relay and src == back.turn_server and is_channel_data(data):
            ch, data = channel_unwrap(data)
            assert ch == back.channel
        if data == payload:
            return data
    return None


def check_paths(ports, out):
    n = len(ports)
    for a in range(n):
        for b in range(n):
            if a != b:
                msg = b"\x41" + f"{a}->{b}".encode() * 20        # QUIC-short-header-like
                assert exchange(ports, out, a, b, msg) == msg, (a, b, out[a][b])


# ---- sans-I/O -----------------------------------------------------------------------

def test_priorities():
    assert candidate_priority("host") > candidate_priority("prflx") > \
        candidate_priority("srflx") > candidate_priority("relay")
    assert candidate_priority("host") == (126 << 24) | (65535 << 8) | 255
    g, d = candidate_priority("host"), candidate_priority("relay")
    assert pair_priority(g, d) == (d << 32) + 2 * g + 1
    assert pair_priority(d, g) == (d << 32) + 2 * g


def test_validate_record():
    good = {"ufrag": "ab", "pwd": "x" * 22, "candidates": [
        {"type": "host", "addr": "10.0.0.1", "port": 5, "priority": 1}]}
    assert validate_record(good)["candidates"][0]["public"] is False
    for bad in (None, [], {"pwd": "p", "candidates": []}, {**good, "ufrag": "a:b"},
                {**good, "candidates": "x"},
                {**good, "candidates": [{"type": "magic", "addr": "1.2.3.4", "port": 1,
                                         "priority": 1}]},
                {**good, "candidates": [{"type": "host", "addr": "nohost", "port": 1,
                                         "priority": 1}]},
                {**good, "candidates": [{"type": "host", "addr": "1.2.3.4", "port": 0,
                                         "priority": 1}]}):
        with pytest.raises(NatError):
            validate_record(bad, "rank 9")


def test_config():
    c = NatConfig.of({"stun_servers": [["1.2.3.4", "3478"]], "turn": ["h", 1, "u", "p"]})
    assert c.stun_servers == [("1.2.3.4", 3478)] and c.turn == ("h", 1, "u", "p")
    with pytest.raises(ValueError, match="unknown NAT config keys: nope"):
        NatConfig.of({"nope": 1})
    with pytest.raises(ValueError):
        NatConfig.of({"turn": ("h", 1)})
    with pytest.raises(ValueError):
        establish(None, 3, 2, None, None)


def test_pair_result():
    p = PairResult("srflx", "198.18.0.1", 5, False, remote_type="relay")
    assert not p.direct and "relay" in p.describe()
    assert PairResult("host", "1.2.3.4", 5, False).direct


# ---- loopback (no root): host candidates only ---------------------------------------

def test_loopback_mesh_of_three():
    ports = [SocketPort("127.0.0.1", 0) for _ in range(3)]
    try:
        out = ok(run_mesh(ports, {"check_timeout": 2.0, "linger": 0.3}))
        for r in range(3):
            assert set(out[r]) == set(range(3)) - {r}
            for peer, pr in out[r].items():
                assert pr.direct and pr.local_type == "host" and pr.remote_type == "host"
                assert (pr.remote_addr, pr.remote_port) == ports[peer].local_address()
            assert out[r].turn is None
        check_paths(ports, out)
    finally:
        for p in ports:
            p.close()


def test_loopback_unreachable_peer_times_out_clearly():
    ports = [SocketPort("127.0.0.1", 0) for _ in range(2)]
    st = Store()
    # rank 1 publishes a record but never answers (its port is closed)
    dead = SocketPort("127.0.0.1", 0)
    st.publish(1, {"ufrag": "dead", "pwd": "p" * 22, "candidates": [
        {"type": "host", "addr": "127.0.0.1", "port": dead.local_address()[1],
         "priority": candidate_priority("host")}]})
    dead.close()
    t = time.monotonic()
    with pytest.raises(NatError, match=r"rank 0: no working path to rank 1: UDP to every "
                                       r"candidate timed out; no TURN server configured"):
        establish(ports[0], 0, 2, lambda rec: st.publish(0, rec), st.fetch,
                  {"check_timeout": 1.0, "timeout": 5.0})
    assert time.monotonic() - t < 5.0
    for p in ports:
        p.close()


# ---- the NAT bed --------------------------------------------------------------------

KINDS = ["full_cone", "full_cone", "port_restricted", "port_restricted", "symmetric",
         "symmetric", "udp_blocked", "none"]
FC1, FC2, PR1, PR2, SY1, SY2, BLK, PUB = range(8)


@pytest.fixture(scope="module")
def bed():
    with NatBed(KINDS, hosts=[1, 1, 2, 1, 1, 1, 1, 1]) as b:
        b.start_turn()
        yield b


def cfg_of(bed, turn=True, **kw):
    c = {"stun_servers": bed.stun_servers, "turn": None}
    if turn:
        c["turn"] = (*bed.turn_server, natbed.TURN_USER, natbed.TURN_PASSWORD)
    c.update(kw)
    return c


def pair(bed, hosts, turn=True, **kw):
    ports = [bed.port(*h) if isinstance(h, tuple) else bed.port(h) for h in hosts]
    return ports, run_mesh(ports, cfg_of(bed, turn, **kw))


@needs_bed
def test_full_cone_pair_direct(bed):
    ports, out = pair(bed, [FC1, FC2])
    ok(out)
    for a, b in ((0, 1), (1, 0)):
        pr = out[a][b]
        # srflx, or prflx when the STUN answer came after the gathering window
        # (a loaded machine) and the peer's check told us the same mapping
        assert pr.direct and pr.local_type in ("srflx", "prflx")
        assert pr.remote_type in ("srflx", "prflx")
        assert pr.remote_addr == bed.public_address([FC1, FC2][b])
    assert out[0].turn is None and out[1].turn is None       # unused allocations released
    check_paths(ports, out)


@needs_bed
def test_port_restricted_pair_direct_by_hole_punching(bed):
    ports, out = pair(bed, [PR1, PR2])
    ok(out)
    for a, b in ((0, 1), (1, 0)):
        assert out[a][b].direct and out[a][b].remote_type == "srflx"
    check_paths(ports, out)


@needs_bed
def test_same_site_hosts_use_host_candidates(bed):
    ports, out = pair(bed, [(PR1, 0), (PR1, 1)])
    ok(out)
    assert out[0][1].local_type == out[0][1].remote_type == "host"
    assert out[0][1].remote_addr == bed.host(PR1, 1).addr
    check_paths(ports, out)


@needs_bed
@pytest.mark.parametrize("kinds", [(SY1, SY2), (SY1, PR1)], ids=["sym-sym", "sym-portrestr"])
def test_symmetric_goes_through_relay(bed, kinds):
    ports, out = pair(bed, list(kinds))
    ok(out)
    a, b = out[0][1], out[1][0]
    assert not a.direct and not b.direct
    # exactly one side sends through its own allocation (the other sends to that relay),
    # or both relay
    relays = [pr for pr in (a, b) if pr.via_relay]
    assert relays and all(pr.channel is not None and 0x4000 <= pr.channel <= 0x4FFF
                          and pr.turn_server == bed.turn_server for pr in relays)
    for pr, res in ((a, out[0]), (b, out[1])):
        if not pr.via_relay:
            assert pr.remote_type == "relay" and pr.remote_addr == bed.turn_server[0]
        else:
            assert res.turn is not None and res.turn.relay_info(
                (pr.remote_addr, pr.remote_port))["channel"] == pr.channel
    check_paths(ports, out)
    # the relay keeps working after a maintenance round that refreshes everything
    for res in out.values():
        if res.turn is not None:
            assert "allocation" in res.turn.maintain(now=time.monotonic() + 10_000)
    check_paths(ports, out)


@needs_bed
def test_symmetric_and_full_cone_direct_via_peer_reflexive(bed):
    ports, out = pair(bed, [SY1, FC1])
    ok(out)
    assert out[0][1].direct and out[0][1].local_type == "prflx"
    assert out[1][0].direct and out[1][0].remote_type == "prflx"
    check_paths(ports, out)


@needs_bed
def test_symmetric_pair_without_turn_fails_clearly(bed):
    ports, out = pair(bed, [SY1, SY2], turn=False, check_timeout=1.5, timeout=4.0)
    for r in (0, 1):
        assert isinstance(out[r], NatError)
        assert f"rank {r}: no working path to rank {1 - r}" in str(out[r])
        assert "no TURN server configured" in str(out[r])


@needs_bed
def test_udp_blocked_fails_naming_the_cause(bed):
    ports, out = pair(bed, [FC1, BLK], check_timeout=1.5, timeout=5.0, turn_timeout=1.0)
    assert isinstance(out[0], NatError) and isinstance(out[1], NatError)
    assert "no STUN server answered rank 1: its UDP seems blocked" in str(out[0])
    assert ("no STUN server answered this rank (198.18.0.1:3478, 198.18.0.2:3478): "
            "UDP from this rank seems blocked") in str(out[1])
    assert "TURN relay unusable" in str(out[1]) and "no answer to Allocate" in str(out[1])


@needs_bed
@pytest.mark.slow
def test_mesh_of_eight_across_nats(bed):
    hosts = [FC1, FC2, (PR1, 0), (PR1, 1), PR2, SY1, SY2, PUB]
    ports = [bed.port(*h) if isinstance(h, tuple) else bed.port(h) for h in hosts]
    t = time.monotonic()
    out = ok(run_mesh(ports, cfg_of(bed)))
    took = time.monotonic() - t
    kinds = [KINDS[h[0] if isinstance(h, tuple) else h] for h in hosts]
    for a in range(8):
        for b in range(8):
            if a == b:
                continue
            relayed = "symmetric" in (kinds[a], kinds[b]) and not (
                {kinds[a], kinds[b]} & {"full_cone", "none"})
            assert out[a][b].direct == (not relayed), (kinds[a], kinds[b], out[a][b])
    check_paths(ports, out)
    print(f"\nmesh of 8 across NATs formed in {took:.2f} s")


def test_hand_written_peer_checks_nomination_and_forged_requests():
    """Rank 0 (ours, controlling) against a peer written here from the RFCs: forged
    checks get no answer, valid ones a response keyed with rank 0's pwd, and rank 0
    nominates with USE-CANDIDATE on the pair that works."""
    from erdmampi.nat import stun
    from erdmampi.nat.stun import ATTR, Message
    p0, p1 = SocketPort("127.0.0.1", 0), SocketPort("127.0.0.1", 0)
    port1 = p1.local_address()[1]
    st, out = Store(), {}
    pwd1 = "peer-one-password-1234"
    st.publish(1, {"ufrag": "peer1", "pwd": pwd1, "candidates": [
        {"type": "host", "addr": "127.0.0.1", "port": p1.local_address()[1],
         "priority": candidate_priority("host")}]})

    def rank0():
        try:
            out[0] = establish(p0, 0, 2, lambda rec: st.publish(0, rec), st.fetch,
                               {"check_timeout": 2.0, "timeout": 6.0, "linger": 0.2})
        except Exception as e:
            out[0] = e
    t = threading.Thread(target=rank0)
    t.start()
    try:
        rec0 = st.fetch(0)
        a0 = p0.local_address()

        def req(key, user=f"{rec0['ufrag']}:peer1"):
            m = Message(stun.BINDING).add_text(ATTR.USERNAME, user)
            m.add_u32(ATTR.PRIORITY, candidate_priority("prflx"))
            m.add(ATTR.ICE_CONTROLLED, b"\1" * 8)
            return m
        forged = [req(b"wrong key"), req(rec0["pwd"].encode(), user="someoneelse:peer1")]
        for m in forged[:1]:
            p1.send(m.encode(key=b"wrong key"), a0)
        p1.send(forged[1].encode(key=rec0["pwd"].encode()), a0)
        good = req(None)
        p1.send(good.encode(key=rec0["pwd"].encode()), a0)
        got_good, nominated = False, False
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not (got_good and nominated):
            r = p1.recv(0.5)
            if r is None:
                if not got_good:
                    p1.send(good.encode(key=rec0["pwd"].encode()), a0)
                continue
            m = stun.decode(r[0])
            assert m.tid not in {f.tid for f in forged}, "a forged check was answered"
            if m.tid == good.tid:
                assert m.cls == stun.SUCCESS and stun.check_integrity(m, rec0["pwd"].encode())
                assert m.mapped_address() == p1.local_address()
                got_good = True
            elif m.cls == stun.REQUEST:
                assert m.text(ATTR.USERNAME) == f"peer1:{rec0['ufrag']}"
                assert stun.check_integrity(m, pwd1.encode())
                assert m.has(ATTR.ICE_CONTROLLING) and m.u32(ATTR.PRIORITY)
                resp = m.response().add_address(ATTR.XOR_MAPPED_ADDRESS, r[1])
                p1.send(resp.encode(key=pwd1.encode()), r[1])
                nominated |= m.has(ATTR.USE_CANDIDATE)
        assert got_good and nominated
    finally:
        t.join(15)
        p0.close()
        p1.close()
    res = out[0]
    assert not isinstance(res, Exception), res
    assert res[1].direct and (res[1].remote_addr, res[1].remote_port) == ("127.0.0.1", port1)
    assert res.relays() == []


def test_single_rank_needs_nothing():
    res = establish(None, 0, 1, None, None, {})
    assert dict(res) == {} and res.turn is None


@needs_bed
@pytest.mark.skipif(shutil.which("conntrack") is None, reason="conntrack not installed")
def test_recheck_after_the_path_was_cut(bed):
    from erdmampi.nat.agent import recheck
    ports, out = pair(bed, [PR1, PR2])
    ok(out)
    assert exchange(ports, out, 0, 1, b"\x41before") == b"\x41before"
    bed.cut_path(PR2)                  # drop its traffic and forget its NAT mappings
    try:
        assert exchange(ports, out, 0, 1, b"\x41during") is None
    finally:
        bed.restore_path(PR2)
    # the mapping is gone, so rank 1's filter drops rank 0 until both punch again
    assert exchange(ports, out, 0, 1, b"\x41stale") is None
    again = {}

    def one(r):
        try:
            again[r] = recheck(ports[r], out[r], [1 - r], {"check_timeout": 2.0})
        except Exception as e:
            again[r] = e
    th = [threading.Thread(target=one, args=(r,)) for r in (0, 1)]
    for t in th:
        t.start()
    for t in th:
        t.join(30)
    ok(again)
    assert again[0][1].direct and out[0][1] is again[0][1]
    check_paths(ports, out)
    with pytest.raises(ValueError):
        recheck(ports[0], out[0], [7])


def test_record_of_the_wrong_rank_is_refused():
    p = SocketPort("127.0.0.1", 0)
    try:
        rec = {"rank": 2, "ufrag": "x", "pwd": "y" * 22, "candidates": []}
        with pytest.raises(NatError, match="fetched for rank 1 says it is rank 2"):
            establish(p, 0, 2, lambda rec: None, lambda r: rec, {"linger": 0})
    finally:
        p.close()
