"""Faults that used to hang a job: a local peer that stops (SIGSTOP) or dies
(SIGKILL) mid-collective, on shared memory and over QUIC; receives from
ANY_SOURCE whose possible sender died; shared-memory segments that are not
what a rank of the job would have made; who may read a rank's memory.

Every run is real processes under erdmarun with ERDMA_TIMEOUT (the QUIC
idle timeout, which the shared-memory heartbeat shares) set low, and a
bounded erdmarun --timeout, so a regression fails instead of hanging."""
import errno
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from harness import REPO, run_mpi

TIMEOUT = 3.0   # ERDMA_TIMEOUT of the jobs below

# Survivors ignore erdmarun's SIGTERM (sent when a rank dies) so that they
# live to report; each prints the error class it got and after how long,
# then waits for the other survivors (a file each) before leaving.
_FAULT = r"""
import os, signal, sys, time
import numpy as np
from erdmampi import MPI
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
mode, victim, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pids = comm.allgather(os.getpid())
signal.signal(signal.SIGTERM, signal.SIG_IGN)
a = np.ones(4096)
comm.Allreduce(MPI.IN_PLACE, a)
comm.Barrier()
if comm.rank == victim:
    os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
    time.sleep(600)
t0 = time.monotonic()
try:
    for _ in range(1000):  # each survivor waits on the victim itself first
        comm.Bcast(a, root=victim)
        comm.Allreduce(MPI.IN_PLACE, a)
    print(f"rank {comm.rank}: no error", flush=True)
except MPI.Exception as e:
    same = e.Get_error_class() == MPI.ERR_PROC_FAILED
    print(f"rank {comm.rank}: PROC_FAILED={same} after {time.monotonic() - t0:.2f} s", flush=True)
open(os.path.join(flags, str(comm.rank)), "w").close()
survivors = [r for r in range(comm.size) if r != victim]
end = time.monotonic() + 20
while time.monotonic() < end and not all(
        os.path.exists(os.path.join(flags, str(r))) for r in survivors):
    time.sleep(0.05)
if comm.rank == min(survivors) and mode == "stop":
    os.kill(pids[victim], signal.SIGKILL)
os._exit(0)
"""


def _run_fault(mode, transport, n=3, victim=1):
    env = {"ERDMA_TIMEOUT": str(TIMEOUT), "ERDMA_SHM": "1" if transport == "shm" else "0"}
    with tempfile.TemporaryDirectory() as flags:
        t0 = time.monotonic()
        res = run_mpi(n, _FAULT, args=(mode, victim, flags), timeout=60, env=env,
                      extra=["--kill-grace", "40"])
        wall = time.monotonic() - t0
    out = res.stdout + res.stderr
    got = dict((int(r), (ok, float(t))) for r, ok, t in
               re.findall(r"rank (\d+): PROC_FAILED=(\w+) after ([\d.]+) s", res.stdout))
    survivors = [r for r in range(n) if r != victim]
    assert sorted(got) == survivors, out
    for r, (ok, t) in got.items():
        assert ok == "True", out
        # within the timeout (plus a survivor learning it from another
        # survivor that gave up), never the erdmarun --timeout
        assert t < 2 * TIMEOUT + 3, (r, t, out)
    assert res.returncode == 128 + 9, out   # the victim's SIGKILL, not erdmarun's timeout
    return got, wall


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "quic"])
def test_stopped_peer_fails_survivors(transport):
    # before the heartbeat: over shared memory a SIGSTOPped rank was alive
    # (kill(pid, 0)) forever: the survivors hung until erdmarun's --timeout
    got, _ = _run_fault("stop", transport)
    assert min(t for _, t in got.values()) >= TIMEOUT - 0.5, got  # not before the timeout


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "quic"])
def test_killed_peer_fails_survivors(transport):
    got, _ = _run_fault("kill", transport)
    if transport == "shm":  # an exited local process is seen within a liveness tick
        assert min(t for _, t in got.values()) < 1.5, got


