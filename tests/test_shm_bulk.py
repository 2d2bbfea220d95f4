"""Bulk collectives among ranks of one host (erdma_coll_bcast_pair,
erdma_coll_bcast_bulk, erdma_coll_alltoall_bulk, erdma_coll_allgather_bulk):
a two-rank Bcast split between a CMA write by the root and a CMA read by the
other rank, a Bcast of more ranks that all read the root's buffer, and
Alltoall / Allgather(v) that read each block straight out of its owner's
buffer; with CMA off, refused by the kernel,
or on for one side only, the same bytes go as messages.  Results must be
exact whatever the path."""
import shutil

import numpy as np
import pytest

import erdmampi.collectives as C
from harness import run_mpi

KiB = 1024
MiB = 1024 * KiB

# Every rank checks every result; the path taken is reported by the engine's
# counters where that is visible (bytes through the rings).
_SCRIPT = r'''
import ctypes, os, sys
mode = sys.argv[1]
rank_env = int(os.environ.get("ERDMA_RANK", "0"))
if "refuse" in mode and rank_env == 1:
    # nobody without CAP_SYS_PTRACE may read or write a non-dumpable process:
    # process_vm_* towards this rank fail with EPERM at run time
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)          # PR_SET_DUMPABLE, 0
if mode.endswith("mixed") and rank_env == 1:
    os.environ["ERDMA_SHM_CMA"] = "0"
import numpy as np
from erdmampi import MPI
import erdmampi.collectives as coll

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
KiB, MiB = 1024, 1 << 20
DTYPES = [np.uint8, np.int16, np.int32, np.int64, np.float32, np.float64, np.complex128]


def pattern(count, dtype, seed):
    x = (np.arange(count, dtype=np.int64) * 2654435761 + seed * 97) % 1000003
    return x.astype(dtype)


def check_bcast(nbytes, dtype, root, strided=False):
    count = nbytes // np.dtype(dtype).itemsize
    want = pattern(count, dtype, root + 1)
    if strided:
        # every other element of an array: the MPI layer takes contiguous
        # buffers only, so call the algorithm dispatcher directly
        base = np.zeros(2 * count, dtype)
        if r == root:
            base[::2] = want
        coll.bcast(c._transport(), base[::2], root)
        assert np.array_equal(base[::2], want), ("bcast", nbytes, dtype, root, strided)
        assert not base[1::2].any(), "bcast wrote between the strided elements"
        return
    buf = want.copy() if r == root else np.full(count, 7, dtype)
    c.Bcast(buf, root=root)
    assert np.array_equal(buf, want), ("bcast", nbytes, dtype, root, strided)


def check_alltoall(blk, dtype, inplace=False):
    send = np.concatenate([pattern(blk, dtype, 1000 * r + j) for j in range(n)])
    want = np.concatenate([pattern(blk, dtype, 1000 * j + r) for j in range(n)])
    if inplace:
        recv = send.copy()
        c.Alltoall(MPI.IN_PLACE, recv)
    else:
        recv = np.full(blk * n, 3, dtype)
        c.Alltoall(send, recv)
        assert np.array_equal(send, np.concatenate(
            [pattern(blk, dtype, 1000 * r + j) for j in range(n)])), "send buffer changed"
    assert np.array_equal(recv, want), ("alltoall", blk, dtype, inplace)


if mode in ("main", "nocma", "mixed", "refuse"):
    sizes = [256 * KiB, 256 * KiB + 8, 1 * MiB + 24, 3 * MiB + 40]
    roots = list(range(n))
    if mode == "refuse":
        roots = roots[::-1] if os.environ.get("ROOTS_REVERSED") else roots
    for dt in DTYPES:
        for nb in sizes:
            for root in roots:
                check_bcast(nb, dt, root)
    for root in roots:
        check_bcast(5 * MiB + 8, np.float64, root)      # the default picks the pair path
        check_bcast(5 * MiB + 3, np.uint8, root)
        if os.environ.get("ERDMA_COLL_BCAST", "").startswith("sched_p"):
            # (the Python algorithms want contiguous arrays)
            check_bcast(2 * MiB + 16, np.float64, root, strided=True)
        check_bcast(0, np.float32, root)
    for dt in DTYPES:
        isz = np.dtype(dt).itemsize
        for blk in (300 * KiB // isz, 300 * KiB // isz + 1, 2 * MiB // isz + 3):
            check_alltoall(blk, dt)
    check_alltoall(600 * KiB // 8 + 5, np.float64, inplace=True)
    # Allreduce (2 ranks below 1 MiB: each reduces the whole vector in rank
    # order); both ranks must hold the same bits, also for MAX with a NaN
    # (with 2 ranks: the algorithms of more ranks place NaNs differently in
    # and out of place)
    ops = {"SUM": MPI.SUM, "PROD": MPI.PROD, "MAX": MPI.MAX, "MIN": MPI.MIN,
           "BXOR": MPI.BXOR, "LAND": MPI.LAND}
    for dt in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.complex64):
        for cnt in (70 * KiB // np.dtype(dt).itemsize + 1, 900 * KiB // np.dtype(dt).itemsize + 3):
            for name, op in ops.items():
                if np.dtype(dt).kind == "c" and name not in ("SUM", "PROD"):
                    continue
                if np.dtype(dt).kind == "f" and name == "BXOR":
                    continue
                mine = (pattern(cnt, np.int64, r) % 5 + r).astype(dt)
                if np.dtype(dt).kind == "f" and name == "MAX" and r == 0 and n == 2:
                    mine[3] = np.nan
                got = np.zeros(cnt, dt)
                c.Allreduce(mine, got, op=op)
                vals = [(pattern(cnt, np.int64, j) % 5 + j).astype(dt) for j in range(n)]
                if np.dtype(dt).kind == "f" and name == "MAX" and n == 2:
                    vals[0][3] = np.nan
                every = c.allgather(got.tobytes())
                assert all(x == every[0] for x in every), ("allreduce bits differ", name, dt)
                if name == "SUM" and np.dtype(dt).kind in "fc":
                    assert np.allclose(got, sum(vals)), ("allreduce", name, dt, cnt)
                elif name == "SUM":
                    assert np.array_equal(got, sum(vals).astype(dt)), ("allreduce", name, dt)
                elif name == "MIN":
                    assert np.array_equal(got, np.minimum.reduce(vals)), ("allreduce", dt)
                inpl = mine.copy()
                c.Allreduce(MPI.IN_PLACE, inpl, op=op)
                assert inpl.tobytes() == got.tobytes(), ("allreduce in place", name, dt)
    # Allgather / Allgatherv (3+ ranks up to 8, and 2: every rank reads each block)
    for dt in (np.uint8, np.float64, np.complex128):
        for cnt in (300 * KiB // np.dtype(dt).itemsize + 1, 2 * MiB // np.dtype(dt).itemsize):
            mine = pattern(cnt, dt, r + 5)
            want = np.concatenate([pattern(cnt, dt, j + 5) for j in range(n)])
            got = np.zeros(cnt * n, dt)
            c.Allgather(mine, got)
            assert np.array_equal(got, want), ("allgather", cnt, dt)
            got = np.zeros(cnt * n, dt)
            got[r * cnt:(r + 1) * cnt] = mine
            c.Allgather(MPI.IN_PLACE, got)
            assert np.array_equal(got, want), ("allgather in place", cnt, dt)
    counts = [100 * KiB + 7 * j for j in range(n)]
    displs = [sum(counts[:j]) + 5 * j for j in range(n)]        # gaps stay untouched
    got = np.full(displs[-1] + counts[-1] + 5, -1, np.int32)
    c.Allgatherv(pattern(counts[r], np.int32, r), [got, counts, displs, MPI.INT32_T])
    for j in range(n):
        assert np.array_equal(got[displs[j]:displs[j] + counts[j]], pattern(counts[j], np.int32, j))
        assert (got[displs[j] + counts[j]:displs[j] + counts[j] + 5] == -1).all()
    # strided send and receive arrays (through the dispatcher, as above; of
    # the Alltoall algorithms only the bulk one takes them)
    blk = 200 * KiB
    sbase = np.zeros(2 * blk * n, np.int32)
    sbase[::2] = np.concatenate([pattern(blk, np.int32, 1000 * r + j) for j in range(n)])
    base = np.zeros(2 * blk * n, np.int32)
    coll.alltoall(c._transport(), sbase[::2], base[::2], algorithm="sched")
    # a contiguous derived datatype
    dt = MPI.INT32_T.Create_contiguous(4).Commit()
    send = np.concatenate([pattern(4 * 100000, np.int32, 1000 * r + j) for j in range(n)])
    recv = np.zeros_like(send)
    c.Alltoall([send, 100000, dt], [recv, 100000, dt])
    dt.Free()
    assert np.array_equal(recv, np.concatenate(
        [pattern(4 * 100000, np.int32, 1000 * j + r) for j in range(n)]))
    want = np.concatenate([pattern(blk, np.int32, 1000 * j + r) for j in range(n)])
    assert np.array_equal(base[::2], want) and not base[1::2].any()
elif mode == "refuse_in_place":
    # the first CMA of the job is an in-place Allreduce of halves: rank 1
    # could read rank 0 and push its half, rank 0 cannot read rank 1, and
    # no input may be overwritten before both know (the probe round)
    for cnt in (300 * KiB // 8 + 1, 2 * MiB // 8 + 3):
        w = pattern(cnt, np.float64, r)
        c.Allreduce(MPI.IN_PLACE, w)
        assert np.array_equal(w, sum(pattern(cnt, np.float64, j) for j in range(n))), cnt
elif mode.startswith("slices"):
    # Allreduce of 3+ ranks, each reducing one slice of every input
    # (erdma_coll_allreduce_slices, forced at every size): the same bits on
    # every rank, and where CMA works (mode "slices") exactly the rank-order
    # fold ((in0 OP in1) OP in2) ...; where it does not, the ring's result
    # (another order: close, for floats)
    exact = mode == "slices"
    ops = {"SUM": (MPI.SUM, np.add), "PROD": (MPI.PROD, np.multiply),
           "MAX": (MPI.MAX, np.maximum), "BXOR": (MPI.BXOR, np.bitwise_xor)}
    for dt in (np.float32, np.float64, np.int32, np.uint8, np.int64):
        isz = np.dtype(dt).itemsize
        for cnt in (1, n - 1, n, n + 1, 70 * KiB // isz + 1, 128 * KiB * n // isz + 3,
                    3 * MiB // isz + 5):
            for name, (op, fold) in ops.items():
                if np.dtype(dt).kind == "f" and name == "BXOR":
                    continue
                vals = [(pattern(cnt, np.int64, j) % 7 + j + 1).astype(dt) for j in range(n)]
                if np.dtype(dt).kind == "f":
                    vals = [v / np.asarray(3 + j, dt) for j, v in enumerate(vals)]
                want = vals[0].copy()
                for v in vals[1:]:
                    want = fold(want, v)
                mine = vals[r].copy()
                got = np.full(cnt + 2, 9, dt)
                c.Allreduce(mine, got[1:-1], op=op)
                assert got[0] == 9 and got[-1] == 9, ("wrote outside", name, dt, cnt)
                assert np.array_equal(mine, vals[r]), ("send buffer changed", name, dt, cnt)
                every = c.allgather(got.tobytes())
                assert all(x == every[0] for x in every), ("allreduce bits differ", name, dt, cnt)
                if exact or np.dtype(dt).kind != "f":
                    assert np.array_equal(got[1:-1], want), ("allreduce", name, dt, cnt)
                else:
                    assert np.allclose(got[1:-1], want, rtol=1e-5), ("allreduce", name, dt, cnt)
                inpl = np.full(cnt + 2, 9, dt)
                inpl[1:-1] = vals[r]
                c.Allreduce(MPI.IN_PLACE, inpl[1:-1], op=op)
                assert inpl[0] == 9 and inpl[-1] == 9, ("wrote outside in place", name, dt)
                if exact:
                    assert inpl.tobytes() == got.tobytes(), ("in place", name, dt, cnt)
                every = c.allgather(inpl.tobytes())
                assert all(x == every[0] for x in every), ("in place bits differ", name, dt)
    # Reduce_scatter_block / Reduce_scatter of equal blocks: block r of the
    # same fold; unequal blocks run the ring
    for dt in (np.float32, np.float64, np.int32, np.uint8):
        isz = np.dtype(dt).itemsize
        for cnt in (1, 70 * KiB // isz + 1, 300 * KiB // isz + 3):
            for name, (op, fold) in ops.items():
                if np.dtype(dt).kind == "f" and name == "BXOR":
                    continue
                vals = [(pattern(cnt * n, np.int64, j) % 7 + j + 1).astype(dt)
                        for j in range(n)]
                if np.dtype(dt).kind == "f":
                    vals = [v / np.asarray(3 + j, dt) for j, v in enumerate(vals)]
                want = vals[0].copy()
                for v in vals[1:]:
                    want = fold(want, v)
                want = want[r * cnt:(r + 1) * cnt]
                mine = vals[r].copy()
                got = np.full(cnt + 2, 9, dt)
                c.Reduce_scatter_block(mine, got[1:-1], op=op)
                assert got[0] == 9 and got[-1] == 9, ("rs wrote outside", name, dt, cnt)
                assert np.array_equal(mine, vals[r]), ("rs send buffer changed", name, dt)
                if exact or np.dtype(dt).kind != "f":
                    assert np.array_equal(got[1:-1], want), ("rs", name, dt, cnt)
                else:
                    assert np.allclose(got[1:-1], want, rtol=1e-5), ("rs", name, dt, cnt)
                inpl = vals[r].copy()
                c.Reduce_scatter_block(MPI.IN_PLACE, inpl, op=op)
                if exact:
                    assert inpl[:cnt].tobytes() == got[1:-1].tobytes(), ("rs in place", name)
                got2 = np.zeros(cnt, dt)
                c.Reduce_scatter(mine, got2, [cnt] * n, op=op)
                assert got2.tobytes() == got[1:-1].tobytes(), ("reduce_scatter", name, dt)
    counts = [100 * KiB + 7 * j for j in range(n)]               # unequal: the ring
    x = np.full(sum(counts), r + 1, np.int64)
    y = np.zeros(counts[r], np.int64)
    c.Reduce_scatter(x, y, counts)
    assert (y == n * (n + 1) // 2).all()
    # back to back, sizes and roles changing: no message of one call taken by the next
    for i in range(30):
        cnt = (i % 4 + 1) * 100 * KiB + i
        x = np.full(cnt, r + i, np.int64)
        c.Allreduce(MPI.IN_PLACE, x)
        assert (x == sum(j + i for j in range(n))).all(), i
elif mode == "slices_late":
    # every pair has read from each other, so the slices Allreduce skips its
    # probe round; then rank 1 makes itself undumpable: the next call fails
    # on every rank (an MPI error, no hang), and the one after runs the ring
    x = np.ones(300 * KiB, np.float64)
    c.Allreduce(MPI.IN_PLACE, x)
    assert (x == n).all()
    c.Barrier()
    if r == 1:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)          # PR_SET_DUMPABLE, 0
    c.Barrier()
    try:
        c.Allreduce(MPI.IN_PLACE, np.ones(300 * KiB, np.float64))
        raised = None
    except MPI.Exception as e:
        raised = e.Get_error_class()
    every = c.allgather(raised)
    assert all(e is not None for e in every), every
    z = np.ones(300 * KiB, np.float64)
    c.Allreduce(MPI.IN_PLACE, z)
    assert (z == n).all()
elif mode == "nonblocking":
    for root in range(n):
        count = 4 * MiB // 8 + 3
        want = pattern(count, np.float64, root)
        buf = want.copy() if r == root else np.zeros(count)
        c.Ibcast(buf, root=root).Wait()
        assert np.array_equal(buf, want)
    blk = 1 * MiB // 4 + 1
    send = np.concatenate([pattern(blk, np.float32, 1000 * r + j) for j in range(n)])
    recv = np.zeros_like(send)
    c.Ialltoall(send, recv).Wait()
    assert np.array_equal(recv, np.concatenate(
        [pattern(blk, np.float32, 1000 * j + r) for j in range(n)]))
elif mode == "large":
    # blocks over the last-level cache: a rank's own block is copied with
    # non-temporal stores (erdma_bulk.c bulk_copy), here into buffers at odd
    # addresses, with a tail that is not a whole cache line
    for blk, off in ((8 * MiB + 3, 1), (12 * MiB + 77, 13)):
        send = np.concatenate([pattern(blk, np.uint8, 1000 * r + j) for j in range(n)])
        sbase = np.zeros(blk * n + off, np.uint8)
        sbase[off:] = send
        rbase = np.full(blk * n + 2 * off, 3, np.uint8)
        c.Alltoall(sbase[off:], rbase[off:off + blk * n])
        want = np.concatenate([pattern(blk, np.uint8, 1000 * j + r) for j in range(n)])
        assert np.array_equal(rbase[off:off + blk * n], want), ("alltoall", blk, off)
        assert (rbase[:off] == 3).all() and (rbase[off + blk * n:] == 3).all(), "wrote outside"
        assert np.array_equal(sbase[off:], send), "send buffer changed"
elif mode == "many":
    # back-to-back calls with changing roots and sizes: no message of one
    # call may be taken by the next
    for i in range(40):
        root = i % n
        nb = (i % 5 + 1) * 300 * KiB + i
        check_bcast(nb, np.uint8, root)
        check_alltoall((i % 3 + 1) * 100 * KiB + i, np.uint8)
c.Barrier()
print("rank %d: OK" % r, flush=True)
'''


