"""Data-movement collectives (zero-size, uneven counts, every root, IN_PLACE,
nonblocking) and object collectives with nested objects holding arrays."""
import numpy as np
from _mpi import MPI
from diff_util import RANK, SIZE, call, canon, digest, finish, out

world = MPI.COMM_WORLD
r, n = RANK, SIZE


def nb_or_b(comm, name, nb):
    if not nb:
        return getattr(comm, name)
    f = getattr(comm, "I" + name[0].lower() + name[1:])

    def run(*a):
        req = f(*a)
        st = MPI.Status()
        req.Wait(st)
        return None
    return run


def counts_for(kind):
    if kind == "uneven":
        return [(i * 2 + 1) % 4 for i in range(n)]   # includes 0 when n >= 2? 1,3,1,3 ...
    if kind == "zeros":
        return [0 if i % 2 == 0 else i + 1 for i in range(n)]
    return [0] * n


for cname, comm in (("world", world), ("dup", world.Dup())):
    for nb in (False, True):
        P = f"{cname}.{'nb' if nb else 'b'}"
        for root in range(n):
            for cnt in (0, 1, 7):
                # Bcast
                b = (np.arange(cnt, dtype="i4") + 10 * root) if r == root else np.full(cnt, -1, "i4")
                call(f"{P}.Bcast.r{root}.c{cnt}", nb_or_b(comm, "Bcast", nb), b, root)
                out(f"{P}.Bcast.r{root}.c{cnt}.val", digest(b))
                # Gather / Scatter (IN_PLACE at the root too)
                g = np.full(cnt * n, -1, "f8") if r == root else None
                call(f"{P}.Gather.r{root}.c{cnt}", nb_or_b(comm, "Gather", nb),
                     np.full(cnt, r + 0.5), g, root)
                if r == root:
                    out(f"{P}.Gather.r{root}.c{cnt}.val", digest(g))
                    g = np.full(cnt * n, -1, "f8")
                    g[r * cnt:(r + 1) * cnt] = 42
                    call(f"{P}.GatherIP.r{root}.c{cnt}", nb_or_b(comm, "Gather", nb),
                         MPI.IN_PLACE, g, root)
                    out(f"{P}.GatherIP.r{root}.c{cnt}.val", digest(g))
                else:
                    call(f"{P}.GatherIP.r{root}.c{cnt}", nb_or_b(comm, "Gather", nb),
                         np.full(cnt, r + 0.5), None, root)
                sc = np.arange(cnt * n, dtype="i8") * 3 if r == root else None
                rv = np.full(cnt, -1, "i8")
                call(f"{P}.Scatter.r{root}.c{cnt}", nb_or_b(comm, "Scatter", nb), sc, rv, root)
                out(f"{P}.Scatter.r{root}.c{cnt}.val", digest(rv))
                if r == root:
                    sc = np.arange(cnt * n, dtype="i8") * 3
                    call(f"{P}.ScatterIP.r{root}.c{cnt}", nb_or_b(comm, "Scatter", nb),
                         sc, MPI.IN_PLACE, root)
                    out(f"{P}.ScatterIP.r{root}.c{cnt}.val", digest(sc))
                else:
                    rv = np.full(cnt, -1, "i8")
                    call(f"{P}.ScatterIP.r{root}.c{cnt}", nb_or_b(comm, "Scatter", nb),
                         None, rv, root)
                    out(f"{P}.ScatterIP.r{root}.c{cnt}.val", digest(rv))
            # v-variants with uneven / zero counts
            for kind in ("uneven", "zeros", "allzero"):
                counts = counts_for(kind)
                displs = [sum(counts[:i]) + i for i in range(n)]   # gaps between blocks
                total = displs[-1] + counts[-1] + 1
                key = f"{P}.r{root}.{kind}"
                g = np.full(total, -1, "i2") if r == root else None
                call(f"{key}.Gatherv", nb_or_b(comm, "Gatherv", nb),
                     np.full(counts[r], r + 1, "i2"),
                     [g, counts, displs, MPI.SHORT] if r == root else None, root)
                if r == root:
                    out(f"{key}.Gatherv.val", digest(g))
                sv = np.arange(total, dtype="i2") if r == root else None
                rv = np.full(counts[r], -1, "i2")
                call(f"{key}.Scatterv", nb_or_b(comm, "Scatterv", nb),
                     [sv, counts, displs, MPI.SHORT] if r == root else None, rv, root)
                out(f"{key}.Scatterv.val", digest(rv))
        for kind in ("uneven", "zeros", "allzero"):
            counts = counts_for(kind)
            displs = [sum(counts[:i]) + 2 * i for i in range(n)]
            total = displs[-1] + counts[-1] + 2
            key = f"{P}.{kind}"
            g = np.full(total, 12345, "u4")
            call(f"{key}.Allgatherv", nb_or_b(comm, "Allgatherv", nb),
                 np.full(counts[r], r + 7, "u4"), [g, counts, displs, MPI.UNSIGNED])
            out(f"{key}.Allgatherv.val", digest(g))
            g = np.full(total, 12345, "u4")
            g[displs[r]:displs[r] + counts[r]] = 99
            call(f"{key}.AllgathervIP", nb_or_b(comm, "Allgatherv", nb),
                 MPI.IN_PLACE, [g, counts, displs, MPI.UNSIGNED])
            out(f"{key}.AllgathervIP.val", digest(g))
            # Alltoallv: rank r sends (r + j) % 3 items to rank j
            scounts = [(r + j) % 3 for j in range(n)]
            rcounts = [(j + r) % 3 for j in range(n)]
            if kind == "allzero":
                scounts = rcounts = [0] * n
            sdispl = [sum(scounts[:j]) for j in range(n)]
            rdispl = [sum(rcounts[:j]) + j for j in range(n)]
            sbuf = np.arange(sum(scounts), dtype="f4") + 100 * r
            rbuf = np.full(sum(rcounts) + n, -1, "f4")
            call(f"{key}.Alltoallv", nb_or_b(comm, "Alltoallv", nb),
                 [sbuf, scounts, sdispl, MPI.FLOAT], [rbuf, rcounts, rdispl, MPI.FLOAT])
            out(f"{key}.Alltoallv.val", digest(rbuf))
        for cnt in (0, 1, 5):
            g = np.full(cnt * n, -1, "c16")
            call(f"{P}.Allgather.c{cnt}", nb_or_b(comm, "Allgather", nb),
                 np.full(cnt, r + 1j), g)
            out(f"{P}.Allgather.c{cnt}.val", digest(g))
            g = np.full(cnt * n, -1, "c16")
            g[r * cnt:(r + 1) * cnt] = 5
            call(f"{P}.AllgatherIP.c{cnt}", nb_or_b(comm, "Allgather", nb), MPI.IN_PLACE, g)
            out(f"{P}.AllgatherIP.c{cnt}.val", digest(g))
            sb = np.arange(cnt * n, dtype="i4") + 1000 * r
            rb = np.full(cnt * n, -1, "i4")
            call(f"{P}.Alltoall.c{cnt}", nb_or_b(comm, "Alltoall", nb), sb, rb)
            out(f"{P}.Alltoall.c{cnt}.val", digest(rb))
            rb = sb.copy()
            call(f"{P}.AlltoallIP.c{cnt}", nb_or_b(comm, "Alltoall", nb), MPI.IN_PLACE, rb)
            out(f"{P}.AlltoallIP.c{cnt}.val", digest(rb))
        # v-variants IN_PLACE at the root, buffer specs with explicit types/counts
        counts = counts_for("uneven")
        displs = [sum(counts[:i]) for i in range(n)]
        for root in (0, n - 1):
            if r == root:
                g = np.full(sum(counts), -1, "i8")
                g[displs[r]:displs[r] + counts[r]] = 5
                call(f"{P}.GathervIP.r{root}", nb_or_b(comm, "Gatherv", nb), MPI.IN_PLACE,
                     [g, counts, displs, MPI.INT64_T], root)
                out(f"{P}.GathervIP.r{root}.val", digest(g))
                sv = np.arange(sum(counts), dtype="i8")
                call(f"{P}.ScattervIP.r{root}", nb_or_b(comm, "Scatterv", nb),
                     [sv, counts, displs, MPI.INT64_T], MPI.IN_PLACE, root)
                out(f"{P}.ScattervIP.r{root}.val", digest(sv))
            else:
                call(f"{P}.GathervIP.r{root}", nb_or_b(comm, "Gatherv", nb),
                     np.full(counts[r], r, "i8"), None, root)
                rv = np.full(counts[r], -1, "i8")
                call(f"{P}.ScattervIP.r{root}", nb_or_b(comm, "Scatterv", nb), None, rv, root)
                out(f"{P}.ScattervIP.r{root}.val", digest(rv))
        b = np.arange(10, dtype="f8") if r == 0 else np.zeros(10)
        call(f"{P}.Bcast.spec3", nb_or_b(comm, "Bcast", nb), [b, 4, MPI.DOUBLE], 0)
        out(f"{P}.Bcast.spec3.val", digest(b))
        b = np.arange(10, dtype="i4") if r == 0 else np.zeros(10, "i4")
        call(f"{P}.Bcast.bytes", nb_or_b(comm, "Bcast", nb), [b, MPI.BYTE], 0)
        out(f"{P}.Bcast.bytes.val", digest(b))
        for dt in ("?", "F", "D", "u8", "b"):
            b = (np.arange(6) % 3).astype(dt) if r == 1 % n else np.zeros(6, dt)
            call(f"{P}.Bcast.{dt}", nb_or_b(comm, "Bcast", nb), b, 1 % n)
            out(f"{P}.Bcast.{dt}.val", digest(b))
        call(f"{P}.Barrier", nb_or_b(comm, "Barrier", nb))
    # large-ish collectives (checksums)
    big = (np.arange(3_000_000, dtype="i4") * (r + 1)) % 1_000_003
    call(f"{cname}.big.Bcast", comm.Bcast, big if r == 0 else np.empty_like(big), 0)
    out(f"{cname}.big.Allreduce", digest(comm.allreduce(int(big[r]))))
    d = np.empty_like(big)
    comm.Allreduce(big, d, MPI.SUM)
    out(f"{cname}.big.Allreduce.val", digest(d))
    g = np.empty(1_000_000 * n, "f8")
    comm.Allgather(np.full(1_000_000, r * 1.5), g)
    out(f"{cname}.big.Allgather.val", digest(g))

    # several nonblocking collectives outstanding at once, completed out of order
    a1 = np.arange(1000, dtype="f8") * (r + 1)
    o1 = np.zeros(1000)
    b2 = np.arange(50000, dtype="i8") if r == n - 1 else np.zeros(50000, "i8")
    g3 = np.zeros(7 * n, "i4")
    reqs = [comm.Iallreduce(a1, o1, MPI.SUM), comm.Ibcast(b2, n - 1),
            comm.Iallgather(np.full(7, r, "i4"), g3), comm.Ibarrier()]
    sts = [MPI.Status() for _ in reqs]
    for i in (3, 1, 0, 2):
        reqs[i].Wait(sts[i])
    out(f"{cname}.multi.vals", [digest(o1), digest(b2), digest(g3)])
    out(f"{cname}.multi.reqs", [bool(q) for q in reqs])
    reqs = [comm.Iallreduce(a1, o1, MPI.MAX), comm.Ialltoall(np.arange(3 * n, dtype="i4") + r,
                                                            np.zeros(3 * n, "i4"))]
    out(f"{cname}.multi.waitall", canon(MPI.Request.Waitall(reqs)))
    out(f"{cname}.multi.max", digest(o1))
    # big objects
    bigobj = {"a": np.arange(600_000, dtype="f8") * (r + 1), "l": list(range(1000))}
    got = comm.bcast(bigobj if r == 0 else None, 0)
    out(f"{cname}.big.bcast", canon(got))
    got = comm.allgather(bigobj["a"][:200_000])
    out(f"{cname}.big.allgather", canon(got))
    got = comm.allreduce(bigobj["a"][:100_000])
    out(f"{cname}.big.allreduce", canon(got))

    # object collectives
    def obj(i):
        return {"rank": i, "arr": np.arange(i + 2, dtype="f4") * i,
                "nested": [(i, "s" * i), {"x": np.eye(2, dtype="i8") * i}], "none": None}

    for root in range(n):
        call(f"{cname}.bcast.r{root}", comm.bcast, obj(root) if r == root else None, root)
        call(f"{cname}.gather.r{root}", comm.gather, obj(r), root)
        call(f"{cname}.scatter.r{root}", comm.scatter,
             [obj(10 + i) for i in range(n)] if r == root else None, root)
        call(f"{cname}.reduce.r{root}", comm.reduce, np.arange(3) + r, MPI.SUM, root)
        call(f"{cname}.reduce.lambda.r{root}", comm.reduce, [r], lambda a, b: a + b, root)
    call(f"{cname}.allgather", comm.allgather, obj(r))
    call(f"{cname}.alltoall", comm.alltoall, [obj(r * 10 + j) for j in range(n)])
    for opname in ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
                   "MAXLOC", "MINLOC"):
        op = getattr(MPI, opname)
        v = ((r * 3) % 4, r) if opname in ("MAXLOC", "MINLOC") else (r * 5) % 3 + 1
        call(f"{cname}.allreduce.{opname}", comm.allreduce, v, op)
        call(f"{cname}.reduce.{opname}", comm.reduce, v, op, n - 1)
        call(f"{cname}.scan.{opname}", comm.scan, v, op)
        res = call(f"{cname}.exscan.{opname}.call", comm.exscan, v, op, show=None)
        if r > 0:
            out(f"{cname}.exscan.{opname}", canon(res))
    call(f"{cname}.allreduce.lambda", comm.allreduce, [r], lambda a, b: a + b)
    call(f"{cname}.scan.lambda", comm.scan, [r], lambda a, b: a + b)
    call(f"{cname}.exscan.lambda", comm.exscan, [r], lambda a, b: a + b)
    call(f"{cname}.allreduce.default", comm.allreduce, np.arange(4) * r)
    call(f"{cname}.allreduce.str", comm.allreduce, str(r))
    call(f"{cname}.barrier", comm.barrier)
    # nonblocking object collectives where both have them
    for name in ("ibarrier",):
        if hasattr(comm, name):
            req = getattr(comm, name)()
            call(f"{cname}.{name}.wait", req.wait)

finish()
