"""Small two-rank Bcasts and Allgathers of one host by flags in shared
memory (erdma_pair_put / _share / _take in erdma_shm.c): their semantics on
every path (tests/scripts/pair_collectives.py, also against mpi4py), a root
that dies or stops while the other waits for its bytes, a signal during a
Bcast's or an Allgather's wait, a Bcast whose sizes differ between the
ranks, and a local peer that lies in the records of the CMA copies."""
import re

import pytest

from _ranks import PAIR_JOB, assert_ok, assert_reference, run_script
from harness import run_mpi

SCRIPT = "pair_collectives.py"


@pytest.mark.parametrize("nprocs", [2, 3])
def test_semantics_by_flags_and_messages(nprocs):
    assert_ok(run_script(SCRIPT, nprocs), SCRIPT, nprocs)


def test_semantics_hold_for_mpi4py():
    assert_reference(SCRIPT, 2)


TIMEOUT = 3.0   # ERDMA_TIMEOUT of the jobs below

# rank 1 waits in a Bcast by flags whose root (rank 0) is killed or stopped
# (mode), or rings itself an alarm 0.3 s in (mode "signal"; "signal-alias":
# in a second object's first call, which takes the Python-resolved path;
# "signal-allgather", "signal-alltoall": in an Allgather or Alltoall;
# "signal-alltoall-python": the Alltoall of the Python algorithms, whose
# waits run in a callback of the engine's protocol), the root being late;
# then both check that they still agree
_WAITER = PAIR_JOB + r"""
buf = np.zeros(4, np.int32)
class Alarm(Exception):
    pass
def ring(*_):
    raise Alarm()
if mode.startswith("signal"):
    if comm.rank == 1:
        if mode == "signal-alltoall-python":
            os.environ["ERDMA_COLL_ALLTOALL"] = "pairwise"
        signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        try:
            if mode == "signal-allgather":
                comm.Allgather(np.array([1, 1], np.int32), buf)
            elif mode.startswith("signal-alltoall"):
                comm.Alltoall(np.array([1, 1, 1, 1], np.int32), buf)
            else:
                (MPI.Intracomm(comm) if mode == "signal-alias" else comm).Bcast(buf, root=0)
            print("rank 1: no signal", flush=True)
        except Alarm:
            print(f"rank 1: interrupted after {time.monotonic() - t0:.2f} s", flush=True)
        if mode == "signal-allgather":
            comm.Allgather(np.array([7, 7], np.int32), buf)     # called again
        elif mode.startswith("signal-alltoall"):
            comm.Alltoall(np.full(4, 7, np.int32), buf)
        else:
            comm.Bcast(buf, root=0)     # the root's bytes, taken now
    else:
        time.sleep(2.0)
        if mode == "signal-allgather":
            comm.Allgather(np.array([7, 7], np.int32), buf)
        elif mode.startswith("signal-alltoall"):
            comm.Alltoall(np.full(4, 7, np.int32), buf)
        else:
            buf[:] = 7
            comm.Bcast(buf, root=0)
    print(f"rank {comm.rank}: got={buf.tolist()}", flush=True)
    for i in range(50):                 # the two still count alike
        v = np.full(3, i if comm.rank == i % 2 else -1, np.int64)
        comm.Bcast(v, root=i % 2)
        if (v != i).any():
            print(f"rank {comm.rank}: round {i} wrong", flush=True)
        comm.Barrier()
    print(f"rank {comm.rank}: done", flush=True)
    sys.exit(0)
if comm.rank == 0:
    os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
    time.sleep(600)
t0 = time.monotonic()
try:
    comm.Bcast(buf, root=0)
    print("rank 1: no error", flush=True)
except MPI.Exception as e:
    same = e.Get_error_class() == MPI.ERR_PROC_FAILED
    print(f"rank 1: PROC_FAILED={same} after {time.monotonic() - t0:.2f} s", flush=True)
os.kill(pids[0], signal.SIGKILL)    # (a stopped one too)
os._exit(0)
"""


@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_dead_or_stopped_root_fails_a_bcast_by_flags(mode):
    res = run_mpi(2, _WAITER, args=(mode,), timeout=60,
                  env={"ERDMA_TIMEOUT": str(TIMEOUT), "ERDMA_SHM": "1"},
                  extra=["--kill-grace", "40"])
    out = res.stdout + res.stderr
    assert "rank 0: flags=True" in out and "rank 1: flags=True" in out, out
    m = re.search(r"rank 1: PROC_FAILED=(\w+) after ([\d.]+) s", res.stdout)
    assert m and m.group(1) == "True", out
    took = float(m.group(2))
    if mode == "kill":
        assert took < 1.5, out
    else:
        assert TIMEOUT - 0.5 <= took < 2 * TIMEOUT + 3, out