def _run(n, mode, env=None, extra=(), timeout=150, force=True):
    """Run the script; ``force``: every Bcast and Alltoall takes the bulk path
    whatever its size (Bcast of 2 ranks: the pair split, else every rank
    pulling from the root)."""
    env = dict(env or {})
    if force:
        env.setdefault("ERDMA_COLL_BCAST", "sched_pair" if n == 2 else "sched_pull")
        env.setdefault("ERDMA_COLL_ALLTOALL", "sched")
    res = run_mpi(n, _SCRIPT, args=[mode], timeout=timeout, env=env, extra=extra)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for i in range(n):
        assert f"rank {i}: OK" in res.stdout, out
    return res


def test_select_bulk_paths():
    assert C.select("allreduce", 512 * KiB, 2, 1 << 17).__name__ == "allreduce_sched_pair"
    assert C.select("allreduce", 1 * MiB, 2, 1 << 18).__name__ == "allreduce_sched_pair"
    big = C.BULK_ALLREDUCE_MAX
    assert C.select("allreduce", big - 4, 2, big // 4 - 1).__name__ == "allreduce_sched_pair"
    assert C.select("allreduce", big, 2, big // 4).__name__ == "allreduce_sched_ring"
    assert C.select("reduce_scatter", 256 * KiB, 2, 1 << 16).__name__ == "reduce_scatter_sched_pair"
    assert C.select("reduce_scatter", 256 * KiB, 3, 1 << 16).__name__ == \
        "reduce_scatter_sched_slices"
    assert C.select("reduce_scatter", 256 * KiB - 4, 2, (1 << 16) - 1).__name__ == \
        "reduce_scatter_ring"
    assert C.select("allreduce", 1 * MiB, 3, 1 << 18).__name__ != "allreduce_sched_pair"
    assert C.select("bcast", 16 * MiB, 2).__name__ == "bcast_sched_pair"
    assert C.select("bcast", C.BULK_BCAST_MIN, 2).__name__ == "bcast_sched_pair"
    assert C.select("bcast", C.BULK_BCAST_MIN - 1, 2).__name__ == "bcast_binomial"
    assert C.select("bcast", 16 * MiB, 3).__name__ == "bcast_sched_chain"   # pulls (<= 8)
    assert C.select("bcast", 1, 3, algorithm="sched_pull").__name__ == "bcast_sched_pull"
    # alltoall: nbytes is the per-rank traffic (send + receive), count the
    # receive buffer's bytes; two ranks: messages below BULK_ALLTOALL_PAIR_MIN
    assert C.select("alltoall", 32 * MiB, 2, 16 * MiB).__name__ == "alltoall_sched"
    big = C.BULK_ALLTOALL_PAIR_MIN
    assert C.select("alltoall", 2 * big, 2, big).__name__ == "alltoall_sched"
    assert C.select("alltoall", 2 * big - 2, 2, big - 1).__name__ == "alltoall_direct"
    assert C.select("alltoall", 2 * big - 2, 3, big - 1).__name__ == "alltoall_sched"
    assert C.select("alltoall", 32 * MiB, 4, 16 * MiB).__name__ == "alltoall_sched"


def test_bulk_without_schedules_falls_back():
    """A transport without schedules (threads as ranks) runs the Python
    algorithms through the same dispatchers."""
    from threadranks import spawn
    count = 300 * KiB

    def body(t):
        buf = np.arange(count, dtype=np.uint8) if t.rank == 1 else np.zeros(count, np.uint8)
        C.bcast(t, buf, 1)
        assert np.array_equal(buf, np.arange(count, dtype=np.uint8))
        send = np.full(2 * count, t.rank, np.uint8)
        recv = np.zeros(2 * count, np.uint8)
        C.alltoall(t, send, recv)
        assert (recv[:count] == 0).all() and (recv[count:] == 1).all()
        return True

    assert all(spawn(2, body))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_bulk_exact(n):
    _run(n, "main")


def test_bulk_exact_default_selection():
    _run(2, "main", force=False)


def test_bulk_exact_root_part_edges():
    # the root copies nothing, or everything
    _run(2, "many", env={"ERDMA_BULK_ROOT_PART": "0", "ERDMA_BULK_PULL_PART": "0"})
    _run(2, "many", env={"ERDMA_BULK_ROOT_PART": "1", "ERDMA_BULK_PULL_PART": "1"})


def test_bulk_without_cma():
    _run(2, "main", env={"ERDMA_SHM_CMA": "0"})
    _run(3, "many", env={"ERDMA_SHM_CMA": "0"})


def test_bulk_cma_on_one_side_only():
    _run(2, "mixed")
    _run(3, "mixed")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("n,reverse", [(2, False), (2, True), (3, False)])
def test_bulk_cma_refused_at_run_time(n, reverse, monkeypatch):
    """Rank 1 is not dumpable and the job lacks CAP_SYS_PTRACE: CMA towards it
    fails with EPERM in the middle of a collective, which finishes with
    messages (the root's half when its write fails, the receiver's half
    when its read does)."""
    import harness
    orig = harness.erdmarun_cmd
    monkeypatch.setattr(harness, "erdmarun_cmd", lambda: [
        "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"] + orig())
    res = _run(n, "refuse", env={"ROOTS_REVERSED": "1", "ERDMA_VERBOSE": "1"} if reverse
               else {"ERDMA_VERBOSE": "1"})
    assert "refused" in res.stderr, res.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_in_place_allreduce_pair_when_cma_is_refused_one_way(monkeypatch):
    import harness
    orig = harness.erdmarun_cmd
    monkeypatch.setattr(harness, "erdmarun_cmd", lambda: [
        "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"] + orig())
    res = _run(2, "refuse_in_place", env={"ERDMA_VERBOSE": "1"})
    assert "refused" in res.stderr, res.stderr


@pytest.mark.parametrize("n", [2, 4])
def test_bulk_nonblocking(n):
    _run(n, "nonblocking")


def test_bulk_many_calls():
    _run(2, "many")
    _run(4, "many")


@pytest.mark.parametrize("n", [2, 3])
def test_bulk_alltoall_over_the_cache(n):
    _run(n, "large")


# Allreduce and Reduce_scatter forced onto the slices path at every size
_SLICES = {"ERDMA_COLL_ALLREDUCE": "sched_slices", "ERDMA_COLL_REDUCE_SCATTER": "sched_slices"}


@pytest.mark.parametrize("n", [3, 4, 5])
def test_allreduce_slices_exact(n):
    """Every rank reduces one slice of all inputs in rank order (Allreduce)
    or its own block (Reduce_scatter)."""
    _run(n, "slices", env=_SLICES, timeout=240)


@pytest.mark.parametrize("mode,env", [("slices_ring", {"ERDMA_SHM_CMA": "0"}),
                                      ("slices_mixed", {})], ids=["no_cma", "one_side"])
def test_allreduce_slices_without_cma_runs_the_ring(mode, env):
    """Without CMA on every rank (or on rank 1 only), every rank learns it
    in the probe round and the ring runs instead: the same result on all,
    nothing written twice, nothing hung."""
    _run(3, mode, env=dict(env, **_SLICES), timeout=240)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_allreduce_slices_when_cma_is_refused(monkeypatch):
    """Rank 1 is not dumpable: the others' probes of it fail, every rank
    learns it before any buffer is written (in place included), and the ring
    gives the result."""
    import harness
    orig = harness.erdmarun_cmd
    monkeypatch.setattr(harness, "erdmarun_cmd", lambda: [
        "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"] + orig())
    _run(4, "slices_refuse", env=_SLICES, timeout=240)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_allreduce_slices_when_cma_is_refused_mid_job(monkeypatch):
    """A rank that turns undumpable after the ranks have read each other:
    the next slices Allreduce (no probe round) is an MPI error on every
    rank, not a hang or a wrong result, and the one after runs the ring."""
    import harness
    orig = harness.erdmarun_cmd
    monkeypatch.setattr(harness, "erdmarun_cmd", lambda: [
        "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"] + orig())
    _run(3, "slices_late", env={"ERDMA_COLL_ALLREDUCE": "sched_slices"}, timeout=120)