_ANY = r"""
import os, signal, sys, time
import numpy as np
from erdmampi import MPI
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = comm.rank
buf = np.zeros(4, "i")
sub = comm.Split(0 if rank != 1 else 1, rank)   # ranks 0 and 2 only (and 1 alone)
comm.Barrier()
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 0:
    req = comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=7)
    sreq = sub.Irecv(buf, source=MPI.ANY_SOURCE, tag=8)   # 1 is not in sub
    t0 = time.monotonic()
    try:
        comm.Recv(buf, source=MPI.ANY_SOURCE, tag=5)
        print("blocking: no error", flush=True)
    except MPI.Exception as e:
        print(f"blocking: PROC_FAILED={e.Get_error_class() == MPI.ERR_PROC_FAILED} "
              f"after {time.monotonic() - t0:.2f} s", flush=True)
    try:
        comm.recv(source=MPI.ANY_SOURCE, tag=6)
        print("object: no error", flush=True)
    except MPI.Exception as e:
        print(f"object: PROC_FAILED={e.Get_error_class() == MPI.ERR_PROC_FAILED}", flush=True)
    try:
        comm.Probe(source=MPI.ANY_SOURCE, tag=4)
        print("probe: no error", flush=True)
    except MPI.Exception as e:
        print(f"probe: PROC_FAILED={e.Get_error_class() == MPI.ERR_PROC_FAILED}", flush=True)
    for call in ("Test", "Wait"):
        try:
            getattr(req, call)()
            print(f"{call}: no error", flush=True)
        except MPI.Exception as e:
            print(f"{call}: PENDING={e.Get_error_class() == MPI.ERR_PROC_FAILED_PENDING} "
                  f"still={bool(req)}", flush=True)
    print(f"sub Test: {sub.Get_failed().Get_size()} {sreq.Test()}", flush=True)
    failed = comm.Get_failed()
    print(f"failed: {failed.Get_size()} {MPI.Group.Translate_ranks(failed, [0], comm.Get_group())}",
          flush=True)
    print(f"acked: {comm.Ack_failed()} {comm.Ack_failed(0)}", flush=True)
    print(f"after ack Test: {req.Test()}", flush=True)
    comm.Send(np.array([1], "i"), dest=2, tag=9)    # rank 2 may send now
    st = MPI.Status()
    req.Wait(st)
    print(f"pending one matched: {st.Get_source()} {buf[0]}", flush=True)
    comm.Recv(buf, source=MPI.ANY_SOURCE, tag=5)
    print(f"blocking after ack: {buf[0]}", flush=True)
    sub.Send(np.array([0], "i"), dest=1, tag=3)
    sreq.Wait()
    print(f"sub matched: {buf[0]}", flush=True)
    os._exit(0)
if rank == 2:
    comm.Recv(np.zeros(1, "i"), source=0, tag=9)
    comm.Send(np.array([42], "i"), dest=0, tag=7)
    comm.Send(np.array([43], "i"), dest=0, tag=5)
    sub.Recv(np.zeros(1, "i"), source=0, tag=3)
    sub.Send(np.array([44], "i"), dest=0, tag=8)
    os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "quic"])
def test_any_source_receive_when_a_sender_died(transport):
    # before: the blocking ANY_SOURCE receive hung until erdmarun's --timeout
    env = {"ERDMA_TIMEOUT": str(TIMEOUT), "ERDMA_SHM": "1" if transport == "shm" else "0"}
    res = run_mpi(3, _ANY, timeout=60, env=env, extra=["--kill-grace", "40"])
    out = res.stdout + res.stderr
    m = re.search(r"blocking: PROC_FAILED=True after ([\d.]+) s", res.stdout)
    assert m and float(m.group(1)) < TIMEOUT + 3, out
    assert "object: PROC_FAILED=True" in res.stdout, out
    assert "probe: PROC_FAILED=True" in res.stdout, out
    assert "Test: PENDING=True still=True" in res.stdout, out
    assert "Wait: PENDING=True still=True" in res.stdout, out
    assert "sub Test: 0 False" in res.stdout, out       # 1 is no member: no error
    assert "failed: 1 [1]" in res.stdout, out
    assert "acked: 1 1" in res.stdout, out
    assert "after ack Test: False" in res.stdout, out
    assert "pending one matched: 2 42" in res.stdout, out
    assert "blocking after ack: 43" in res.stdout, out
    assert "sub matched: 44" in res.stdout, out


_BUSY = r"""
import time
import numpy as np
from erdmampi import MPI
comm = MPI.COMM_WORLD
a = np.zeros(1, "i")
comm.Barrier()
t0 = time.monotonic()
if comm.rank == 1:
    x = 0
    while time.monotonic() - t0 < 2.5 * float(__import__("os").environ["ERDMA_TIMEOUT"]):
        x += 1                      # pure Python: holds the GIL throughout
    comm.Send(np.array([5], "i"), dest=0)
