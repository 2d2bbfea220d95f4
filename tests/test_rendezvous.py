"""The rendezvous store: client (erdmampi.rendezvous) against the real server."""
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest

from erdmampi import rendezvous as rz
from erdmampi.rendezvous import Store, StoreError
from harness import rank_env

from erdmampi.launcher.store_server import StoreServer


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0) as s:
        yield s


@pytest.fixture
def store(server):
    st = Store("127.0.0.1", server.port, timeout=10)
    yield st
    st.close()


def test_set_get_roundtrip(store):
    store.set("a", b"\x00\x01binary\xff")
    store.set("s", "text é")
    assert store.get("a") == b"\x00\x01binary\xff"
    assert store.get("s") == "text é".encode()
    store.set("a", b"")                      # overwrite, empty value
    assert store.get("a") == b""


def test_get_waits_for_a_later_set(server, store):
    other = Store("127.0.0.1", server.port)
    t = threading.Timer(0.2, other.set, args=("late", b"v"))
    t.start()
    try:
        assert store.get("late", timeout=10) == b"v"
    finally:
        t.join()
        other.close()


def test_get_timeout_names_the_key(store):
    with pytest.raises(TimeoutError, match="'nokey'"):
        store.get("nokey", timeout=0.2)
    # the connection is still usable afterwards
    store.set("k", b"1")
    assert store.get("k", timeout=0) == b"1"


def test_add_counts_and_is_visible_through_get(store):
    assert store.add("c", 1) == 1
    assert store.add("c", 5) == 6
    assert store.add("c", -2) == 4
    assert store.get("c") == b"4"
    with pytest.raises(TypeError):
        store.add("c", 1.5)


def test_add_on_non_integer_value_is_an_error(store):
    store.set("x", b"abc")
    with pytest.raises(StoreError, match="non-integer"):
        store.add("x", 1)
    assert store.get("x") == b"abc"          # still serving on the same client


def test_concurrent_adds_from_many_clients(server):
    nthreads, per = 8, 50
    results = []

    def work():
        with Store("127.0.0.1", server.port) as st:
            for _ in range(per):
                results.append(st.add("ctr", 1))

    threads = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, nthreads * per + 1))


def test_one_client_shared_by_threads(store):
    """A blocking get in one thread must not block a set from another thread."""
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("v", store.get("shared", timeout=10)))
    t.start()
    threading.Event().wait(0.1)
    store.set("shared", b"ok")
    t.join(15)
    assert got.get("v") == b"ok"


def test_wait_and_check(server, store):
    assert store.check([]) is True
    assert store.check(["w1"]) is False
    with pytest.raises(TimeoutError) as ei:
        store.set("w1", b"")
        store.wait(["w1", "w2", "w3"], timeout=0.2)
    assert "w2" in str(ei.value) and "w3" in str(ei.value) and "'w1'" not in str(ei.value)
    other = Store("127.0.0.1", server.port)
    t = threading.Timer(0.2, lambda: (other.set("w2", b""), other.set("w3", b"")))
    t.start()
    try:
        store.wait(["w1", "w2", "w3"], timeout=10)
    finally:
        t.join()
        other.close()
    assert store.check(["w1", "w2", "w3"]) is True
    store.wait("w1")                          # a single key works too


def test_delete(store):
    store.set("d", b"1")
    assert store.delete("d") is True
    assert store.delete("d") is False
    assert store.check(["d"]) is False


def test_prefix_isolates_jobs(server):
    a = Store("127.0.0.1", server.port, prefix="jobA/")
    b = Store("127.0.0.1", server.port, prefix="jobB/")
    try:
        a.set("addr", b"A")
        b.set("addr", b"B")
        assert a.get("addr") == b"A" and b.get("addr") == b"B"
        assert sorted(server.keys()) == [b"jobA/addr", b"jobB/addr"]
        with pytest.raises(TimeoutError, match="'only_a'"):
            a.set("x", b"")
            b.wait(["only_a"], timeout=0.1)
    finally:
        a.close()
        b.close()


def test_many_keys(store):
    for i in range(2000):
        store.set(f"k/{i}", str(i * i).encode())
    store.wait([f"k/{i}" for i in range(2000)], timeout=5)
    assert all(store.get(f"k/{i}") == str(i * i).encode() for i in range(0, 2000, 7))


def test_large_values(server, store):
    from erdmampi.jobauth import JobKeys
    blob = os.urandom(1 << 20)
    with Store("127.0.0.1", server.port, auth=JobKeys(bytes(32), "j").store_auth()) as job:
        job.set("big", blob)
        assert job.get("big") == blob
        job.set("big2", blob * 3)
        assert job.get("big2") == blob * 3
    # the open space (no job secret) takes frames up to 64 KiB only
    store.set("small", blob[:60000])
    with pytest.raises(StoreError, match="job secret"):
        store.set("big", blob)
    assert store.get("small") == blob[:60000]


def test_bad_key_type(store):
    with pytest.raises(TypeError, match="key"):
        store.set(3, b"x")


def test_connect_to_nothing_fails_clearly():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                     # nobody listens there now
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        Store("127.0.0.1", port, timeout=0.3)


def test_server_closing_wakes_blocked_getters():
    srv = StoreServer("127.0.0.1", 0).start()
    st = Store("127.0.0.1", srv.port)
    errors = []

    def blocked():
        try:
            st.get("never", timeout=30)
        except (TimeoutError, StoreError) as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    threading.Event().wait(0.2)
    srv.close()
    t.join(10)
    st.close()
    assert not t.is_alive() and len(errors) == 1


def test_garbage_on_the_wire_does_not_kill_the_server(server, store):
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(struct.pack(">I", 0xFFFFFFFF) + b"junk")      # absurd frame length
        s.settimeout(5)
        assert s.recv(10) == b""                               # server drops that client
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(rz.encode_frame(99, [b"x"]))                 # unknown op
        s.settimeout(5)
        code, fields = rz.read_frame(s)
        assert code == rz.ST_ERROR and b"unknown" in fields[0]
    store.set("alive", b"1")
    assert store.get("alive") == b"1"


def test_encoding_roundtrip():
    body = rz.pack_fields(7, [b"", b"abc", b"\x00" * 5])
    assert rz.unpack_fields(body) == (7, [b"", b"abc", b"\x00" * 5])
    with pytest.raises(StoreError):
        rz.unpack_fields(body[:-1])


def test_parse_address():
    assert rz.parse_address("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert rz.parse_address("[::1]:5") == ("::1", 5)
    for bad in ("nohost", "h:x", ":5", "h:0"):
        with pytest.raises(ValueError):
            rz.parse_address(bad)


def test_standalone_server_process():
    p = subprocess.Popen([sys.executable, "-m", "erdmampi.launcher.store_server",
                          "--host", "127.0.0.1", "--port", "0"],
                         stdout=subprocess.PIPE, text=True, env=rank_env())
    try:
        addr = p.stdout.readline().strip()
        host, port = rz.parse_address(addr)
        with Store.from_address(addr, prefix="j/") as st:
            assert st.add("n", 2) == 2
            st.set("k", b"v")
            assert st.get("k") == b"v"
    finally:
        p.terminate()
        assert p.wait(10) == 0
        p.stdout.close()
