"""The Kademlia DHT (erdmampi.dht): real UDP sockets on loopback, nodes in one process."""
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from erdmampi.dht import K, DhtError, DhtKey, DhtNode, DhtStore, key_id, parse_peers

KEY = DhtKey()


def _dist(a, b):
    return int.from_bytes(a, "big") ^ int.from_bytes(b, "big")


@pytest.fixture
def nodes():
    made = []

    def make(n, **kw):
        kw.setdefault("rpc_timeout", 1.0)
        new = [DhtNode("127.0.0.1", 0, **kw) for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for n in made:
        n.close()


def _network(make, n):
    net = make(n)
    for node in net[1:]:
        assert node.bootstrap([net[0].address], timeout=5) == 1
    return net


def test_bootstrap_fills_routing_tables(nodes):
    net = _network(nodes, 10)
    for node in net:
        ids = {nid for nid, _ in node.contacts()}
        assert node.id not in ids and len(ids) >= 5
        # every contact is a real node with the address it speaks from
        for nid, addr in node.contacts():
            assert next(m for m in net if m.id == nid).address == addr


def test_store_on_the_k_closest_and_find_from_anywhere(nodes):
    net = _network(nodes, 12)
    assert K < len(net)
    stored = net[5].put(b"job/ep/0", b"record-0", KEY)
    assert stored == K
    kid = key_id(b"job/ep/0", KEY)
    closest = sorted(net, key=lambda n: _dist(n.id, kid))[:K]
    holders = [n for n in net if n.stored()]
    assert set(holders) == set(closest)                  # XOR metric: the K closest hold it
    for node in net:
        assert node.get_all(b"job/ep/0", KEY.public, timeout=2) == [b"record-0"]
    with pytest.raises(TimeoutError, match="not found"):
        net[0].get_all(b"job/ep/9", KEY.public, timeout=0.3)


def test_values_survive_churn(nodes):
    net = _network(nodes, 10)
    origin = net[0]
    origin.put(b"k", b"v1", KEY)
    # half the nodes leave, holders among them; newcomers join through a survivor
    kid = key_id(b"k", KEY)
    leaving = sorted(net[1:], key=lambda n: _dist(n.id, kid))[:5]
    for n in leaving:
        n.close()
    alive = [n for n in net if n not in leaving]
    newcomers = nodes(3)
    for n in newcomers:
        n.bootstrap([alive[-1].address], timeout=5)
    # one republish period: every node re-stores what it published or holds (run now,
    # in parallel); lookups drop the dead contacts and find the newcomers
    with ThreadPoolExecutor(len(alive)) as pool:
        list(pool.map(lambda n: n.republish_now(), alive))
    # every survivor still finds it (lookups skip the dead nodes once they time out)
    with ThreadPoolExecutor(len(newcomers + alive)) as pool:
        found = list(pool.map(lambda n: n.get_all(b"k", KEY.public, timeout=5), newcomers + alive))
    assert found == [[b"v1"]] * len(found)
    # the newcomers that are now among the closest hold a copy themselves, at
    # the latest after another period (a store to a node a busy lookup had not
    # yet found waits for the next one)
    live = alive + newcomers
    closest = sorted(live, key=lambda n: _dist(n.id, kid))[:K]
    for _ in range(2):
        if all(n.stored() == 1 for n in closest):
            break
        with ThreadPoolExecutor(len(alive)) as pool:
            list(pool.map(lambda n: n.republish_now(), alive))
    assert [n.stored() for n in closest] == [1] * len(closest), \
        [(n in newcomers, n is origin) for n in closest]


def test_several_values_per_key_newest_first(nodes):
    net = _network(nodes, 5)
    net[1].put(b"k", b"first", KEY)
    net[2].put(b"k", b"second", KEY)
    got = net[3].get_all(b"k", KEY.public, timeout=2)
    assert set(got) == {b"first", b"second"}
    assert net[4].get(b"k", KEY.public, timeout=2) in (b"first", b"second")


def test_client_nodes_are_not_routed_to(nodes):
    net = _network(nodes, 4)
    client = nodes(1, client=True)[0]
    client.bootstrap([net[0].address], timeout=5)
    client.put(b"k", b"from client", KEY)
    assert net[2].get_all(b"k", KEY.public, timeout=2) == [b"from client"]
    assert client.stored() == 0
    for n in net:
        assert client.id not in {nid for nid, _ in n.contacts()}


def test_garbage_does_not_stop_a_node(nodes):
    net = _network(nodes, 3)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for junk in (b"", b"\xff" * 100, b"[1,2]", b'{"y":"q","id":"zz"}',
                     b'{"y":"q","t":"1","q":"store","id":"' + b"00" * 20 + b'","a":{}}',
                     b'{"y":"q","t":"1","q":"store","id":"' + b"00" * 20
                     + b'","a":{"key":"00","value":"x"}}'):
            s.sendto(junk, net[0].address)
    net[1].put(b"k", b"v", KEY)
    assert net[2].get_all(b"k", KEY.public, timeout=2) == [b"v"]


def test_bootstrap_timeout_and_bad_peers(nodes):
    node = nodes(1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        with pytest.raises(TimeoutError, match="no DHT peer answered"):
            node.bootstrap([silent.getsockname()], timeout=0.6)
    with pytest.raises(ValueError, match="host:port"):
        parse_peers("nohost")
    assert parse_peers("a:1, [::1]:2") == [("a", 1), ("::1", 2)]
    assert node.bootstrap([]) == 0 and node.bootstrap([node.address]) == 0   # alone is fine
    with pytest.raises(ValueError, match="limited"):
        node.put(b"k", b"x" * 10000, KEY)


def test_dht_store_interface(nodes):
    net = _network(nodes, 3)
    a, b = DhtStore(net[1], prefix="job/", timeout=2), DhtStore(net[2], prefix="job/")
    a.set("ep/0", "hello")
    assert b.get("ep/0", 2) == b"hello" and b.check(["ep/0"]) and not b.check(["ep/1"])
    with pytest.raises(DhtError, match="atomic"):
        a.add("n", 1)
    with pytest.raises(TimeoutError):
        b.get("ep/1", 0.2)


def test_large_values_fit_in_replies(nodes):
    net = _network(nodes, 3)
    big = [bytes([i]) * 8000 for i in range(12)]      # more than one datagram could carry
    for v in big:
        net[1].put(b"k", v, KEY)
    reader = nodes(1, client=True)[0]                  # holds nothing: reads from replies
    reader.bootstrap([net[0].address], timeout=5)
    got = reader.get_all(b"k", KEY.public, timeout=2)
    assert got and set(got) <= set(big) and big[-1] in got
