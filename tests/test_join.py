"""Several erdmarun invocations (sites) join one job: --rendezvous / --dht --job-id.

Real processes and sockets: a standalone rendezvous server (erdmarun
--serve-rendezvous), two erdmarun per job, a real erdmampi program. The last
test puts the server and two sites in network namespaces of their own.
"""
import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from harness import REPO, erdmarun_cmd, rank_env

from erdmampi import discovery
from erdmampi.rendezvous import Store, StoreError

PY = sys.executable

PROGRAM = """\
import numpy as np
from erdmampi import MPI
c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
x = np.arange(5, dtype=np.float64) + r
y = np.empty_like(x)
c.Allreduce(x, y, op=MPI.SUM)
assert (y == n * np.arange(5) + n * (n - 1) / 2).all(), y
b = np.arange(4, dtype=np.int64) * 11 if r == n - 1 else np.zeros(4, np.int64)
c.Bcast(b, root=n - 1)
assert (b == np.arange(4) * 11).all(), b
assert c.allreduce(r) == n * (n - 1) // 2
print(f"OK rank={r} size={n} sum={y[0]:g}", flush=True)
"""


@pytest.fixture
def program(tmp_path):
    p = tmp_path / "job.py"
    p.write_text(PROGRAM)
    return str(p)


def _start_server(*extra, prefix=()):
    p = subprocess.Popen(list(prefix) + erdmarun_cmd() + ["--serve-rendezvous", *extra],
                         env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, stdin=subprocess.DEVNULL)
    line = p.stdout.readline().strip()
    if not re.fullmatch(r"[\d.]+:\d+", line):
        p.kill()
        raise AssertionError(f"no address from the server: {line!r} {p.stderr.read()}")
    return p, line


@pytest.fixture
def rdv_server():
    p, addr = _start_server("127.0.0.1:0")
    yield addr
    p.send_signal(signal.SIGTERM)
    try:
        assert p.wait(10) == 0
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


@pytest.fixture
def secret_env():
    return {"ERDMA_JOB_SECRET": secrets.token_hex(32), "PYTHONUNBUFFERED": "1"}


def _site(args, env, prefix=()):
    return subprocess.Popen(list(prefix) + erdmarun_cmd() + [str(a) for a in args],
                            env=rank_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, cwd=REPO)


def _finish(procs, timeout=60):
    out = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def _ranks(stdout):
    return sorted(int(m) for m in re.findall(r"^\[(\d+)\] OK rank=\1 size=4 sum=6$", stdout, re.M))


def test_two_sites_form_one_job_at_a_rendezvous(rdv_server, secret_env, program):
    jid = "job-" + secrets.token_hex(4)
    common = ["--rendezvous", rdv_server, "--job-id", jid, "-n", 4, "--local-n", 2, "-l",
              "--connect-timeout", 20, "--timeout", 60]
    (ra, oa, ea), (rb, ob, eb) = _finish([_site(common + [PY, program], secret_env),
                                          _site(common + [PY, program], secret_env)])
    assert ra == 0 and rb == 0, ea + eb
    a, b = _ranks(oa), _ranks(ob)
    # each site ran two ranks, contiguous and unique; together all four
    assert sorted([a, b]) == [[0, 1], [2, 3]], (oa, ob)


def test_a_waiting_site_says_who_joined_and_who_is_awaited(rdv_server, secret_env, program):
    jid = "job-" + secrets.token_hex(4)
    common = ["--rendezvous", rdv_server, "--job-id", jid, "-n", 4, "--local-n", 2,
              "--connect-timeout", 30, "--timeout", 60]
    first = _site(common + [PY, program], secret_env)
    time.sleep(3)  # the second site comes late
    (ra, oa, ea), (rb, ob, eb) = _finish([first, _site(common + [PY, program], secret_env)])
    assert ra == 0 and rb == 0, ea + eb
    assert f"erdmarun: job {jid}: 2 of 4 ranks joined; waiting for ranks 2-3" in ea, ea
    assert f"erdmarun: job {jid}: all 4 ranks joined" in ea, ea
    assert ea.index("waiting for ranks 2-3") < ea.index("all 4 ranks joined")


def test_a_missing_site_fails_every_site_in_bounded_time(rdv_server, secret_env, program):
    jid = "job-" + secrets.token_hex(4)
    t0 = time.monotonic()
    [(rc, out, err)] = _finish([_site(["--rendezvous", rdv_server, "--job-id", jid, "-n", 4,
                                       "--local-n", 2, "--connect-timeout", 3, PY, program],
                                      secret_env)], timeout=40)
    elapsed = time.monotonic() - t0
    assert rc == 124, err
    assert f"job {jid}: ranks 2-3 of 4 did not join within 3 s" in err
    assert elapsed < 20


