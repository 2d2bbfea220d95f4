"""A collective's blocks to a rank of this host by one CMA read below the
ring's eager limit (ERDMA_SEND_BULK, cfg.shm_bulk_cma_min): the C
collectives' Alltoall, Allgather and Bcast (the two-rank root's shortcut
into the ring included) give the same bytes whichever way a block goes:
through the ring, read with CMA, or read with CMA refused by the kernel
mid-job; the threshold is measured at start-up unless
ERDMA_SHM_BULK_CMA sets it."""
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


def _run(n, env, mode="plain", extra_cmd=None, monkeypatch=None):
    if extra_cmd:
        import harness
        orig = harness.erdmarun_cmd
        monkeypatch.setattr(harness, "erdmarun_cmd", lambda: extra_cmd + orig())
    res = run_mpi(n, _SCRIPT, args=[mode], timeout=120, env=env)
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
    res = _run(2, {"ERDMA_VERBOSE": "1", "ERDMA_SHM_BULK_CMA": "64K"})
    assert "goes by CMA from" not in res.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_cma_refused_mid_job(monkeypatch):
    # rank 1 is not dumpable and the job lacks CAP_SYS_PTRACE: the first read
    # from it fails with EPERM, and its blocks come through the ring instead
    res = _run(2, {"ERDMA_SHM_BULK_CMA": "64K", "ERDMA_VERBOSE": "1"}, mode="refuse",
               extra_cmd=["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
                          "-sys_ptrace"], monkeypatch=monkeypatch)
    assert "refused" in res.stderr, res.stderr[-2000:]