@pytest.mark.parametrize("mode", ["signal", "signal-alias", "signal-allgather",
                                  "signal-alltoall", "signal-alltoall-python"])
def test_a_signal_interrupts_a_bcast_by_flags(mode):
    # the interrupted Bcast leaves no trace: called again, it takes the
    # root's bytes (as a withdrawn receive posted again)
    res = run_mpi(2, _WAITER, args=(mode,), timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "rank 0: flags=True" in out and "rank 1: flags=True" in out, out
    m = re.search(r"rank 1: interrupted after ([\d.]+) s", out)
    assert m and float(m.group(1)) < 1.5, out     # within the 0.5 s wait slice
    assert "rank 0: got=[7, 7, 7, 7]" in out and "rank 1: got=[7, 7, 7, 7]" in out, out
    assert "wrong" not in out, out
    assert "rank 0: done" in out and "rank 1: done" in out, out


# Bcast sizes that differ between the ranks (an erroneous program): the
# receiver of 16 bytes by flags gets ERR_TRUNCATE, not stale bytes, where
# the root sent 24 (both in the slot's lines), 6000 where it sent 8000 (both
# in its areas), 80 where it sent 200 and 200 where it sent 80 (one in
# each); the two then go on alike
_MISMATCH = r"""
import sys
import numpy as np
from erdmampi import MPI
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
for _ in range(3):
    comm.Barrier()
sent, expected = int(sys.argv[1]), int(sys.argv[2])
buf = np.arange(sent if comm.rank == 0 else expected, dtype=np.int32)
try:
    comm.Bcast(buf, root=0)
    print(f"rank {comm.rank}: ok", flush=True)
except MPI.Exception as e:
    print(f"rank {comm.rank}: class={e.Get_error_class() == MPI.ERR_TRUNCATE}", flush=True)
v = np.full(2, 5 if comm.rank == 1 else 0, np.int64)
comm.Bcast(v, root=1)
comm.Barrier()
print(f"rank {comm.rank}: after={v.tolist()}", flush=True)
"""


# the same on a slot another communicator used before: its areas still
# hold the old communicator's words for the same operation numbers
_REUSED = r"""
import numpy as np
from erdmampi import MPI
from erdmampi._commrt import _rt
from erdmampi._engine import lib
def slot(c):
    return lib.erdma_pair_find(_rt.engine._h, c._ranks[1 - c.rank], c._ctx + 1)
old = MPI.COMM_WORLD.Dup()
for _ in range(3):
    old.Barrier()
was = slot(old)
buf = np.full(2000, 7, np.int32)
old.Bcast(buf, root=0)          # operation 1 of the slot, in an area
old.Barrier()
old.Free()
new = MPI.COMM_WORLD.Dup()
new.Set_errhandler(MPI.ERRORS_RETURN)
for _ in range(3):
    new.Barrier()
print(f"rank {new.rank}: same slot={slot(new) == was >= 0}", flush=True)
# operation 1 again: the root sends 24 bytes (its lines), rank 1 expects 8000
buf = np.arange(6 if new.rank == 0 else 2000, dtype=np.int32)
try:
    new.Bcast(buf, root=0)
    print(f"rank {new.rank}: ok stale={bool((buf == 7).all())}", flush=True)
except MPI.Exception as e:
    print(f"rank {new.rank}: class={e.Get_error_class() == MPI.ERR_TRUNCATE}", flush=True)
new.Barrier()
"""


def test_a_reused_slot_gives_an_error_not_the_old_communicators_bytes():
    res = run_mpi(2, _REUSED, timeout=60)
    out = res.stdout + res.stderr
    assert "rank 0: same slot=True" in out and "rank 1: same slot=True" in out, out
    assert "rank 0: ok" in out and "rank 1: class=True" in out, out


@pytest.mark.parametrize("sent,expected", [(6, 4), (2000, 1500), (50, 20), (20, 50)])
def test_bcast_sizes_that_differ_give_an_error_not_stale_bytes(sent, expected):
    res = run_mpi(2, _MISMATCH, args=[str(sent), str(expected)], timeout=60)
    out = res.stdout + res.stderr
    assert "rank 0: ok" in out and "rank 1: class=True" in out, out
    assert "rank 0: after=[5, 5]" in out and "rank 1: after=[5, 5]" in out, out


# In the Python algorithms' two-rank Bcast and Allgather by flags
# (Engine.pair_bcast / pair_allgather, erdma_pair_bcast / _exchange through
# _pair_run), a signal's handler runs only in a wait slice: one that raises
# in the receiver's wait (its expect counted), or in either of the
# Allgather's waits (before its share, after it), ends the call with that
# exception and what was counted withdrawn.  Rank 1 has `lib` wrapped so that
# the named wait raises once it returned; the call made again gets the
# peer's bytes, then the two ranks still agree for 40 rounds of both.
_INTERRUPTED = PAIR_JOB + r"""
import erdmampi._engine as eng
real, E, ctx = eng.lib, _rt.engine, comm._ctx + 1
class Hit(Exception):
    pass
class Raising:
    def __init__(self, after, skip):
        self.after, self.skip = after, skip     # (skip: calls of it let through first)
    def __getattr__(self, name):
        f = getattr(real, name)
        if name != self.after:
            return f
        def g(*a):
            r = f(*a)
            self.skip -= 1
            if self.skip == -1:
                raise Hit(name)
            return r
        return g
def interrupted(after, call, skip=0):
    eng.lib = Raising(after, skip)
    try:
        call()
        return False
    except Hit:
        return True
    finally:
        eng.lib = real
bad = []
for k in range(2):
    buf = np.full(4, 100 + k if comm.rank == 0 else 0, np.int32)
    if comm.rank == 0:
        time.sleep(0.05)
        comm.Bcast(buf, root=0)
    else:
        once = lambda: E.pair_bcast(0, ctx, buf.ctypes.data, buf.nbytes, False)
        if not interrupted("erdma_pair_wait", once):
            bad.append(f"bcast {k}: no raise")
        once()
        if (buf != 100 + k).any():
            bad.append(f"bcast {k}: {buf.tolist()}")
for k, skip in enumerate((0, 1, 0, 1)):      # the wait before the share, the one after it
    mine = np.full(2, 10 * k + comm.rank, np.int32)
    out = np.zeros(4, np.int32)
    if comm.rank == 0:
        time.sleep(0.05)
        comm.Allgather(mine, out)
    else:
        once = lambda: E.pair_allgather(0, ctx, mine.ctypes.data, out.ctypes.data, 8, 1)
        if not interrupted("erdma_pair_wait", once, skip=skip):
            bad.append(f"allgather {k}: no raise")
        once()
    if out.tolist() != [10 * k] * 2 + [10 * k + 1] * 2:
        bad.append(f"allgather {k}: {out.tolist()}")
for i in range(40):
    v = np.full(3, i if comm.rank == i % 2 else -1, np.int64)
    try:
        comm.Bcast(v, root=i % 2)
        g = np.zeros(2, np.int64)
        comm.Allgather(np.array([i * 2 + comm.rank]), g)
    except MPI.Exception as e:
        bad.append(f"round {i}: {e}")
        break
    if (v != i).any() or g.tolist() != [2 * i, 2 * i + 1]:
        bad.append(f"round {i}: {v.tolist()} {g.tolist()}")
print(f"rank {comm.rank}: bad={bad}", flush=True)
"""


def test_a_handler_raising_in_a_wait_of_a_bcast_or_allgather_leaves_the_counts_in_step():
    res = run_mpi(2, _INTERRUPTED, args=("-",), timeout=60, env={"ERDMA_TIMEOUT": str(TIMEOUT)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "rank 0: flags=True" in out and "rank 1: flags=True" in out, out
    assert "rank 0: bad=[]" in out and "rank 1: bad=[]" in out, out


# A two-rank Alltoall of blocks from 8 KiB to 2 MiB trades the blocks'
# addresses by flags and reads them with CMA (erdma_pair_rec), a Bcast
# above 8 KiB the buffers' addresses, and the root writes the second part
# while the receiver reads the first (erdma_pair_write); where a copy is
# refused (rank 1 not dumpable, the job without CAP_SYS_PTRACE) both ranks
# move the bytes by flags instead, 8 KiB at a time, every path (C, the
# Python algorithm on rank 0, in place, both roots) exact; sizes that
# differ between the ranks give ERR_TRUNCATE on both, the pair in step.
_A2A_CMA = r"""
import ctypes, os, sys
if sys.argv[1] == "refuse" and os.environ.get("ERDMA_RANK") == "1":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)          # PR_SET_DUMPABLE 0: CMA gets EPERM
import numpy as np
from erdmampi import MPI
c = MPI.COMM_WORLD
me = c.rank
for _ in range(3):
    c.Barrier()
for blk in (8193, 65536, 300001, (2 << 20) - 1):
    for i in range(6):
        if i == 4 and me == 0:
            os.environ["ERDMA_COLL_ALLTOALL"] = "pairwise"   # the Python path on rank 0
        s = np.concatenate([np.full(blk, 16 * me + r + i, np.uint8) for r in range(2)])
        want = np.concatenate([np.full(blk, 16 * r + me + i, np.uint8) for r in range(2)])
        if i % 2:
            c.Alltoall(MPI.IN_PLACE, s)
            r = s
        else:
            r = np.zeros(2 * blk, np.uint8)
            c.Alltoall(s, r)
        assert np.array_equal(r, want), (blk, i)
        os.environ.pop("ERDMA_COLL_ALLTOALL", None)
for nbytes in (8193, 100000, 3000001, (4 << 20) + 5):
    for i in range(4):
        root = i % 2
        if i == 2 and me == 0:
            os.environ["ERDMA_COLL_BCAST"] = "binomial"       # the Python path on rank 0
        want = np.full(nbytes, 7 * root + i + 1, np.uint8)
        want[::4099] = i
        b = want.copy() if me == root else np.zeros(nbytes, np.uint8)
        c.Bcast(b, root=root)
        assert np.array_equal(b, want), ("Bcast", nbytes, i)
        os.environ.pop("ERDMA_COLL_BCAST", None)
c.Set_errhandler(MPI.ERRORS_RETURN)
try:
    c.Bcast(np.zeros(100000 if me == 0 else 90000, np.uint8), root=0)
    print(f"rank {me}: bcast no error", flush=True)
except MPI.Exception as e:
    print(f"rank {me}: bcast truncate={e.Get_error_class() == MPI.ERR_TRUNCATE}", flush=True)
blk = 100000 if me == 0 else 90000
try:
    c.Alltoall(np.zeros(2 * blk, np.uint8), np.zeros(2 * blk, np.uint8))
    print(f"rank {me}: no error", flush=True)
except MPI.Exception as e:
    print(f"rank {me}: truncate={e.Get_error_class() == MPI.ERR_TRUNCATE}", flush=True)
r = np.zeros(2 * 70000, np.uint8)
c.Alltoall(np.full(2 * 70000, me + 1, np.uint8), r)
assert (r[:70000] == 1).all() and (r[70000:] == 2).all(), "after the mismatch"
print(f"rank {me}: OK", flush=True)
"""


@pytest.mark.parametrize("mode", ["plain", "refuse"])
def test_large_two_rank_alltoall_and_bcast_by_cma_or_flags(mode, monkeypatch):
    import shutil
    import harness
    if mode == "refuse":
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux)")
        orig = harness.erdmarun_cmd
        monkeypatch.setattr(harness, "erdmarun_cmd", lambda: [
            "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"] + orig())
    res = run_mpi(2, _A2A_CMA, args=[mode], timeout=120, env={"ERDMA_VERBOSE": "1"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    for i in range(2):
        assert f"rank {i}: truncate=True" in out and f"rank {i}: OK" in out, out[-3000:]
        assert f"rank {i}: bcast truncate=True" in out, out[-3000:]
    assert ("refused" in res.stderr) == (mode == "refuse"), res.stderr[-2000:]


# Rank 1 lies in the records of the two-rank CMA protocols: it speaks them
# itself, by flags (the engine's erdma_pair_* calls, as erdma_coll.c's
# erdma_pair_exchange), publishing an address of nothing, of the kernel, one
# whose range wraps, one page followed by unreadable ones, or an address in
# rank 0's memory (rank 0 sends it: a check that rank 0's copy cannot reach
# itself); and, first, its segment's pid rewritten to rank 0's, so that a
# rank reading that pid at copy time would copy into itself.  It always
# claims its own copy worked.  Rank 0 (the engine's protocol) must get every
# byte right by the flags fallback, never crash, and find its sentinel
# untouched.
_LIAR = r"""
import ctypes, os, re
import numpy as np
from erdmampi import MPI
from erdmampi._engine import ERR_TIMEOUT, ffi, lib
from erdmampi.bootstrap import init_world
c = MPI.COMM_WORLD
me = c.rank
for _ in range(3):
    c.Barrier()                                     # (the pair is agreed by then)
sentinel = np.full(1 << 20, 0x5A, np.uint8)
there = c.sendrecv((os.getpid(), sentinel.ctypes.data), dest=1 - me, source=1 - me)
told = 0
if me == 1:
    rewrote = 0
    for line in open("/proc/self/maps"):
        m = re.match(r"([0-9a-f]+)-[0-9a-f]+ rw-s 00000000 \S+ \d+ +/dev/shm/erdma-", line)
        if m and ctypes.c_int32.from_address(int(m.group(1), 16) + 8).value == 1:
            ctypes.c_int32.from_address(int(m.group(1), 16) + 16).value = there[0]
            rewrote += 1
    assert rewrote == 1, rewrote
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    # one page then 4 MiB that neither copy can reach (PROT_NONE): what the
    # copies can touch of the liar is its own business, not this test's
    page = libc.mmap(None, 4096 + (4 << 20), 3, 0x22, -1, 0)   # RW, PRIVATE|ANONYMOUS
    assert libc.mprotect(ctypes.c_void_p(page + 4096), 4 << 20, 0) == 0
    lies = [0, 8, 0xFFFFFFFFFF600000, (1 << 64) - 4096, page, there[1]]
    h = init_world()._h
    slot = lib.erdma_pair_find(h, 0, c._ctx + 1)
    assert slot >= 0, "no pair agreed"
    def wait():
        while (rc := lib.erdma_pair_wait(h, slot, 0.5)) == ERR_TIMEOUT:
            pass
        assert rc == 0, rc
    def exchange(out, into, n):
        lib.erdma_pair_lead(h, slot, 0)
        wait()
        assert lib.erdma_pair_share(h, slot, out, n) == 0
        wait()
        assert lib.erdma_pair_take(h, slot, into, n) == 0
    def records(addr, n):
        global told
        theirs = ffi.new("erdma_pair_rec *")
        exchange(ffi.new("erdma_pair_rec *", {"addr": addr, "len": n, "cma": 1}), theirs,
                 ffi.sizeof("erdma_pair_rec"))
        told += 1
        assert theirs.len == n
        done, peer_done = ffi.new("uint64_t *", 1), ffi.new("uint64_t *")
        exchange(done, peer_done, 8)                # "my copy worked"
        return peer_done[0]
    def pieces(out, into, n):
        for off in range(0, n, 8192):
            exchange(out + off, into + off, min(8192, n - off))
    def alltoall(s, r, blk, addr):                  # this rank's index is 1
        r[blk:] = s[blk:]
        sp, rp = ffi.cast("char *", s.ctypes.data), ffi.cast("char *", r.ctypes.data)
        if not records(addr, blk):
            pieces(sp, rp, blk)
    def bcast(b, root, addr):
        bp, scratch = ffi.cast("char *", b.ctypes.data), ffi.new("char[]", 8192)
        if not records(addr, b.nbytes):
            for off in range(0, b.nbytes, 8192):
                k = min(8192, b.nbytes - off)
                exchange(bp + off, scratch if root == 1 else bp + off, k)
else:
    lies = [None] * 6
c.Barrier()
for i, addr in enumerate(lies):
    for blk in (65536, 300001):
        s = np.concatenate([np.full(blk, 16 * me + r + i, np.uint8) for r in range(2)])
        r = np.zeros(2 * blk, np.uint8)
        if me == 1:
            alltoall(s, r, blk, addr)
        else:
            c.Alltoall(s, r)
            want = np.concatenate([np.full(blk, 16 * r + me + i, np.uint8) for r in range(2)])
            assert np.array_equal(r, want), ("Alltoall", i, blk)
    for root in (0, 1):
        want = np.full(1 << 20, 3 + i + root, np.uint8)
        b = want.copy() if me == root else np.zeros(1 << 20, np.uint8)
        if me == 1:
            bcast(b, root, addr)
        else:
            c.Bcast(b, root=root)
            assert np.array_equal(b, want), ("Bcast", i, root)
    if me == 0:
        assert (sentinel == 0x5A).all(), ("sentinel", i)
c.Barrier()
assert told == (24 if me == 1 else 0), told
print(f"rank {me}: OK", flush=True)
"""


def test_a_local_peer_lying_in_its_records_reaches_only_its_own_memory():
    res = run_mpi(2, _LIAR, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "rank 0: OK" in out and "rank 1: OK" in out, out[-3000:]