def test_explicit_ranks_and_a_conflict(rdv_server, secret_env):
    jid = "job-" + secrets.token_hex(4)
    common = ["--rendezvous", rdv_server, "--job-id", jid, "-n", 4, "--connect-timeout", 3]
    sleeper = [PY, "-c", "import time; time.sleep(30)"]
    first = _site(common + ["--ranks", "0-1"] + sleeper, secret_env)
    # the second site comes once the first has claimed its ranks
    with discovery.store_for(jid, bytes.fromhex(secret_env["ERDMA_JOB_SECRET"]),
                             rendezvous=rdv_server, timeout=10) as st:
        deadline = time.monotonic() + 20
        while not st.check(["claim/1"]):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
    [(rc2, _, err2)] = _finish([_site(common + ["--ranks", "1-2"] + sleeper, secret_env)])
    assert rc2 == 2 and "rank 1 of this job is already taken by another site" in err2
    [(rc1, _, err1)] = _finish([first])
    assert rc1 == 124 and "ranks 2-3 of 4 did not join" in err1


def test_a_site_with_another_secret_does_not_join(rdv_server, secret_env):
    jid = "job-" + secrets.token_hex(4)
    common = ["--rendezvous", rdv_server, "--job-id", jid, "-n", 4, "--connect-timeout", 3,
              "--local-n", 2]
    sleeper = [PY, "-c", "import time; time.sleep(30)"]
    wrong = dict(secret_env, ERDMA_JOB_SECRET=secrets.token_hex(32))
    (ra, _, ea), (rb, _, eb) = _finish([_site(common + sleeper, secret_env),
                                        _site(common + sleeper, wrong)])
    # two jobs as far as the store is concerned: neither sees the other's ranks
    assert ra == rb == 124, ea + eb
    assert "ranks 2-3 of 4 did not join" in ea and "ranks 2-3 of 4 did not join" in eb


