"""open_store (TCP store or DHT, sealed with a job secret), the DHT-backed local store."""
import hashlib
import json
import logging

import pytest

from erdmampi import discovery
from erdmampi.dht import DhtKey, DhtNode, key_id
from erdmampi.jobauth import JobKeys, RecordAuthError, SealedStore
from erdmampi.launcher.store_server import StoreServer
from erdmampi.rendezvous import Store, StoreError

SECRET = "5e" * 32
OTHER = "0f" * 32
RECORD = json.dumps({"addr": "10.0.0.7", "port": 5000, "fp": "cd" * 32}).encode()


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0) as s:
        yield s


@pytest.fixture
def dht():
    """Three full nodes on loopback."""
    net = [DhtNode("127.0.0.1", 0, rpc_timeout=1.0) for _ in range(3)]
    for n in net[1:]:
        n.bootstrap([net[0].address], timeout=5)
    yield net
    for n in net:
        n.close()


def _peers(net):
    return ",".join(f"{h}:{p}" for h, p in (n.address for n in net))


def test_tcp_without_secret_is_the_old_protocol(server):
    env = {"ERDMA_RENDEZVOUS": f"127.0.0.1:{server.port}", "ERDMA_JOBID": "j1"}
    with discovery.open_store(env, timeout=5) as st:
        assert isinstance(st, Store)
        st.set("ep/0", RECORD)
        assert st.get("ep/0", 1) == RECORD
    assert server.keys() == [b"j1/ep/0"]                   # what bootstrap has always written


def test_tcp_with_secret_is_sealed_and_authenticated(server, tmp_path):
    f = tmp_path / "job.key"
    f.write_text(SECRET)
    f.chmod(0o600)
    envs = [{"ERDMA_RENDEZVOUS": f"127.0.0.1:{server.port}", "ERDMA_JOBID": "j1",
             "ERDMA_JOB_SECRET": SECRET},
            {"ERDMA_RENDEZVOUS": f"127.0.0.1:{server.port}", "ERDMA_JOBID": "j1",
             "ERDMA_JOB_SECRET_FILE": str(f)}]
    a, b = (discovery.open_store(e, timeout=5) for e in envs)
    try:
        assert isinstance(a, SealedStore)
        a.set("ep/0", RECORD)
        assert b.get("ep/0", 2) == RECORD                    # secret from a file: same job
        assert server.keys() == []                           # not in the open space
        with pytest.raises(TimeoutError, match="'ep/3' of job 'j1' did not appear"):
            b.get("ep/3", 0.2)
    finally:
        a.close()
        b.close()
    # another secret, same job id: a space of its own; the job's records are not there
    with discovery.open_store(dict(envs[0], ERDMA_JOB_SECRET=OTHER), timeout=5) as c:
        with pytest.raises(TimeoutError):
            c.get("ep/0", 0.2)


def test_errors_are_clear(server):
    with pytest.raises(ValueError, match="ERDMA_RENDEZVOUS.*ERDMA_DHT"):
        discovery.open_store({"ERDMA_JOBID": "x"})
    with pytest.raises(ValueError, match="128"):
        discovery.open_store({"ERDMA_RENDEZVOUS": f"127.0.0.1:{server.port}",
                              "ERDMA_JOB_SECRET": "abcd"})
    with pytest.raises(ConnectionError, match="cannot reach"):
        discovery.open_store({"ERDMA_RENDEZVOUS": "127.0.0.1:1", "ERDMA_JOB_SECRET": SECRET},
                             timeout=0.3)
    with StoreServer("127.0.0.1", 0, require_auth=True, admit=[SECRET]) as strict:
        with discovery.open_store({"ERDMA_RENDEZVOUS": f"127.0.0.1:{strict.port}"},
                                  timeout=2) as st:
            with pytest.raises(StoreError, match="authenticated jobs"):
                st.set("ep/0", b"x")


def test_dht_store_through_open_store(dht):
    env = {"ERDMA_DHT": _peers(dht[:1]), "ERDMA_DHT_BIND": "127.0.0.1:0",
           "ERDMA_JOBID": "d1", "ERDMA_JOB_SECRET": SECRET}
    a = discovery.open_store(env, timeout=5)
    b = discovery.open_store(dict(env, ERDMA_DHT=_peers(dht[2:])), timeout=5)
    try:
        a.set("ep/0", RECORD)
        assert b.get("ep/0", 3) == RECORD
        with pytest.raises(TimeoutError, match="'ep/1'"):
            b.get("ep/1", 0.3)
    finally:
        a.close()
        b.close()
    # nothing a DHT node holds says what it is
    keys = JobKeys(SECRET, "d1")
    held = [v for n in dht for v in n.held_values()]
    assert held and all(b"10.0.0.7" not in v for v in held)
    assert keys.open("ep/0", held[0]) == RECORD