else:
    comm.Recv(a, source=1)
    print(f"busy peer: got {a[0]} after {time.monotonic() - t0:.1f} s", flush=True)
"""


@pytest.mark.slow
def test_busy_peer_is_not_failed():
    # the heartbeat comes from the progress thread, not from Python: a rank
    # computing for longer than ERDMA_TIMEOUT stays a live peer
    res = run_mpi(2, _BUSY, timeout=60, env={"ERDMA_TIMEOUT": "2", "ERDMA_SHM": "1"})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "busy peer: got 5 after" in res.stdout, out


# ---- a withdrawn CMA send ---------------------------------------------------

# Rank 0 posts a large send (a CMA RTS: rank 1 is to read the buffer in
# place), withdraws it as a failed schedule does, and reuses the buffer; only
# then does rank 1 post the matching receive.
_WITHDRAW = r"""
import numpy as np
from erdmampi import bootstrap, _engine
e = bootstrap.init_world()
n = 4 << 20                     # above ERDMA_SHM_EAGER_LIMIT: an RTS offering a CMA read
go = np.zeros(1, "u1")
if e.rank == 0:
    a = np.full(n, 7, "u1")
    r = e.isend(a.ctypes.data, n, 1, 5, 100)
    r.abort()
    a[:] = 0xEE                 # the application's buffer again
    e.send(go.ctypes.data, 1, 1, 6, 100)
    e.recv(go.ctypes.data, 1, 1, 7, 100)
else:
    e.recv(go.ctypes.data, 1, 0, 6, 100)   # the RTS came before this, on the same ring
    b = np.zeros(n, "u1")
    raw = e.irecv(b.ctypes.data, n, 0, 5, 100).wait(timeout=10)
    print(f"withdrawn: error={raw.error == _engine.ERR_PEER} read={sorted(set(np.unique(b).tolist()))}",
          flush=True)
    e.send(go.ctypes.data, 1, 0, 7, 100)
bootstrap.shutdown_world(2)
"""


@pytest.mark.slow
def test_withdrawn_cma_send_is_not_read():
    # before: rank 1 read the withdrawn buffer (0xEE bytes) and the receive
    # completed as if rank 0 had sent them
    res = run_mpi(2, _WITHDRAW, timeout=40, env={"ERDMA_SHM_CMA": "1"})
    out = res.stdout + res.stderr
    assert "withdrawn: error=True read=[0]" in res.stdout, out


# ---- shared-memory segments -------------------------------------------------

# Rank 1 plays an attacker: instead of joining it plants a segment under its
# name (a valid-looking header, so that only the file's owner, mode or type
# gives it away); rank 0 must refuse it, quickly and clearly.
_PLANT = r"""
import os, struct, sys, time
from erdmampi.discovery import job_id
kind = sys.argv[1]
job = "".join(ch for ch in job_id(os.environ) if ch.isalnum())[:63]
name = f"/dev/shm/erdma-{job}-1"
ring = 65536
size = 128 + 512 * 4 + 2 * (192 + ring)
if os.environ["ERDMA_RANK"] == "1":
    hdr = struct.pack("<QiiiIIIIII", 0x3130736d616d6465, 1, 2, os.getpid(), 0, 0, 0, 0, 0, 0)
    hdr = hdr.ljust(56, b"\0") + struct.pack("<Qi", ring, -1)
    target = name if kind != "symlink" else f"/dev/shm/erdma-target-{job}"
    with open(target + ".tmp", "wb") as f:
        f.write(hdr.ljust(size, b"\0"))
    os.chmod(target + ".tmp", 0o644 if kind == "mode" else 0o600)
    if kind == "owner":
        os.chown(target + ".tmp", 65534, 65534)
    os.rename(target + ".tmp", target)
    if kind == "symlink":
        os.symlink(target, name)
    # and its endpoint record, as a rank on rank 0's host
    import json
    from erdmampi.bootstrap import _host_id
    from erdmampi.discovery import open_store
    store = open_store(os.environ, timeout=20)
    store.set("ep/1", json.dumps({"addr": "127.0.0.1", "port": 9, "fp": "00" * 32,
                                  "host": os.environ.get("ERDMA_HOST") or _host_id()}).encode())
    store.close()
    time.sleep(3)
    for p in (name, target):
        try:
            os.unlink(p)
        except OSError:
            pass
    os._exit(0)