def test_join_usage_errors(rdv_server, secret_env, tmp_path):
    base = ["--rendezvous", rdv_server, "--job-id", "x", "-n", 2, PY, "-c", "pass"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERDMA_JOB_SECRET")}
    p = subprocess.run(erdmarun_cmd() + [str(a) for a in base], env=rank_env(env) | {
        "ERDMA_JOB_SECRET": ""}, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "needs the job's secret" in p.stderr and "--insecure" in p.stderr
    cases = {
        ("--rendezvous", rdv_server, "-n", 2): "--job-id",
        ("--rendezvous", rdv_server, "--job-id", "x"): "-n N",
        ("--job-id", "x", "-n", 2): "--rendezvous HOST:PORT or --dht",
        ("--rendezvous", rdv_server, "--job-id", "x", "-n", 2, "--ranks", "1-2"): "not a range",
        ("--rendezvous", rdv_server, "--job-id", "x", "-n", 2, "--local-n", 1, "--ranks", "0"):
            "either --local-n or --ranks",
        ("--rendezvous", rdv_server, "--dht", "a:1", "--job-id", "x", "-n", 2): "not both",
        ("--rendezvous", rdv_server, "--job-id", "x", "-n", 2, "--secret-file",
         str(tmp_path / "nope")): "cannot read the job secret file",
    }
    for args, msg in cases.items():
        p = subprocess.run(erdmarun_cmd() + [str(a) for a in args] + [PY, "-c", "pass"],
                           env=rank_env(secret_env), capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
    # a secret file works; --insecure joins without a secret
    f = tmp_path / "job.key"
    f.write_text(secrets.token_hex(16))
    f.chmod(0o600)
    for extra, e in ((["--secret-file", f], env), (["--insecure"], env)):
        p = subprocess.run(erdmarun_cmd() + ["--rendezvous", rdv_server, "--job-id",
                                             "j" + secrets.token_hex(4), "-n", "1"]
                           + [str(a) for a in extra] + [PY, "-c", "print('ran')"],
                           env=rank_env(e) | {"ERDMA_JOB_SECRET": ""}, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 0 and p.stdout.strip() == "ran", p.stderr
    # the rendezvous is unreachable: a clear error, not a hang
    p = subprocess.run(erdmarun_cmd() + ["--rendezvous", "127.0.0.1:1", "--job-id", "x", "-n",
                                         "2", "--connect-timeout", "1", PY, "-c", "pass"],
                       env=rank_env(secret_env), capture_output=True, text=True, timeout=30)
    assert p.returncode == 124 and "cannot reach the rendezvous store" in p.stderr


def _admit_file(tmp_path, secret_env):
    f = tmp_path / "admit.key"
    f.write_text(secret_env["ERDMA_JOB_SECRET"] + "\n")
    f.chmod(0o600)
    return str(f)


def test_standalone_server_command(tmp_path, secret_env):
    # --require-auth without the secrets to admit would let strangers create spaces
    with pytest.raises(AssertionError, match="--require-auth needs --admit-file"):
        _start_server("127.0.0.1:0", "--require-auth")
    p, addr = _start_server("127.0.0.1:0", "--require-auth", "--admit-file",
                            _admit_file(tmp_path, secret_env))
    try:
        host, port = addr.split(":")
        with Store(host, int(port), timeout=5) as raw:
            with pytest.raises(StoreError, match="only serves authenticated jobs"):
                raw.set("k", b"v")
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    for cmd in (erdmarun_cmd() + ["--help"],
                [PY, "-m", "erdmampi.launcher.store_server", "--help"]):
        h = subprocess.run(cmd, env=rank_env(), capture_output=True, text=True, timeout=30)
        assert h.returncode == 0 and "--require-auth" in h.stdout and "--job-ttl" in h.stdout
    assert "any number of jobs" in h.stdout.replace("\n", " ")


def test_the_standalone_server_logs_joins_and_refusals(tmp_path, secret_env, program):
    p, addr = _start_server("127.0.0.1:0", "--require-auth", "--admit-file",
                            _admit_file(tmp_path, secret_env))
    try:
        jid = "job-" + secrets.token_hex(4)
        common = ["--rendezvous", addr, "--job-id", jid, "-n", 2, "--connect-timeout", 20,
                  "--timeout", 60, PY, program]
        [(rc, out, err)] = _finish([_site(common, secret_env)])
        assert rc == 0, err
        stranger = dict(secret_env, ERDMA_JOB_SECRET=secrets.token_hex(32))
        [(rc, out, err)] = _finish([_site(common, stranger)])
        assert rc == 77, err
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        log = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
    assert re.search(r"store: job space \S+ created by 127\.0\.0\.1:\d+", log), log
    assert re.search(r"store: 127\.0\.0\.1:\d+ joined job space", log), log
    assert "refused to admit a new job space from 127.0.0.1" in log, log


def _free_udp_ports(n):
    import socket
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_two_sites_form_one_job_through_the_dht(secret_env, program):
    jid = "job-" + secrets.token_hex(4)
    pa, pb = _free_udp_ports(2)
    common = ["--job-id", jid, "-n", 4, "-l", "--connect-timeout", 20, "--timeout", 60]
    (ra, oa, ea), (rb, ob, eb) = _finish([
        _site(["--dht-listen", f"127.0.0.1:{pa}", "--dht", f"127.0.0.1:{pb}", "--ranks", "0-1"]
              + common + [PY, program], secret_env),
        _site(["--dht-listen", f"127.0.0.1:{pb}", "--dht", f"127.0.0.1:{pa}", "--ranks", "2-3"]
              + common + [PY, program], secret_env)])
    assert ra == 0 and rb == 0, ea + eb
    assert _ranks(oa) == [0, 1] and _ranks(ob) == [2, 3], (oa, ob)


def test_dht_join_needs_explicit_ranks(secret_env):
    [pa] = _free_udp_ports(1)
    p = subprocess.run(erdmarun_cmd() + ["--dht-listen", f"127.0.0.1:{pa}", "--job-id", "x",
                                         "-n", "2", "--local-n", "1", PY, "-c", "pass"],
                       env=rank_env(secret_env), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "needs explicit --ranks" in p.stderr


# -- across network namespaces ---------------------------------------------------------

def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def three_namespaces():
    """'pub' (the rendezvous) and two sites, on one bridge in 'pub'."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = secrets.token_hex(2)
    names = [f"erj6{tag}{s}" for s in ("pub", "a", "b")]
    br = f"erj6br{tag}"
    try:
        for ns in names:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", names[0], "link", "add", br, "type", "bridge")
        _ip("-n", names[0], "link", "set", br, "up")
        for i, ns in enumerate(names, 1):
            host, peer = f"erj6h{tag}{i}", f"erj6p{tag}{i}"
            _ip("link", "add", host, "netns", names[0], "type", "veth", "peer", "name", peer,
                "netns", ns)
            _ip("-n", names[0], "link", "set", host, "master", br, "up")
            _ip("-n", ns, "addr", "add", f"10.66.{int(tag, 16) % 200}.{i}/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
    except (OSError, subprocess.CalledProcessError) as e:
        for ns in names:
            _ip("netns", "del", ns, check=False)
        pytest.skip(f"cannot build network namespaces here: {e}")
    try:
        yield names, [f"10.66.{int(tag, 16) % 200}.{i}" for i in (1, 2, 3)]
    finally:
        for ns in names:
            _ip("netns", "del", ns, check=False)


def test_two_sites_in_namespaces_join_one_job(three_namespaces, secret_env, program, tmp_path):
    (pub, a, b), (ip_pub, ip_a, ip_b) = three_namespaces
    # once the ranks' bootstrap goes through discovery.open_store (sealed, authenticated)
    # the server can refuse unauthenticated clients altogether
    sealed = "open_store" in (REPO / "erdmampi" / "bootstrap.py").read_text()
    server, addr = _start_server(f"{ip_pub}:0", *(["--require-auth", "--admit-file",
                                                   _admit_file(tmp_path, secret_env)]
                                                  if sealed else []),
                                 prefix=["ip", "netns", "exec", pub])
    try:
        assert addr.startswith(ip_pub)
        jid = "job-" + secrets.token_hex(4)
        common = ["--rendezvous", addr, "--job-id", jid, "-n", 4, "--local-n", 2, "-l",
                  "--connect-timeout", 20, "--timeout", 60]
        procs = [_site(common + ["--env", f"ERDMA_HOST=site-{ns}", PY, program], secret_env,
                       prefix=["ip", "netns", "exec", ns]) for ns in (a, b)]
        (ra, oa, ea), (rb, ob, eb) = _finish(procs, timeout=90)
        assert ra == 0 and rb == 0, ea + eb
        assert sorted([_ranks(oa), _ranks(ob)]) == [[0, 1], [2, 3]], (oa, ob)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        finally:
            server.kill()
            server.wait()
            server.stdout.close()
            server.stderr.close()


# -- the ranks' side: discovery.open_store with the environment erdmarun gives --------

EXCHANGE = """\
import os
from erdmampi.discovery import open_store
from erdmampi.jobauth import SealedStore
rank, size = int(os.environ["ERDMA_RANK"]), int(os.environ["ERDMA_SIZE"])
store = open_store(os.environ, timeout=20)
assert isinstance(store, SealedStore)
store.set(f"ep/{rank}", f"endpoint of {rank}".encode())
got = [store.get(f"ep/{r}", 20).decode() for r in range(size)]
assert got == [f"endpoint of {r}" for r in range(size)], got
store.close()
print(f"OK rank={rank} size={size} sum=6", flush=True)
"""


def test_ranks_exchange_sealed_records_at_a_strict_server(secret_env, tmp_path):
    prog = tmp_path / "exchange.py"
    prog.write_text(EXCHANGE)
    server, addr = _start_server("127.0.0.1:0", "--require-auth", "--admit-file",
                                 _admit_file(tmp_path, secret_env))
    try:
        jid = "job-" + secrets.token_hex(4)
        common = ["--rendezvous", addr, "--job-id", jid, "-n", 4, "--local-n", 2, "-l",
                  "--connect-timeout", 20, "--timeout", 60, PY, prog]
        (ra, oa, ea), (rb, ob, eb) = _finish([_site(common, secret_env),
                                              _site(common, secret_env)])
        assert ra == 0 and rb == 0, ea + eb
        assert sorted([_ranks(oa), _ranks(ob)]) == [[0, 1], [2, 3]], (oa, ob)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)
        server.stdout.close()
        server.stderr.close()


def test_ranks_exchange_sealed_records_through_a_dht_bootstrap_node(secret_env, tmp_path):
    prog = tmp_path / "exchange.py"
    prog.write_text(EXCHANGE)
    [port] = _free_udp_ports(1)
    node = subprocess.Popen(erdmarun_cmd() + ["--serve-dht", f"127.0.0.1:{port}"],
                            env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        assert node.stdout.readline().strip() == f"127.0.0.1:{port}"
        jid = "job-" + secrets.token_hex(4)
        common = ["--dht", f"127.0.0.1:{port}", "--dht-listen", "127.0.0.1:0", "--job-id", jid,
                  "-n", 4, "-l", "--connect-timeout", 20, "--timeout", 60]
        (ra, oa, ea), (rb, ob, eb) = _finish([
            _site(common + ["--ranks", "0-1", PY, prog], secret_env),
            _site(common + ["--ranks", "2-3", PY, prog], secret_env)])
        assert ra == 0 and rb == 0, ea + eb
        assert _ranks(oa) == [0, 1] and _ranks(ob) == [2, 3], (oa, ob)
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            assert node.wait(10) == 0
        finally:
            node.kill()
            node.wait()
            node.stdout.close()
            node.stderr.close()


def test_a_missing_program_takes_no_ranks(rdv_server, secret_env):
    jid = "job-" + secrets.token_hex(4)
    base = erdmarun_cmd() + ["--rendezvous", rdv_server, "--job-id", jid, "-n", "1"]
    p = subprocess.run(base + ["no-such-program-erdma"], env=rank_env(secret_env),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 127 and "not found" in p.stderr
    p = subprocess.run(base + [PY, "-c", "import os; print(os.environ['ERDMA_RANK'])"],
                       env=rank_env(secret_env), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "0", p.stderr
