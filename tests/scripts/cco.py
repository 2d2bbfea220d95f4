"""Collective checks (buffers, IN_PLACE, nonblocking, objects) for any size."""
import numpy as np
from _mpi import MPI, check, done

world = MPI.COMM_WORLD
for comm in (world, world.Dup(), MPI.COMM_SELF):
    r, n = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    for root in range(n):
        b = np.arange(5, dtype="i") if r == root else np.zeros(5, "i")
        comm.Bcast(b, root)
        check((b == np.arange(5)).all(), f"Bcast root {root}")
        s = np.full(3, r + 1, "d")
        d = np.zeros(3, "d") if r == root else None
        comm.Reduce(s, d, MPI.SUM, root)
        if r == root:
            check((d == n * (n + 1) / 2).all(), f"Reduce {d}")
            d = s.copy()
            comm.Reduce(MPI.IN_PLACE, d, MPI.MAX, root)
            check((d == n).all(), "Reduce IN_PLACE MAX")
        else:
            comm.Reduce(s, None, MPI.MAX, root)
        g = np.zeros(2 * n, "i") if r == root else None
        comm.Gather(np.array([r, -r], "i"), g, root)
        if r == root:
            check((g.reshape(n, 2)[:, 0] == np.arange(n)).all(), f"Gather {g}")
        sc = np.arange(3 * n, dtype="l") if r == root else None
        rv = np.zeros(3, "l")
        comm.Scatter(sc, rv, root)
        check((rv == np.arange(3 * r, 3 * r + 3)).all(), f"Scatter {rv}")
        counts = [i + 1 for i in range(n)]
        displs = [sum(counts[:i]) for i in range(n)]
        gv = np.zeros(sum(counts), "d") if r == root else None
        comm.Gatherv(np.full(r + 1, r, "d"), [gv, counts, displs, MPI.DOUBLE] if r == root
                     else None, root)
        if r == root:
            check((gv == np.repeat(np.arange(n), counts)).all(), f"Gatherv {gv}")
        sv = np.repeat(np.arange(n), counts).astype("d") if r == root else None
        rv = np.zeros(r + 1, "d")
        comm.Scatterv([sv, counts, displs, MPI.DOUBLE] if r == root else None, rv, root)
        check((rv == r).all(), f"Scatterv {rv}")
        check(comm.bcast({"k": root} if r == root else None, root) == {"k": root}, "bcast obj")
        got = comm.gather(r * 2, root)
        check(got == ([i * 2 for i in range(n)] if r == root else None), f"gather obj {got}")
        got = comm.scatter([("x", i) for i in range(n)] if r == root else None, root)
        check(got == ("x", r), "scatter obj")
        got = comm.reduce(r + 1, MPI.PROD, root)
        if r == root:
            import math
            check(got == math.factorial(n), f"reduce obj {got}")
    for dt in ("i", "d", "f", "q"):
        s = np.arange(6, dtype=dt) + r
        d = np.zeros(6, dt)
        comm.Allreduce(s, d, MPI.SUM)
        check(np.allclose(d, n * np.arange(6) + n * (n - 1) / 2), f"Allreduce {dt}")
        comm.Allreduce(MPI.IN_PLACE, s, MPI.MIN)
        check(np.allclose(s, np.arange(6)), f"Allreduce IN_PLACE {dt}")
    big = np.ones(200_000)
    out = np.empty_like(big)
    comm.Allreduce(big, out)
    check((out == n).all(), "Allreduce large")
    ag = np.zeros(n, "i")
    comm.Allgather(np.array([r], "i"), ag)
    check((ag == np.arange(n)).all(), "Allgather")
    ag = np.arange(n, dtype="i") * (np.arange(n) == r)
    comm.Allgather(MPI.IN_PLACE, ag)
    check((ag == np.arange(n)).all(), "Allgather IN_PLACE")
    counts = [2] * n
    agv = np.zeros(2 * n, "d")
    comm.Allgatherv(np.full(2, r, "d"), [agv, counts, None, MPI.DOUBLE])
    check((agv == np.repeat(np.arange(n), 2)).all(), "Allgatherv")
    s = np.array([r * 100 + j for j in range(n)], "i")
    d = np.zeros(n, "i")
    comm.Alltoall(s, d)
    check((d == np.arange(n) * 100 + r).all(), f"Alltoall {d}")
    comm.Alltoall(MPI.IN_PLACE, s)
    check((s == np.arange(n) * 100 + r).all(), "Alltoall IN_PLACE")
    sc = [j + 1 for j in range(n)]
    sd = [sum(sc[:j]) for j in range(n)]
    sbuf = np.full(sum(sc), r, "d")
    rc = [r + 1] * n
    rd = [(r + 1) * j for j in range(n)]
    rbuf = np.zeros((r + 1) * n, "d")
    comm.Alltoallv([sbuf, sc, sd, MPI.DOUBLE], [rbuf, rc, rd, MPI.DOUBLE])
    check((rbuf == np.repeat(np.arange(n), r + 1)).all(), f"Alltoallv {rbuf}")
    rs = np.zeros(2, "i")
    comm.Reduce_scatter_block(np.arange(2 * n, dtype="i"), rs, MPI.SUM)
    check((rs == n * np.arange(2 * r, 2 * r + 2)).all(), f"Reduce_scatter_block {rs}")
    rcnt = [1 + (j % 2) for j in range(n)]
    rs = np.zeros(rcnt[r], "d")
    comm.Reduce_scatter(np.ones(sum(rcnt), "d"), rs, rcnt, MPI.SUM)
    check((rs == n).all(), "Reduce_scatter")
    sc_ = np.zeros(2, "i")
    comm.Scan(np.array([r, 1], "i"), sc_)
    check(sc_[0] == r * (r + 1) // 2 and sc_[1] == r + 1, f"Scan {sc_}")
    ex = np.full(2, -7, "i")
    comm.Exscan(np.array([r, 1], "i"), ex)
    if r > 0:
        check(ex[0] == r * (r - 1) // 2 and ex[1] == r, f"Exscan {ex}")
    # nonblocking
    d = np.zeros(4)
    reqs = [comm.Iallreduce(np.ones(4), d), comm.Ibarrier()]
    b = np.arange(3.0) if r == 0 else np.zeros(3)
    reqs.append(comm.Ibcast(b, 0))
    ag = np.zeros(n, "i")
    reqs.append(comm.Iallgather(np.array([r], "i"), ag))
    MPI.Request.Waitall(reqs)
    check((d == n).all() and (b == np.arange(3.0)).all() and (ag == np.arange(n)).all(),
          "nonblocking collectives")
    # objects
    check(comm.allreduce(r) == n * (n - 1) // 2, "allreduce obj")
    check(comm.allreduce([r], MPI.SUM) == list(range(n)), "allreduce list concat")
    check(comm.allreduce(r, MPI.MAX) == n - 1, "allreduce MAX")
    check(comm.allgather(str(r)) == [str(i) for i in range(n)], "allgather obj")
    check(comm.alltoall([(r, j) for j in range(n)]) == [(j, r) for j in range(n)],
          "alltoall obj")
    check(comm.scan(1) == r + 1, "scan obj")
    got = comm.exscan(1)
    check(got == (r if r > 0 else None), f"exscan obj {got}")
    arr = np.arange(400_000) if r == 0 else None
    got = comm.bcast(arr, 0)
    check(got.shape == (400_000,) and got[-1] == 399_999, "bcast large array obj")
    comm.barrier()
done("cco")