while not os.path.lexists(name):
    time.sleep(0.01)
t0 = time.monotonic()
try:
    from erdmampi import MPI
    MPI.COMM_WORLD.Barrier()
    print("ATTACHED", flush=True)
except Exception as e:
    print(f"REFUSED after {time.monotonic() - t0:.2f} s: {e}", flush=True)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mode", "owner", "symlink"])
def test_foreign_segment_is_refused(kind):
    if kind == "owner" and os.geteuid() != 0:
        pytest.skip("needs root to make a file of another uid")
    res = run_mpi(2, _PLANT, args=(kind,), timeout=40,
                  env={"ERDMA_SHM_RING": "65536", "ERDMA_CONNECT_TIMEOUT": "20",
                       "ERDMA_TIMEOUT": str(TIMEOUT)})
    out = res.stdout + res.stderr
    assert "ATTACHED" not in res.stdout, out
    m = re.search(r"REFUSED after ([\d.]+) s", res.stdout)
    assert m and float(m.group(1)) < 5, out       # at once, not at the connect timeout
    assert "refusing shared-memory segment" in res.stderr, out


# ---- who may read a rank's memory -------------------------------------------

def _yama_scope():
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read())
    except OSError:
        return None


_CMA = r"""
import os, sys, time
import numpy as np
from erdmampi import MPI
comm = MPI.COMM_WORLD
a = np.full(1 << 20, comm.rank + 1, "u1")
b = np.zeros_like(a)
comm.Sendrecv(a, dest=1 - comm.rank, recvbuf=b, source=1 - comm.rank)
assert b[0] == 2 - comm.rank
if comm.rank == 0:
    print(f"PID {os.getpid()} ADDR {a.ctypes.data}", flush=True)
    time.sleep(4)
comm.Barrier()
"""


@pytest.mark.slow
def test_rank_memory_is_not_readable_by_strangers():
    """Under Yama's ptrace_scope 1 a rank lets its launcher and the
    launcher's descendants (its local peers) read it, not any process of
    the user: before, PR_SET_PTRACER_ANY let any of them read and write."""
    if _yama_scope() != 1:
        pytest.skip("needs Yama with kernel.yama.ptrace_scope = 1")
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r})\n"
         "from harness import run_mpi\n"
         f"r = run_mpi(2, {_CMA!r}, timeout=40)\n"
         "print(r.stdout); print(r.stderr, file=sys.stderr); sys.exit(r.returncode)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    while "PID" not in line:
        line = proc.stdout.readline()
        if not line:
            break
    pid, addr = map(int, re.findall(r"\d+", line)[:2]) if "PID" in line else (0, 0)
    got = -1
    if pid:  # a stranger: this test process is no descendant of the job's launcher
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)

        class IOV(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(16)
        local, remote = IOV(ctypes.addressof(buf), 16), IOV(addr, 16)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        got = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        err = ctypes.get_errno()
    rest, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0, line + rest + errs  # the ranks' own CMA reads worked
    assert pid, line + rest + errs
    assert got < 0 and err == errno.EPERM, "a stranger read a rank's memory"
