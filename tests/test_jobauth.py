"""Job secret, derived keys, sealed records, and the store's per-job authenticated spaces."""
import json
import logging
import subprocess
import sys

import pytest

from harness import run_mpi

from erdmampi import jobauth
from erdmampi.jobauth import JobKeys, RecordAuthError, SealedStore
from erdmampi.launcher import spawn
from erdmampi.launcher.store_server import StoreServer
from erdmampi.rendezvous import Store, StoreError

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))
RECORD = json.dumps({"addr": "10.1.2.3", "port": 4242, "fp": "ab" * 32}).encode()


@pytest.fixture
def server():
    with StoreServer("127.0.0.1", 0) as s:
        yield s


def job_store(server, secret=SECRET, jobid="job1", timeout=5.0):
    keys = JobKeys(secret, jobid)
    return SealedStore(Store("127.0.0.1", server.port, timeout=timeout,
                             auth=keys.store_auth()), keys)


def refusals(caplog):
    return [r for r in caplog.records
            if r.name == "erdmampi.discovery" and "refused rendezvous record" in r.getMessage()]


# -- the secret ------------------------------------------------------------------------

def test_secret_parsing_and_sources(tmp_path):
    s = jobauth.generate_secret()
    assert len(bytes.fromhex(s)) == 32 and s != jobauth.generate_secret()
    assert jobauth.parse_secret(" " + s[:32] + "\n" + s[32:]) == bytes.fromhex(s)
    with pytest.raises(ValueError, match="at least 128"):
        jobauth.parse_secret("ab" * 15)
    with pytest.raises(ValueError, match="hex"):
        jobauth.parse_secret("not a secret at all, not hex")
    f = tmp_path / "job.key"
    f.write_text(s + "\n")
    f.chmod(0o600)
    assert jobauth.load_secret({"ERDMA_JOB_SECRET_FILE": str(f)}) == bytes.fromhex(s)
    # the variable wins over the file; neither -> None
    assert jobauth.load_secret({"ERDMA_JOB_SECRET": "cd" * 16,
                                "ERDMA_JOB_SECRET_FILE": str(f)}) == b"\xcd" * 16
    assert jobauth.load_secret({}) is None
    with pytest.raises(ValueError, match="cannot read"):
        jobauth.load_secret({"ERDMA_JOB_SECRET_FILE": str(tmp_path / "missing")})
    out = subprocess.run([sys.executable, "-m", "erdmampi.jobauth"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert len(jobauth.parse_secret(out)) == 32


def test_derived_keys_depend_on_secret_and_job():
    a, a2 = JobKeys(SECRET, "job1"), JobKeys(SECRET.hex(), "job1")
    assert a.opaque("ep/0") == a2.opaque("ep/0") and a.namespace == a2.namespace
    assert a.public_key == a2.public_key
    names = {JobKeys(SECRET, "job2").opaque("ep/0"), JobKeys(OTHER, "job1").opaque("ep/0"),
             a.opaque("ep/1"), a.opaque("ep/0")}
    assert len(names) == 4
    # opaque names say nothing about the job or the key
    assert b"job1" not in a.opaque("ep/0") and b"ep" not in a.opaque("ep/0")
    assert len(a.opaque("ep/0")) == 64 and b"job1" not in a.namespace
    assert JobKeys(SECRET, "job2").namespace != a.namespace != JobKeys(OTHER, "job1").namespace
    with pytest.raises(ValueError):
        JobKeys(b"short", "job1")


def test_seal_open_and_binding(caplog):
    k = JobKeys(SECRET, "job1")
    sealed = k.seal("ep/0", RECORD)
    assert RECORD not in sealed and b"10.1.2.3" not in sealed
    assert k.open("ep/0", sealed) == RECORD
    assert k.seal("ep/0", RECORD) != sealed                    # fresh nonce each time
    assert k.open_opaque(k.opaque("ep/0"), sealed) == RECORD
    caplog.set_level(logging.WARNING, logger="erdmampi.discovery")
    bad = {
        "replayed under another key": (k, "ep/1", sealed),
        "another job's": (JobKeys(SECRET, "job2"), "ep/0", sealed),
        "another secret's": (JobKeys(OTHER, "job1"), "ep/0", sealed),
        "tampered": (k, "ep/0", sealed[:-1] + bytes([sealed[-1] ^ 1])),
        "plain json": (k, "ep/0", RECORD),
        "truncated": (k, "ep/0", sealed[:10]),
    }
    for what, (keys, key, value) in bad.items():
        caplog.clear()
        with pytest.raises(RecordAuthError, match="refused"):
            keys.open(key, value)
        logged = refusals(caplog)
        assert len(logged) == 1 and key in logged[0].getMessage(), what


# -- the store: authenticated spaces -----------------------------------------------------

def test_sealed_store_roundtrip_hides_names_and_values(server):
    with job_store(server) as st:
        st.set("ep/0", RECORD)
        assert st.get("ep/0", 1) == RECORD
        assert st.add("next-rank", 2) == 2 and st.add("next-rank", 2) == 4
        assert st.check(["ep/0"]) and not st.check(["ep/1"])
        with pytest.raises(TimeoutError, match="'ep/1' of job 'job1'"):
            st.get("ep/1", 0.2)
    ns = JobKeys(SECRET, "job1").namespace
    assert server.jobs() == [ns] and server.keys() == []       # nothing in the open space
    raw = server._spaces[ns]["data"]
    blob = b"".join(list(raw) + list(raw.values()))
    for plain in (b"ep/", b"job1", b"10.1.2.3", b"4242", b"next-rank"):
        assert plain not in blob


def test_stranger_cannot_write_or_read_a_job(server, caplog):
    caplog.set_level(logging.WARNING, logger="erdmampi.discovery")
    with job_store(server) as st:
        st.set("ep/0", RECORD)
        keys = JobKeys(SECRET, "job1")
        # a stranger claiming the job's space with a key of its own is refused, and logged
        evil = JobKeys(OTHER, "job1")
        auth = evil.store_auth()
        auth.namespace = keys.namespace
        with pytest.raises(StoreError, match="job authentication refused.*secret"):
            Store("127.0.0.1", server.port, timeout=2, auth=auth)
        assert any("refused job authentication" in r.getMessage() for r in caplog.records)
        # replaying the job's public key without its private key: refused too
        auth.public_key = keys.public_key
        with pytest.raises(StoreError, match="job authentication refused"):
            Store("127.0.0.1", server.port, timeout=2, auth=auth)
        # without authenticating, a stranger only reaches the open space
        with Store("127.0.0.1", server.port, timeout=2) as raw:
            name = keys.opaque("ep/0")
            raw.set(name, b'{"addr": "6.6.6.6"}')
            assert raw.get(name, 0) == b'{"addr": "6.6.6.6"}'
        assert st.get("ep/0", 1) == RECORD                     # the job's record is untouched
        # with the wrong secret one gets a space of one's own, empty
        with job_store(server, secret=OTHER) as other:
            assert not other.check(["ep/0"])
            with pytest.raises(TimeoutError):
                other.get("ep/0", 0.2)


def test_forged_records_are_refused_and_logged(server, caplog):
    caplog.set_level(logging.WARNING, logger="erdmampi.discovery")
    keys = JobKeys(SECRET, "job1")
    name = keys.opaque("ep/1")
    # 1. a server that does not authenticate jobs (here: the open space, raw protocol):
    #    the forger writes plain JSON under the right name; the record layer refuses it
    with Store("127.0.0.1", server.port, timeout=2) as raw:
        raw.set(name, b'{"addr": "6.6.6.6", "port": 1, "fp": "00"}')
        st = SealedStore(Store("127.0.0.1", server.port, timeout=2), keys)
        with pytest.raises(RecordAuthError, match="ep/1"):
            st.get("ep/1", 1)
        assert len(refusals(caplog)) == 1 and "ep/1" in refusals(caplog)[0].getMessage()
        # 2. a record sealed with another job's secret, under the right name
        caplog.clear()
        raw.set(name, JobKeys(OTHER, "job1").seal("ep/1", RECORD))
        with pytest.raises(RecordAuthError):
            st.get("ep/1", 1)
        assert len(refusals(caplog)) == 1
        st.close()
    # 3. written straight into the job's own space on the server (a compromised server)
    with job_store(server) as st:
        st.set("ep/0", RECORD)
        caplog.clear()
        server.inject(keys.namespace, name, keys.seal("ep/0", RECORD))   # replayed record
        with pytest.raises(RecordAuthError):
            st.get("ep/1", 1)
        assert len(refusals(caplog)) == 1


def test_require_auth_and_many_jobs_on_one_server():
    with StoreServer("127.0.0.1", 0, require_auth=True, admit=[SECRET]) as server:
        with Store("127.0.0.1", server.port, timeout=2) as raw:
            raw.ping()
            with pytest.raises(StoreError, match="only serves authenticated jobs"):
                raw.set("a", b"1")
        stores = [job_store(server, jobid=f"job{i}") for i in range(5)]
        for i, st in enumerate(stores):
            st.set("ep/0", f"value {i}")
        for i, st in enumerate(stores):
            assert st.get("ep/0", 1) == f"value {i}".encode()
            st.close()
        assert len(server.jobs()) == 5


def test_job_ttl_drops_idle_jobs():
    with StoreServer("127.0.0.1", 0, job_ttl=0.0) as server:
        with job_store(server, jobid="old") as st:
            st.set("k", b"v")
        assert len(server.jobs()) == 1
        with job_store(server, jobid="new") as st:       # registering sweeps idle jobs
            st.set("k", b"v")
        assert server.jobs() == [JobKeys(SECRET, "new").namespace]


# -- erdmarun hands the secret to its ranks ------------------------------------------------

def test_local_ranks_share_a_fresh_secret():
    seen = []
    for _ in range(2):
        p = run_mpi(2, "import os; print('S', os.environ['ERDMA_JOB_SECRET'])", timeout=30)
        assert p.returncode == 0, p.stderr
        got = {line.split()[1] for line in p.stdout.splitlines() if line.startswith("S ")}
        assert len(got) == 1
        seen.append(got.pop())
        assert len(jobauth.parse_secret(seen[-1])) == 32
    assert seen[0] != seen[1]


def test_remote_script_reads_the_secret_from_stdin(monkeypatch):
    secret = jobauth.generate_secret()
    script = spawn.remote_command("/", {"ERDMA_RANK": "0"},
                                  [sys.executable, "-c",
                                   "import os; print(os.environ['ERDMA_JOB_SECRET'])"],
                                  secret_on_stdin=True)
    assert secret not in script
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        p.stdin.write(secret + "\n")       # as erdmarun does; stdin stays open (the ssh channel)
        p.stdin.flush()
        assert p.stdout.readline().strip() == secret
        assert p.wait(20) == 0
    finally:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()
    # a job's remote environment never carries the secret (it would be on the ssh command line)
    monkeypatch.setenv("ERDMA_JOB_SECRET", secret)
    env = spawn.Job(["true"], 1)._remote_env({"ERDMA_RANK": "0"})
    assert "ERDMA_JOB_SECRET" not in env and env["ERDMA_RANK"] == "0"


def test_remote_ranks_get_the_secret_off_every_command_line(tmp_path, monkeypatch):
    """erdmarun -H (a fake ssh that runs the remote script here): the remote rank has the
    job secret, and no process's command line carries it."""
    fake = tmp_path / "fakessh"
    fake.write_text('#!/bin/sh\nhost="$1"; shift\nexec env -i HOME="$HOME" PATH="$PATH" '
                    'sh -c "$*"\n')
    fake.chmod(0o755)
    secret = jobauth.generate_secret()
    script = tmp_path / "rank.py"
    script.write_text(
        "import os\n"
        "s = os.environ['ERDMA_JOB_SECRET']\n"
        "leaks = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        with open(f'/proc/{pid}/cmdline', 'rb') as f:\n"
        "            if s.encode() in f.read():\n"
        "                leaks.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('SECRET', s, 'LEAKS', leaks, flush=True)\n")
    monkeypatch.setenv("ERDMA_JOB_SECRET", secret)     # as if the user had set one: not sent
    p = run_mpi(2, script, extra=["-H", "remotehostA:2", "--launcher-cmd", str(fake)],
                timeout=30)
    assert p.returncode == 0, p.stderr
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("SECRET")]
    assert len(lines) == 2
    assert {ln[1] for ln in lines} == {lines[0][1]} and len(lines[0][1]) == 64
    assert all(ln[3:] == ["[]"] for ln in lines), lines
