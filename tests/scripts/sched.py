"""Schedule-run collectives (erdmampi.collectives.sched) against NumPy, any size.

argv[1]: "small" (every op/dtype, sizes 0, 1, odd; run with ERDMA_SCHED_MIN=0
and a small ERDMA_SCHED_CHUNK so that messages span many chunks), "large"
(16 MiB+ vectors with the default settings) or "overlap" (a nonblocking
allreduce progresses while Python computes)."""
import sys
import time

import numpy as np
from _mpi import MPI, check, done

from erdmampi import collectives as coll
from erdmampi.collectives import sched

world = MPI.COMM_WORLD
mode = sys.argv[1]
OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
COMPLEX = ["complex64", "complex128"]


def valid(op, dt):
    if dt in COMPLEX:
        return op in ("SUM", "PROD")
    if dt == "bool":
        return op in ("LAND", "LOR", "LXOR")
    if dt in FLOATS:
        return op not in ("BAND", "BOR", "BXOR")
    return True


def data(rank, n, dt, op, salt=0):
    """Per-rank input whose reduction is exact in any order."""
    rng = np.random.default_rng(1000 * rank + salt)
    d = np.dtype(dt)
    if dt == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if d.kind in "iu":
        info = np.iinfo(d)
        return rng.integers(info.min, info.max, n, dtype=d, endpoint=True)
    if op == "PROD":
        vals = np.array([0.5, 1.0, 2.0, -1.0])
        x = vals[rng.integers(0, 4, n)]
        if d.kind == "c":
            return (x + 1j * vals[rng.integers(0, 4, n)]).astype(d)
        return x.astype(d)
    x = rng.integers(-4, 5, n).astype(np.float64)
    if d.kind == "c":
        return (x + 1j * rng.integers(-4, 5, n)).astype(d)
    return x.astype(d)


def reference(op, arrays):
    mop = getattr(MPI, op)
    acc = arrays[-1].copy()
    for x in reversed(arrays[:-1]):
        mop.Reduce_local(x, acc)
    return acc


def spec(arr):
    return [arr, MPI.C_BOOL] if arr.dtype == bool else arr


def check_allreduce(comm, op, dt, n, salt=0):
    r, size = comm.Get_rank(), comm.Get_size()
    xs = [data(q, n, dt, op, salt) for q in range(size)]
    ref = reference(op, xs)
    out = np.zeros(n, dt)
    comm.Allreduce(spec(xs[r]), spec(out), getattr(MPI, op))
    check(np.array_equal(out, ref), f"Allreduce {op} {dt} n={n}")
    io = xs[r].copy()
    comm.Allreduce(MPI.IN_PLACE, spec(io), getattr(MPI, op))
    check(np.array_equal(io, ref), f"Allreduce IN_PLACE {op} {dt} n={n}")


def check_reduce_scatter(comm, dt, counts, inplace):
    r, size = comm.Get_rank(), comm.Get_size()
    total = sum(counts)
    xs = [data(q, total, dt, "SUM", 7) for q in range(size)]
    ref = reference("SUM", xs)
    off = sum(counts[:r])
    if inplace:
        buf = xs[r].copy()
        comm.Reduce_scatter(MPI.IN_PLACE, buf, counts, MPI.SUM)
        got = buf[:counts[r]]
    else:
        got = np.zeros(counts[r], dt)
        comm.Reduce_scatter(xs[r], got, counts, MPI.SUM)
    check(np.array_equal(got, ref[off:off + counts[r]]),
          f"Reduce_scatter {dt} {counts} inplace={inplace}")


def check_moves(comm, n):
    r, size = comm.Get_rank(), comm.Get_size()
    for root in range(size):
        b = np.arange(n, dtype="i4") * (root + 1) if r == root else np.zeros(n, "i4")
        comm.Bcast(b, root)
        check(np.array_equal(b, np.arange(n, dtype="i4") * (root + 1)), f"Bcast n={n} root={root}")
    g = np.zeros(n * size, "f8")
    comm.Allgather(np.full(n, r, "f8"), g)
    check(np.array_equal(g, np.repeat(np.arange(size), n).astype("f8")), f"Allgather n={n}")
    g = np.zeros(n * size, "f8")
    g[r * n:(r + 1) * n] = r
    comm.Allgather(MPI.IN_PLACE, g)
    check(np.array_equal(g, np.repeat(np.arange(size), n).astype("f8")),
          f"Allgather IN_PLACE n={n}")
    counts = [n + q for q in range(size)]
    displs = [sum(counts[:q]) for q in range(size)]
    gv = np.zeros(sum(counts), "i8")
    comm.Allgatherv(np.full(counts[r], r, "i8"), [gv, counts, displs, MPI.INT64_T])
    check(np.array_equal(gv, np.repeat(np.arange(size), counts)), f"Allgatherv n={n}")
    s = (np.arange(n * size, dtype="i4") + 1000 * r)
    d = np.zeros(n * size, "i4")
    comm.Alltoall(s, d)
    exp = np.concatenate([np.arange(r * n, (r + 1) * n, dtype="i4") + 1000 * q
                          for q in range(size)])
    check(np.array_equal(d, exp), f"Alltoall n={n}")
    sc = [n + (r + q) % 3 for q in range(size)]          # I send sc[q] to q
    rc = [n + (q + r) % 3 for q in range(size)]          # q sends me n+(q+r)%3
    sd = [sum(sc[:q]) for q in range(size)]
    rd = [sum(rc[:q]) for q in range(size)]
    sv = np.concatenate([np.full(sc[q], 100 * r + q, "i2") for q in range(size)])
    rv = np.zeros(sum(rc), "i2")
    comm.Alltoallv([sv, sc, sd, MPI.INT16_T], [rv, rc, rd, MPI.INT16_T])
    exp = np.concatenate([np.full(rc[q], 100 * q + r, "i2") for q in range(size)])
    check(np.array_equal(rv, exp), f"Alltoallv n={n}")