def test_dht_forger_is_refused_and_logged(dht, caplog):
    caplog.set_level(logging.WARNING, logger="erdmampi.discovery")
    keys = JobKeys(SECRET, "d1")
    name = keys.opaque("ep/2")
    env = {"ERDMA_DHT": _peers(dht[:1]), "ERDMA_DHT_BIND": "127.0.0.1:0",
           "ERDMA_JOBID": "d1", "ERDMA_JOB_SECRET": SECRET}
    with discovery.open_store(env, timeout=5) as st:
        signer = st.raw.signer
        # a DHT node (no secret) forges the record: under its own key it lands where the
        # job never looks; claiming the job's key, the nodes refuse it (bad signature)
        forger = dht[1]
        forger.put(name, b'{"addr": "6.6.6.6", "port": 1, "fp": "00"}', DhtKey())
        forged = JobKeys(OTHER, "d1").seal("ep/2", RECORD)
        kid = key_id(name, signer)
        sig = DhtKey().sign(kid, forged)
        assert forger._publish(kid, signer.public, hashlib.sha256(name).digest(), forged,
                               sig) == 1                  # only the forger's own copy
        with pytest.raises(TimeoutError, match="ep/2"):
            st.get("ep/2", 0.5)
        held = [v for n in dht[::2] for v in n.held_values()]
        assert forged not in held
        st.set("ep/2", RECORD)
        assert st.get("ep/2", 2) == RECORD
        assert not [r for r in caplog.records if "refused rendezvous record" in r.getMessage()]
    # signed with the job's DHT key but sealed for another job (only a holder of the
    # secret could do that): the sealed layer still refuses it, logged once
    with discovery.open_store(env, timeout=5) as st:
        st.raw.node.put(keys.opaque("ep/3"), forged, st.raw.signer)
        with pytest.raises(RecordAuthError, match="ep/3"):
            st.get("ep/3", 2)
        logged = [r for r in caplog.records if "refused rendezvous record" in r.getMessage()]
        assert len(logged) == 1 and "'ep/3'" in logged[0].getMessage()


def test_dht_backed_local_store(dht):
    """erdmarun --dht: each site's ranks use a local TCP store whose records live in the DHT."""
    site_a = discovery.DhtStoreServer(dht[1], "j9", bytes.fromhex(SECRET), poll=0.05).start()
    site_b = discovery.DhtStoreServer(dht[2], "j9", bytes.fromhex(SECRET), poll=0.05).start()
    try:
        # a rank of site A with the old (plain) client, a rank of site B with open_store
        plain = Store.from_address(site_a.address, prefix="j9/", timeout=5)
        plain.set("ep/0", RECORD)
        plain_b = Store.from_address(site_b.address, prefix="j9/", timeout=5)
        assert plain_b.get("ep/0", 5) == RECORD
        sealed_b = discovery.open_store({"ERDMA_RENDEZVOUS": site_b.address, "ERDMA_JOBID": "j9",
                                         "ERDMA_JOB_SECRET": SECRET}, timeout=5)
        sealed_a = discovery.open_store({"ERDMA_RENDEZVOUS": site_a.address, "ERDMA_JOBID": "j9",
                                         "ERDMA_JOB_SECRET": SECRET}, timeout=5)
        sealed_b.set("ep/1", RECORD + b"!")
        assert sealed_a.get("ep/1", 5) == RECORD + b"!"
        for s in (plain, plain_b, sealed_a, sealed_b):
            s.close()
        # what went into the DHT is sealed with the job's keys
        held = [v for n in dht for v in n.held_values()]
        assert held and all(RECORD not in v for v in held)
    finally:
        site_a.close()
        site_b.close()


def test_claim_ranks_and_parse(server):
    st = discovery.store_for("jc", bytes.fromhex(SECRET), rendezvous=f"127.0.0.1:{server.port}")
    try:
        assert discovery.claim_ranks(st, 8, count=3) == (0, 3)
        assert discovery.claim_ranks(st, 8, count=3) == (3, 3)
        with pytest.raises(ValueError, match="already has its 8 ranks"):
            discovery.claim_ranks(st, 8, count=3)
        assert discovery.claim_ranks(st, 8, count=2, first=6) == (6, 2)
        with pytest.raises(ValueError, match="rank 6 .* already taken"):
            discovery.claim_ranks(st, 8, count=1, first=6)
    finally:
        st.close()
    assert discovery.parse_ranks("2-5", 8) == (2, 4) and discovery.parse_ranks("7", 8) == (7, 1)
    for bad in ("5-2", "0-8", "a-b", "-1"):
        with pytest.raises(ValueError):
            discovery.parse_ranks(bad, 8)
    assert discovery.format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
