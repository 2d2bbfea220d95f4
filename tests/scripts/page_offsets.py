"""Buffers that start at chosen offsets into a page, so that the copies of
a message (into and out of a ring, by CMA read or write, a rank's own block)
run with the source and destination 0, 8, 16, 48 or 4080 bytes apart modulo
the page (erdmampi copies the 1-63 bytes apart case by a vector loop and
CMA through a bounce buffer, erdma_copy.h): Send/Recv and Sendrecv of 3 KiB
to 5 MiB, Alltoall, Allgather, Bcast and Allreduce, every byte checked.
Two ranks or more."""
import numpy as np
from _mpi import MPI, check, done

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
nxt, prv = (rank + 1) % size, (rank - 1) % size
POOL = 24 << 20
pool = np.zeros(POOL + 8192, np.uint8)
base = (-pool.ctypes.data) % 4096
SIZES = [3 << 10, 200 << 10, (1 << 20) + 3, (5 << 20) + 16]
OFFS = [0, 8, 16, 48, 4080]


def at(off, nbytes, second=False):
    """nbytes of the pool starting `off` bytes into a page (the second half
    of the pool when `second`)."""
    start = base + off + (POOL // 2 if second else 0)
    return pool[start:start + nbytes]


def pattern(nbytes, who, salt):
    return ((np.arange(nbytes, dtype=np.uint32) * 2654435761 + who * 97 + salt) >> 11).astype(
        np.uint8)


for k, nbytes in enumerate(SIZES):
    for soff in OFFS:
        roff = OFFS[(OFFS.index(soff) + rank + k) % len(OFFS)]   # ranks differ
        s, r = at(soff, nbytes), at(roff, nbytes, True)
        s[:] = pattern(nbytes, rank, k)
        r[:] = 0
        comm.Sendrecv(s, dest=nxt, sendtag=k, recvbuf=r, source=prv, recvtag=k)
        check(np.array_equal(r, pattern(nbytes, prv, k)),
              f"Sendrecv {nbytes} B at offsets {soff}/{roff}")
        r[:] = 0
        if rank % 2 == 0:
            comm.Send(s, dest=nxt, tag=100 + k)
            comm.Recv(r, source=prv, tag=100 + k)
        else:
            comm.Recv(r, source=prv, tag=100 + k)
            comm.Send(s, dest=nxt, tag=100 + k)
        check(np.array_equal(r, pattern(nbytes, prv, k)),
              f"Send/Recv {nbytes} B at offsets {soff}/{roff}")

for blk in [2 << 10, 64 << 10, (256 << 10) + 16, 3 << 20]:
    for soff in OFFS:
        roff = OFFS[(OFFS.index(soff) + 2 + rank) % len(OFFS)]
        s, r = at(soff, blk * size), at(roff, blk * size, True)
        for j in range(size):
            s[j * blk:(j + 1) * blk] = pattern(blk, rank * size + j, 1)
        r[:] = 0
        comm.Alltoall(s, r)
        ok = all(np.array_equal(r[j * blk:(j + 1) * blk], pattern(blk, j * size + rank, 1))
                 for j in range(size))
        check(ok, f"Alltoall {blk} B blocks at offsets {soff}/{roff}")
        mine = at(soff, blk)
        mine[:] = pattern(blk, rank, 2)
        r[:] = 0
        comm.Allgather(mine, r)
        ok = all(np.array_equal(r[j * blk:(j + 1) * blk], pattern(blk, j, 2)) for j in range(size))
        check(ok, f"Allgather {blk} B blocks at offsets {soff}/{roff}")
        b = at(roff, blk, True)
        b[:] = pattern(blk, 7, 3) if rank == 0 else 0
        comm.Bcast(b, root=0)
        check(np.array_equal(b, pattern(blk, 7, 3)), f"Bcast {blk} B at offset {roff}")
        n = blk // 4
        x = at(soff, n * 4).view(np.int32)
        y = at(roff, n * 4, True).view(np.int32)
        x[:] = np.arange(n, dtype=np.int32) + rank
        y[:] = 0
        comm.Allreduce(x, y, op=MPI.SUM)
        check(np.array_equal(y, np.arange(n, dtype=np.int32) * size + size * (size - 1) // 2),
              f"Allreduce {n * 4} B at offsets {soff}/{roff}")
done("page_offsets")
