"""A hostile Internet against the rendezvous store, its client and the bootstrap.

Real sockets and real processes: a standalone store process measured through
/proc, raw TCP clients that lie about frame lengths, trickle bytes or idle,
strangers trying to create job spaces, a fake store that trickles or claims a
huge reply, and ranks bootstrapping with and without a job secret.
"""
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from harness import REPO, rank_env, run_mpi

from erdmampi import rendezvous as rz
from erdmampi.jobauth import JobKeys
from erdmampi.launcher import spawn
from erdmampi.launcher.store_server import StoreServer
from erdmampi.rendezvous import Store, StoreError

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))
PY = sys.executable


def _proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class _ServerProcess:
    """``python -m erdmampi.launcher.store_server`` on loopback."""

    def __init__(self, *args):
        self.p = subprocess.Popen([PY, "-m", "erdmampi.launcher.store_server", "--host",
                                   "127.0.0.1", "--port", "0", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=rank_env(), cwd=REPO)
        line = self.p.stdout.readline().strip()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", line), (line, self.p.stderr.read())
        self.address = line
        self.port = int(line.rsplit(":", 1)[1])

    def rss_kib(self):
        return _proc_status(self.p.pid, "VmRSS")

    def threads(self):
        return _proc_status(self.p.pid, "Threads")

    def close(self):
        self.p.terminate()
        try:
            assert self.p.wait(10) == 0
        finally:
            self.p.kill()
            self.p.wait()
            self.p.stdout.close()
            self.p.stderr.close()


@pytest.fixture
def server_process():
    s = _ServerProcess()
    yield s
    s.close()


def _connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _closed_within(sock, seconds):
    """True when the peer closes (EOF or reset) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _authenticated(port, secret=SECRET, jobid="job1"):
    """A raw socket that went through AUTH/PROVE (with the admission tag)."""
    keys = JobKeys(secret, jobid)
    s = _connect(port)
    s.sendall(rz.encode_frame(rz.OP_AUTH, [keys.namespace]))
    st, (nonce,) = rz.read_frame(s)
    assert st == rz.ST_OK
    s.sendall(rz.encode_frame(rz.OP_PROVE, [keys.public_key,
                                            keys.sign_challenge(keys.namespace, nonce),
                                            keys.admit_tag(keys.namespace, nonce)]))
    assert rz.read_frame(s)[0] == rz.ST_OK
    return s


# -- the server ------------------------------------------------------------------------

def test_a_header_claiming_1_gib_allocates_nothing(server_process):
    # before: the server allocated the claimed 1 GiB (bytearray(n)) on reading the header
    time.sleep(0.3)
    before = server_process.rss_kib()
    socks = []
    for _ in range(4):
        s = _connect(server_process.port)
        s.sendall(struct.pack(">I", 1 << 30) + b"\x01abc")
        socks.append(s)
    for s in socks:
        assert _closed_within(s, 5), "the server kept a connection that claimed 1 GiB"
        s.close()
    time.sleep(0.2)
    grown = server_process.rss_kib() - before
    assert grown < 1024, f"server RSS grew by {grown} KiB"
    with Store("127.0.0.1", server_process.port, timeout=5) as st:   # still serving
        st.set("k", b"v")
        assert st.get("k") == b"v"


def test_oversized_frames_are_refused_before_and_after_auth():
    with StoreServer("127.0.0.1", 0) as server:
        s = _connect(server.port)         # before auth: 64 KiB
        s.sendall(struct.pack(">I", rz.MAX_FRAME_UNAUTH + 1))
        assert _closed_within(s, 5)
        s.close()
        s = _connect(server.port)
        s.sendall(rz.encode_frame(rz.OP_SET, [b"k", b"x" * (rz.MAX_FRAME_UNAUTH - 20)]))
        assert rz.read_frame(s)[0] == rz.ST_OK       # at the limit: fine
        s.close()
        s = _authenticated(server.port)  # after auth: 16 MiB
        s.sendall(rz.encode_frame(rz.OP_SET, [b"big", b"y" * (1 << 20)]))
        assert rz.read_frame(s)[0] == rz.ST_OK
        s.sendall(struct.pack(">I", rz.MAX_FRAME + 1))
        assert _closed_within(s, 5)
        s.close()
        # the client refuses to send such frames, with a clear error
        with Store("127.0.0.1", server.port, timeout=5) as st:
            with pytest.raises(StoreError, match="over the store's limit"):
                st.set("k", b"z" * (rz.MAX_FRAME_UNAUTH + 1))


def test_idle_sockets_take_no_thread_and_do_not_block_a_job(server_process):
    # before: one thread per connection (ThreadingTCPServer): 200 idle sockets, 200 threads
    idle = [_connect(server_process.port) for _ in range(200)]
    try:
        time.sleep(0.5)
        assert server_process.threads() <= 3, server_process.threads()
        ranks = _bootstrap_ranks(server_process.address, 2, {"ERDMA_JOB_SECRET": SECRET.hex()})
        for rc, out in ranks:
            assert rc == 0, out
            assert "sum 3" in out, out
        assert server_process.threads() <= 3
    finally:
        for s in idle:
            s.close()


def test_slowloris_and_idle_connections_are_closed_after_their_deadline():
    # before: no deadline: a byte every few seconds held a connection (and a thread) forever
    with StoreServer("127.0.0.1", 0, read_timeout=1.0, idle_timeout=1.5) as server:
        slow = _connect(server.port)
        frame = rz.encode_frame(rz.OP_SET, [b"k", b"v" * 100])
        t0 = time.monotonic()
        closed = False
        for b in frame:
            try:
                slow.sendall(bytes((b,)))
            except OSError:
                closed = True
                break
            if _closed_within(slow, 0.2):
                closed = True
                break
        elapsed = time.monotonic() - t0
        assert closed and elapsed < 3.0, f"slowloris held its connection {elapsed:.1f} s"
        assert server.keys() == []
        slow.close()
        idle = _connect(server.port)
        t0 = time.monotonic()
        assert _closed_within(idle, 5)
        assert 1.0 < time.monotonic() - t0 < 3.0
        idle.close()
        # a client that idles past the deadline reconnects transparently
        with Store("127.0.0.1", server.port, timeout=5) as st:
            st.set("a", b"1")
            time.sleep(2.0)
            assert st.get("a") == b"1"


def test_connection_caps_per_source_and_in_all():
    with StoreServer("127.0.0.1", 0, max_conns_per_source=5) as server:
        socks = [_connect(server.port) for _ in range(5)]
        extra = _connect(server.port)
        assert _closed_within(extra, 5)
        for s in socks:
            s.sendall(rz.encode_frame(rz.OP_PING))
            assert rz.read_frame(s)[0] == rz.ST_OK
        socks.pop().close()
        time.sleep(0.3)
        again = _connect(server.port)          # a freed slot can be used again
        again.sendall(rz.encode_frame(rz.OP_PING))
        assert rz.read_frame(again)[0] == rz.ST_OK
        for s in socks + [extra, again]:
            s.close()
    with StoreServer("127.0.0.1", 0, max_conns=3) as server:
        socks = [_connect(server.port) for _ in range(3)]
        extra = _connect(server.port)
        assert _closed_within(extra, 5)
        for s in socks + [extra]:
            s.close()


def test_require_auth_keeps_strangers_out():
    # before: the first PROVE for any namespace created a job space for whoever sent it
    with pytest.raises(ValueError, match="admit"):
        StoreServer("127.0.0.1", 0, require_auth=True)
    with StoreServer("127.0.0.1", 0, require_auth=True, admit=[SECRET]) as server:
        stranger = JobKeys(OTHER, "job1")
        with pytest.raises(StoreError, match="not admitted"):
            Store("127.0.0.1", server.port, timeout=5, auth=stranger.store_auth())
        s = _connect(server.port)          # a PROVE without an admission tag
        s.sendall(rz.encode_frame(rz.OP_AUTH, [stranger.namespace]))
        _, (nonce,) = rz.read_frame(s)
        s.sendall(rz.encode_frame(rz.OP_PROVE, [stranger.public_key,
                                                stranger.sign_challenge(stranger.namespace,
                                                                        nonce)]))
        assert rz.read_frame(s)[0] == rz.ST_ERROR and _closed_within(s, 5)
        s.close()
        with Store("127.0.0.1", server.port, timeout=5) as anon:
            with pytest.raises(StoreError, match="only serves authenticated"):
                anon.set("k", b"v")
        assert server.jobs() == [] and server.keys() == []
        keys = JobKeys(SECRET, "job1")     # the admitted job
        with Store("127.0.0.1", server.port, timeout=5, auth=keys.store_auth()) as st:
            st.set("k", b"v")
            assert st.get("k") == b"v"
        assert server.jobs() == [keys.namespace]
    with StoreServer("127.0.0.1", 0, require_auth=True, admit=[SECRET], auth_timeout=1.0) as server:
        s = _connect(server.port)          # an unauthenticated connection has auth_timeout
        s.sendall(rz.encode_frame(rz.OP_PING))
        assert rz.read_frame(s)[0] == rz.ST_OK
        assert _closed_within(s, 4)
        s.close()


def test_per_job_quotas():
    with StoreServer("127.0.0.1", 0, max_keys=10, max_bytes=8192) as server:
        keys = JobKeys(SECRET, "quota")
        with Store("127.0.0.1", server.port, timeout=5, auth=keys.store_auth()) as st:
            for i in range(10):
                st.set(f"k{i}", b"v")
            with pytest.raises(StoreError, match="full.*10 keys"):
                st.set("k10", b"v")
            st.set("k0", b"w")               # replacing a key is fine
            assert st.delete("k9")
            st.set("k10", b"v")              # a deleted key frees its slot
            with pytest.raises(StoreError, match="full.*8192 bytes"):
                st.set("k1", b"x" * 9000)
            assert st.get("k1") == b"v"
        with Store("127.0.0.1", server.port, timeout=5) as anon:   # the open space too
            for i in range(10):
                anon.set(f"o{i}", b"v")
            with pytest.raises(StoreError, match="full"):
                anon.set("o10", b"v")
    with StoreServer("127.0.0.1", 0, max_total_bytes=4096) as server:
        a = Store("127.0.0.1", server.port, timeout=5, auth=JobKeys(SECRET, "a").store_auth())
        b = Store("127.0.0.1", server.port, timeout=5, auth=JobKeys(OTHER, "b").store_auth())
        a.set("k", b"x" * 3000)
        with pytest.raises(StoreError, match="store is full"):
            b.set("k", b"y" * 3000)
        a.close()
        b.close()


def test_blocked_requests_are_bounded():
    # before: a WAIT could name ~13000 keys per 64 KiB frame on every connection,
    # each an entry of the server's waiter table (hundreds of MB from one address)
    with StoreServer("127.0.0.1", 0, max_waiting=10) as server:
        a, b = _connect(server.port), _connect(server.port)
        a.sendall(rz.encode_frame(rz.OP_WAIT, [b"-1"] + [b"a%d" % i for i in range(8)]))
        time.sleep(0.3)
        assert len(server.pending()) == 8
        b.sendall(rz.encode_frame(rz.OP_WAIT, [b"-1"] + [b"b%d" % i for i in range(5)]))
        st, (msg,) = rz.read_frame(b)
        assert st == rz.ST_ERROR and b"too many blocked" in msg
        a.close()
        time.sleep(0.3)
        assert server.pending() == []             # a hang-up frees its waiters
        b.sendall(rz.encode_frame(rz.OP_WAIT, [b"100"] + [b"b%d" % i for i in range(5)]))
        st, missing = rz.read_frame(b)
        assert st == rz.ST_TIMEOUT and len(missing) == 5
        b.sendall(rz.encode_frame(rz.OP_WAIT, [b"0"] + [b"k%d" % i for i in range(4097)]))
        st, (msg,) = rz.read_frame(b)
        assert st == rz.ST_ERROR and b"at most 4096 keys" in msg
        b.close()


# -- the client against a hostile server --------------------------------------------------

class _HostileServer:
    """Accepts connections and answers every request with ``behaviour(sock)``."""

    def __init__(self, behaviour):
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.socks = []
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        self.lsock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.socks.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        try:
            s.settimeout(30)
            while not self.stop.is_set():
                head = s.recv(4)
                if len(head) < 4:
                    return
                s.recv(struct.unpack(">I", head)[0], socket.MSG_WAITALL)
                self.behaviour(s, self.stop)
        except OSError:
            pass

    def close(self):
        self.stop.set()
        self.lsock.close()
        for s in self.socks:
            s.close()
        self.t.join(5)


def _trickle(s, stop):
    reply = rz.encode_frame(rz.ST_OK, [os.urandom(32)])
    for b in reply:          # a byte every 0.4 s: each recv sees progress
        if stop.wait(0.4):
            return
        s.sendall(bytes((b,)))


def _huge(s, stop):
    s.sendall(struct.pack(">I", 0x7FFFFFFF) + b"\x00" * 64)


@pytest.mark.parametrize("auth", [False, True])
def test_a_trickling_server_cannot_hold_the_client_past_its_deadline(auth):
    # before: a per-recv timeout that each trickled byte reset: blocked far past the timeout
    srv = _HostileServer(_trickle)
    try:
        kw = {"auth": JobKeys(SECRET, "j").store_auth()} if auth else {}
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=f"127.0.0.1:{srv.port}.*within"):
            st = Store("127.0.0.1", srv.port, timeout=2.0, **kw)
            st.set("k", b"v")
        elapsed = time.monotonic() - t0
        assert elapsed < (5.0 if auth else 2.0) + 1.5, elapsed
    finally:
        srv.close()


def test_a_server_claiming_a_huge_reply_is_refused_at_once():
    srv = _HostileServer(_huge)
    try:
        t0 = time.monotonic()
        with Store("127.0.0.1", srv.port, timeout=5.0) as st:
            with pytest.raises(StoreError, match=f"127.0.0.1:{srv.port}.*bad frame length"):
                st.set("k", b"v")
        assert time.monotonic() - t0 < 2.0
    finally:
        srv.close()


# -- bootstrap: fail closed without a secret; the deadline holds -------------------------

ALLREDUCE = ("from erdmampi import MPI\n"
             "c = MPI.COMM_WORLD\n"
             "print('rank', c.rank, 'sum', c.allreduce(c.rank + 1), flush=True)\n")


def _bootstrap_ranks(address, n, extra, timeout=60):
    procs = []
    for r in range(n):
        env = {k: v for k, v in rank_env().items() if not k.startswith("ERDMA_")}
        env.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), ERDMA_RENDEZVOUS=address,
                   ERDMA_JOBID="hostile-" + str(os.getpid()), ERDMA_CONNECT_TIMEOUT="20")
        env.update(extra)
        procs.append(subprocess.Popen([PY, "-c", ALLREDUCE], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


@pytest.mark.slow
def test_bootstrap_without_a_secret_fails_closed():
    # before: ranks silently exchanged plain records that anyone could forge
    with StoreServer("127.0.0.1", 0) as server:
        t0 = time.monotonic()
        outs = _bootstrap_ranks(server.address, 2, {}, timeout=30)
        assert time.monotonic() - t0 < 20
        for rc, out in outs:
            assert rc != 0, out
            assert "no job secret" in out and "ERDMA_JOB_SECRET" in out, out
            assert "ERDMA_INSECURE=1" in out and "--insecure" in out, out
        assert server.keys() == []          # nothing was published
        outs = _bootstrap_ranks(server.address, 2, {"ERDMA_INSECURE": "1"})
        for r, (rc, out) in enumerate(outs):
            assert rc == 0, out
            assert f"rank {r} sum 3" in out, out
        warned = [line for _, out in outs for line in out.splitlines()
                  if "warning: ERDMA_INSECURE=1" in line]
        assert len(warned) == 1 and "forge" in warned[0], outs


@pytest.mark.slow
def test_bootstrap_against_a_trickling_server_ends_within_the_connect_timeout():
    # before: each trickled byte reset a per-recv timeout; the ranks stayed blocked
    srv = _HostileServer(_trickle)
    try:
        t0 = time.monotonic()
        outs = _bootstrap_ranks(f"127.0.0.1:{srv.port}", 2,
                                {"ERDMA_JOB_SECRET": SECRET.hex(),
                                 "ERDMA_CONNECT_TIMEOUT": "3"}, timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        srv.close()
    for rc, out in outs:
        assert rc != 0 and f"rendezvous store 127.0.0.1:{srv.port}" in out, out
    assert elapsed < 15, elapsed


# -- erdmarun's own store -------------------------------------------------------------------

def test_erdmarun_store_listens_where_its_ranks_are_and_needs_the_secret(tmp_path):
    job = spawn.Job(["true"], 2, hosts=spawn.parse_hosts("hostA:2"), launcher_cmd="true",
                    rendezvous_addr="127.0.0.1")
    server = job._start_store(job._placement())
    try:
        assert server.host == "127.0.0.1"       # before: 0.0.0.0 for jobs with remote hosts
        assert server.require_auth
        with Store("127.0.0.1", server.port, timeout=5) as anon:
            with pytest.raises(StoreError, match="only serves authenticated"):
                anon.set("k", b"v")
        other = JobKeys(OTHER, job.jobid)
        with pytest.raises(StoreError, match="not admitted"):
            Store("127.0.0.1", server.port, timeout=5, auth=other.store_auth())
        mine = JobKeys(job.secret, job.jobid)
        with Store("127.0.0.1", server.port, timeout=5, auth=mine.store_auth()) as st:
            st.set("k", b"v")
    finally:
        server.close()


@pytest.mark.slow
def test_erdmarun_insecure_reaches_the_ranks():
    r = run_mpi(2, "import os\nfrom erdmampi import MPI\n"
                   "print('I', os.environ.get('ERDMA_INSECURE'), MPI.COMM_WORLD.allreduce(1))\n",
                extra=["--insecure"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("I 1 2") == 2, r.stdout
