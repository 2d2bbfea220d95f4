"""A collective's blocks to a rank of this host by one CMA read below the
ring's eager limit (ERDMA_SEND_BULK, cfg.shm_bulk_cma_min): the C
collectives' Alltoall, Allgather and Bcast (the two-rank root's shortcut
into the ring included) give the same bytes whichever way a block goes:
through the ring, read with CMA, or read with CMA refused by the kernel
mid-job; the threshold is measured at start-up unless
ERDMA_SHM_BULK_CMA sets it, and so is whether a read 1-63 bytes after its
source modulo the page goes through a bounce buffer (ERDMA_SHM_CMA_BOUNCE),
exact either way.  Point-to-point messages likewise from
cfg.shm_p2p_cma_min (ERDMA_SHM_P2P_CMA, default never: one read by the
receiver) and cfg.shm_p2p_split_min (ERDMA_SHM_P2P_SPLIT, default 16 KiB:
the receiver reads the first part while the sender writes the second): a
send from those sizes completes once the receiver has its bytes."""
import re
import shutil

import pytest

from harness import run_mpi

# Each call twice with the same buffers: the second is the one-call C path
# (erdma_pyfast), the first the normal one.  Sizes around the threshold
# the tests set (64 KiB) and the measured one (16 KiB).
_SCRIPT = r'''
import ctypes, os, sys
if sys.argv[1] == "refuse" and os.environ.get("ERDMA_RANK") == "1":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)          # PR_SET_DUMPABLE 0: CMA gets EPERM
import numpy as np
from erdmampi import MPI

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
for blk in (1000, 16383, 16384, 32768, 65535, 65536, 65537, 131072, 300001, 524288, 1 << 20):
    for dt in (np.uint8, np.float64):
        cnt = max(1, blk // np.dtype(dt).itemsize)
        send = (np.arange(n * cnt) % 251 + 7 * r).astype(dt)
        rbuf = np.zeros(n * cnt, dt)
        want = np.concatenate([((np.arange(n * cnt) % 251 + 7 * p).astype(dt))
                               [r * cnt:(r + 1) * cnt] for p in range(n)])
        for _ in range(2):
            rbuf[:] = 0
            c.Alltoall(send, rbuf)
            assert np.array_equal(rbuf, want), ("Alltoall", blk, dt)
        mine = (np.arange(cnt) % 253 + r).astype(dt)
        gath = np.zeros(n * cnt, dt)
        for _ in range(2):
            gath[:] = 0
            c.Allgather(mine, gath)
            for p in range(n):
                assert np.array_equal(gath[p * cnt:(p + 1) * cnt],
                                      (np.arange(cnt) % 253 + p).astype(dt)), ("Allgather", blk)
        for root in range(n):
            b = np.zeros(cnt, dt)
            for _ in range(2):
                b[:] = (np.arange(cnt) % 241 + root).astype(dt) if r == root else 0
                c.Bcast(b, root)
                assert np.array_equal(b, (np.arange(cnt) % 241 + root).astype(dt)), \
                    ("Bcast", blk, root)
c.Barrier()
print(f"rank {r}: OK", flush=True)
'''