def check_direct(comm):
    """The schedule algorithms run (do not fall back) over a communicator."""
    r, size = comm.Get_rank(), comm.Get_size()
    x = np.full(1001, r + 1, "f8")
    y = np.zeros_like(x)
    ok = sched.allreduce_sched_ring(comm._transport(), x, y,
                                    _reduce_fn(MPI.SUM, MPI.DOUBLE), True)
    check(ok is True and (y == size * (size + 1) / 2).all(), f"allreduce_sched_ring ran: {ok}")
    ok = sched.allreduce_sched_ring(comm._transport(), x, y, lambda a, b: None, True)
    check(ok is False, "a user-defined op falls back")
    want = sched.allreduce_sched_pair if size == 2 else sched.allreduce_sched_slices
    check(coll.select("allreduce", 1 << 20, size, 1 << 17) is want or size == 1,
          "selected for 1 MiB")


from erdmampi.comm import _reduce_fn  # noqa: E402

if mode == "small":
    for comm in (world, world.Split(world.Get_rank() % 2 if world.Get_size() > 2 else 0,
                                    -world.Get_rank())):
        check_direct(comm)
        size = comm.Get_size()
        for dt in INTS + FLOATS + COMPLEX + ["bool"]:
            for op in OPS:
                if valid(op, dt):
                    for n in (0, 1, 13):
                        check_allreduce(comm, op, dt, n)
        for n in (1000 + 7, 5000):
            for dt in ("int32", "float64", "uint8"):
                check_allreduce(comm, "SUM", dt, n, salt=n)
                check_allreduce(comm, "MAX", dt, n, salt=n)
            check_allreduce(comm, "PROD", "complex64", n)
        for counts in ([0] * size, [1] * size, [1000 + q for q in range(size)],
                       [3000 * (q % 2) for q in range(size)]):
            check_reduce_scatter(comm, "int64", counts, False)
            check_reduce_scatter(comm, "float32", counts, True)
        for n in (0, 1, 4099):
            check_moves(comm, n)
elif mode == "large":
    n = (16 << 20) // 8 + 5
    check_allreduce(world, "SUM", "float64", n)
    check_allreduce(world, "BXOR", "int32", (16 << 20) // 4 + 3)
    check_reduce_scatter(world, "float64", [(4 << 20) // 8 + q for q in range(world.Get_size())],
                         False)
    # two ranks: each computes half (odd count) and writes it into the other's buffer
    check_allreduce(world, "SUM", "float32", (4 << 20) // 4 + 3)
    check_allreduce(world, "MIN", "int16", (1 << 20) // 2 + 1)
    for inplace in (False, True):        # equal blocks: each reads its block of the other's
        check_reduce_scatter(world, "int32", [(1 << 20) // 4 + 1] * world.Get_size(), inplace)
    check_moves(world, (8 << 20) // 8 + 1)
elif mode == "overlap":
    n = (64 << 20) // 8
    a = np.ones(n)
    b = np.zeros(n)
    c = np.zeros(n)
    results = []
    for attempt in range(3):        # other load on the machine can hide one attempt
        alone = []
        for _ in range(2):
            world.Barrier()
            t0 = time.perf_counter()
            world.Allreduce(a, b)
            alone.append(time.perf_counter() - t0)
        t_alone = min(alone)
        world.Barrier()
        c[:] = 0
        req = world.Iallreduce(a, c)
        t0 = time.perf_counter()
        budget = max(0.4, 10 * t_alone)
        x = 0
        while time.perf_counter() - t0 < budget:   # pure-Python work, holds the GIL
            for i in range(1000):
                x += i * i
        t1 = time.perf_counter()
        req.Wait()
        t_wait = time.perf_counter() - t1
        check((c == world.Get_size()).all(), "Iallreduce result")
        # without background progress the wait would take about t_alone
        ok = world.allreduce(t_wait < 0.75 * t_alone, op=MPI.LAND)
        results.append(f"alone {t_alone:.3f}s wait {t_wait:.4f}s")
        if ok:
            break
    check(ok, "Iallreduce did not progress while Python computed: " + "; ".join(results))
    print(f"rank {world.Get_rank()}: " + "; ".join(results), flush=True)

done("sched")