def _run(n, env, mode="plain", extra_cmd=None, monkeypatch=None, script=_SCRIPT):
    if extra_cmd:
        import harness
        orig = harness.erdmarun_cmd
        monkeypatch.setattr(harness, "erdmarun_cmd", lambda: extra_cmd + orig())
    res = run_mpi(n, script, args=[mode], timeout=120, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    for i in range(n):
        assert f"rank {i}: OK" in res.stdout, out[-3000:]
    return res


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("limit", ["64K", "0"])
def test_blocks_by_cma_or_ring_exact(n, limit):
    # 64K: every block from 64 KiB by CMA; 0: never (the ring up to 1 MiB)
    _run(n, {"ERDMA_SHM_BULK_CMA": limit})


def test_threshold_measured_at_start_up():
    res = _run(2, {"ERDMA_VERBOSE": "1"})
    got = re.findall(r"erdma\[(\d)\]: a collective's block to a rank of this host goes by "
                     r"CMA from (\(never\) )?(\d+) bytes", res.stderr)
    assert sorted(g[0] for g in got) == ["0", "1"], res.stderr[-2000:]
    for _, never, size in got:
        assert (never and size == "0") or (not never and int(size) == 16 << 10)


def test_threshold_set_by_hand_is_not_measured():
    res = _run(2, {"ERDMA_VERBOSE": "1", "ERDMA_SHM_BULK_CMA": "64K",
                   "ERDMA_SHM_CMA_BOUNCE": "on"})
    assert "a collective's block to a rank of this host goes by CMA" not in res.stderr
    res = _run(2, {"ERDMA_VERBOSE": "1", "ERDMA_SHM_BULK_CMA": "64K"})   # the bounce measured
    got = re.findall(r"goes by CMA from (\d+) bytes", res.stderr)
    assert got == ["65536", "65536"], res.stderr[-2000:]


# Buffers placed so that every copy between them runs 16 bytes after its
# source modulo the page (where the kernel's copy stalls on AMD and a CMA
# read may bounce): collectives by CMA and point-to-point messages split
# between reader and writer give the same bytes, bounced or not.
_ALIAS_SCRIPT = r'''
import numpy as np
from erdmampi import MPI

def placed(n, off):
    raw = np.zeros(n + 8192, np.uint8)
    at = (-raw.ctypes.data) % 4096 + off
    return raw[at:at + n]

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
for blk in (4096, 65536, 200003, 1 << 20):
    send, rbuf = placed(n * blk, 0), placed(n * blk, 16)
    send[:] = (np.arange(n * blk) % 251 + 7 * r).astype(np.uint8)
    for _ in range(2):
        rbuf[:] = 0
        c.Alltoall(send, rbuf)
        for p in range(n):
            want = ((np.arange(n * blk) % 251 + 7 * p).astype(np.uint8))[r * blk:(r + 1) * blk]
            assert np.array_equal(rbuf[p * blk:(p + 1) * blk], want), ("Alltoall", blk)
        rbuf[:] = 0
        c.Allgather(send[:blk], rbuf)
        for p in range(n):
            want = ((np.arange(blk) % 251 + 7 * p).astype(np.uint8))
            assert np.array_equal(rbuf[p * blk:(p + 1) * blk], want), ("Allgather", blk)
    if r < 2:
        peer = 1 - r
        if r == 0:
            c.Send(send[:blk], dest=1, tag=5)
            c.Recv(rbuf[:blk], source=1, tag=6)
        else:
            c.Recv(rbuf[:blk], source=0, tag=5)
            c.Send(send[:blk], dest=0, tag=6)
        want = (np.arange(blk) % 251 + 7 * peer).astype(np.uint8)
        assert np.array_equal(rbuf[:blk], want), ("Send/Recv", blk)
c.Barrier()
print(f"rank {r}: OK", flush=True)
'''


@pytest.mark.parametrize("bounce", ["on", "off"])
def test_copies_16_bytes_off_are_exact_bounced_or_not(bounce):
    res = _run(2, {"ERDMA_VERBOSE": "1", "ERDMA_SHM_CMA_BOUNCE": bounce,
                   "ERDMA_SHM_BULK_CMA": "16K"}, script=_ALIAS_SCRIPT)
    assert "goes by CMA" not in res.stderr      # nothing measured: both set by hand
    _run(3, {"ERDMA_SHM_CMA_BOUNCE": bounce}, script=_ALIAS_SCRIPT)


def test_bounce_measured_at_start_up():
    res = _run(2, {"ERDMA_VERBOSE": "1"})
    got = re.findall(r"modulo the page goes by (the vector loop|memcpy), by CMA "
                     r"(through a bounce buffer|straight)", res.stderr)
    assert len(got) == 2, res.stderr[-2000:]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_cma_refused_mid_job(monkeypatch):
    # rank 1 is not dumpable and the job lacks CAP_SYS_PTRACE: the first read
    # from it fails with EPERM, and its blocks come through the ring instead
    res = _run(2, {"ERDMA_SHM_BULK_CMA": "64K", "ERDMA_VERBOSE": "1"}, mode="refuse",
               extra_cmd=["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
                          "-sys_ptrace"], monkeypatch=monkeypatch)
    assert "refused" in res.stderr, res.stderr[-2000:]


# Point-to-point: every kind of send, sizes around the threshold the tests
# set (16 KiB) and the ring's limit (1 MiB); then how long a send waits for
# a receiver that posts its receive half a second late.
_P2P_SCRIPT = r'''
import ctypes, os, sys, time
if sys.argv[1] == "refuse" and os.environ.get("ERDMA_RANK") == "1":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)          # PR_SET_DUMPABLE 0: CMA gets EPERM
import numpy as np
from erdmampi import MPI

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
peer, src = (r + 1) % n, (r - 1) % n
for size in (4096, 16383, 16384, 65536, 300001, 1 << 20, (1 << 20) + 1):
    a = (np.arange(size) % 251 + r).astype(np.uint8)
    want = (np.arange(size) % 251 + src).astype(np.uint8)
    b = np.zeros(size, np.uint8)
    for k in range(2):                       # the general path, then the C one
        b[:] = 0
        if r % 2 == 0:
            c.Send(a, peer, 1)
            c.Recv(b, src, 1)
        else:
            c.Recv(b, src, 1)
            c.Send(a, peer, 1)
        assert np.array_equal(b, want), ("Send/Recv", size, k)
        b[:] = 0
        c.Sendrecv(a, peer, 2, b, src, 2)
        assert np.array_equal(b, want), ("Sendrecv", size, k)
        b[:] = 0
        MPI.Request.Waitall([c.Irecv(b, src, 3), c.Isend(a, peer, 3)])
        assert np.array_equal(b, want), ("Isend", size, k)
        b[:] = 0
        MPI.Request.Waitall([c.Irecv(b, src, 4), c.Issend(a, peer, 4)])
        assert np.array_equal(b, want), ("Issend", size, k)
if n == 2:
    # a sender busy in Python when the receiver's CTS comes: the receiver
    # claims the whole copy, and completes the send with its CTS. A receiver
    # descheduled for longer than the sender's busy spell makes an attempt
    # say nothing, so a late one is tried again with a longer spell.
    from erdmampi.bootstrap import init_world
    eng = init_world()
    a = (np.arange(65536) % 241).astype(np.uint8)
    for attempt in range(5):
        c.Barrier()
        before = eng.stats()
        if r == 0:
            req = c.Isend(a, 1, 10)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.05 * 2 ** attempt:
                pass
            req.Wait()
        else:
            b = np.zeros(65536, np.uint8)
            c.Recv(b, 0, 10)
            assert np.array_equal(b, a), "receiver-claimed split"
        after = eng.stats()
        got = (after['split_recvs'] - before['split_recvs'],
               after['split_pushes'] - before['split_pushes'])
        if c.allreduce(got == ((0, 0), (1, 0))[r], op=MPI.LAND):
            break
    print(f"rank {r}: claimed {got[0]} {got[1]}", flush=True)
    # a message longer than the receive buffer: truncated, never split,
    # nothing written past the buffer
    a = (np.arange(65536) % 251).astype(np.uint8)
    before = eng.stats()["split_recvs"]
    if r == 0:
        c.Send(a, 1, 9)
    else:
        guard = np.full(65536, 7, np.uint8)
        try:
            c.Recv(guard[:32768], 0, 9)
            raise SystemExit("no truncation error")
        except MPI.Exception as exc:
            assert exc.Get_error_class() == MPI.ERR_TRUNCATE, exc
        assert np.array_equal(guard[:32768], a[:32768])
        assert (guard[32768:] == 7).all(), "written past the receive buffer"
        assert eng.stats()["split_recvs"] == before, "a truncated message was split"
    waited = {}
    for size in (4096, 65536):
        a = np.ones(size, np.uint8)
        c.Barrier()
        if r == 0:
            t0 = time.perf_counter()
            c.Send(a, 1, 5)
            waited[size] = time.perf_counter() - t0
        else:
            time.sleep(0.5)
            c.Recv(a, 0, 5)
    if r == 0:
        print("waited", waited[4096], waited[65536], flush=True)
    # buffered sends complete without the receiver, whatever the size rule
    a = (np.arange(65536) % 249).astype(np.uint8)
    c.Barrier()
    if r == 0:
        t0 = time.perf_counter()
        c.Bsend(a, 1, 6)
        MPI.Request.Wait(c.Ibsend(a, 1, 7))
        c.bsend(a.tobytes(), 1, 8)
        assert time.perf_counter() - t0 < 0.3, "a buffered send waited for its receiver"
    else:
        time.sleep(0.5)
        for t in (6, 7):
            b = np.zeros(65536, np.uint8)
            c.Recv(b, 0, t)
            assert np.array_equal(b, a), ("Bsend", t)
        assert c.recv(source=0, tag=8) == a.tobytes()
c.Barrier()
from erdmampi.bootstrap import init_world
st = init_world().stats()
print(f"rank {r}: split {st['split_recvs']} {st['split_pushes']}", flush=True)
print(f"rank {r}: OK", flush=True)
'''


def _splits(res):
    """{rank: (receives that invited their sender, parts it pushed as sender)}"""
    return {int(m[0]): (int(m[1]), int(m[2]))
            for m in re.findall(r"rank (\d+): split (\d+) (\d+)", res.stdout)}


def _run_p2p(n, env, mode="plain", extra_cmd=None, monkeypatch=None):
    """_run of the point-to-point script: (rank 0's two waits or None, the run)."""
    res = _run(n, env, mode, extra_cmd, monkeypatch, script=_P2P_SCRIPT)
    m = re.search(r"waited ([0-9.e-]+) ([0-9.e-]+)", res.stdout)
    return (float(m.group(1)), float(m.group(2))) if m else None, res


@pytest.mark.parametrize("n", [2, 3])
def test_p2p_by_cma_from_the_threshold(n):
    # 16K: a 64 KiB send waits for its receive, a 4 KiB one goes into the
    # ring at once; no split, one read by the receiver
    waited, res = _run_p2p(n, {"ERDMA_SHM_P2P_CMA": "16K", "ERDMA_SHM_P2P_SPLIT": "0"})
    assert all(v == (0, 0) for v in _splits(res).values()), _splits(res)
    if n == 2:
        small, large = waited
        assert small < 0.2 and large > 0.35, waited


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("env", [{}, {"ERDMA_SHM_P2P_CMA": "16K", "ERDMA_SHM_P2P_SPLIT": "64K"}])
def test_p2p_split_between_receiver_and_sender(n, env):
    # the default (from 16 KiB), and split only from 64 KiB with one read by
    # the receiver below: every kind of send exact, a 64 KiB send waits for
    # its receive; a blocking sender writes its part while the receiver reads
    waited, res = _run_p2p(n, env)
    splits = _splits(res)
    assert sorted(splits) == list(range(n)), res.stdout[-2000:]
    assert all(recvs > 0 for recvs, _ in splits.values()), splits
    if n == 2:
        small, large = waited
        assert small < 0.2 and large > 0.35, waited
        assert sum(pushes for _, pushes in splits.values()) > 0, splits
        claimed = {int(m[0]): (int(m[1]), int(m[2]))
                   for m in re.findall(r"rank (\d+): claimed (\d+) (\d+)", res.stdout)}
        assert claimed == {0: (0, 0), 1: (1, 0)}, claimed


@pytest.mark.parametrize("env", [{"ERDMA_SHM_P2P_SPLIT": "0"},
                                 {"ERDMA_SHM_P2P_CMA": "0", "ERDMA_SHM_P2P_SPLIT": "0"}])
def test_p2p_by_cma_off(env):
    # 0: never; every message up to the ring's limit is sent at once
    (small, large), res = _run_p2p(2, env)
    assert small < 0.2 and large < 0.2, (small, large)
    assert all(v == (0, 0) for v in _splits(res).values()), _splits(res)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("split", ["0", "16K"])
def test_p2p_cma_refused_mid_job(monkeypatch, split):
    # rank 1 is not dumpable: reads from it and writes into it fail with
    # EPERM, and its messages come through the ring instead, every byte intact
    _, res = _run_p2p(2, {"ERDMA_SHM_P2P_CMA": "16K", "ERDMA_SHM_P2P_SPLIT": split,
                          "ERDMA_VERBOSE": "1"}, mode="refuse",
                      extra_cmd=["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
                                 "-sys_ptrace"], monkeypatch=monkeypatch)
    assert "refused" in res.stderr, res.stderr[-2000:]
