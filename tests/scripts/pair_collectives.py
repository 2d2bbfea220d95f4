"""Bcast's, Allgather's and Alltoall's semantics where two ranks of one host
hold small ones by flags in shared memory (erdma_pair_put / _share / _take,
up to PAIR_DATA_MAX bytes): every size around the limit, both roots, a rank that
runs ahead of a slow peer, a root's Bcasts of sizes for the slot's lines
and its areas back to back, in place, between Barriers, pickled bcasts,
Ibcast, Iallgather and Allreduce, through a second object of the
communicator on one rank only, with one rank on the Python algorithm or a
strided datatype while the other is in C, a read-only root buffer, a
communicator freed as soon as its call returns while the peer is late, and
from two threads on two communicators.  Run at 2 ranks (flags) and 3 (messages),
and against mpi4py."""
import os
import time

import numpy as np

from _mpi import MPI, check, done, on_two_comms

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
REFERENCE = os.environ.get("ERDMA_REFERENCE") == "mpi4py"
# around the limits: 48 bytes share the first line with the count, 112 fit
# the slot's lines, PAIR_DATA_MAX (8 KiB) its areas
SIZES = [1, 2, 7, 8, 16, 24, 47, 48, 49, 64, 100, 111, 112, 113, 128, 1000, 4096, 8191, 8192,
         8193]
# one root's Bcasts back to back, lines and areas in turn, and a run of
# areas longer than a slot has (a root may run up to three areas ahead of
# its receiver, but into its line only once the receiver took everything)
MIXED = [5000, 50, 8192, 112, 113, 3000, 1, 8000, 7000, 6000, 5000, 4000, 3000, 2000, 1000, 200, 16]


def pair_on(c):
    """Whether erdmampi agreed on flags for c (None: not erdmampi, or not 2 ranks)."""
    if REFERENCE or c.Get_size() != 2:
        return None
    from erdmampi._commrt import _rt
    from erdmampi._engine import lib
    return lib.erdma_pair_find(_rt.engine._h, c._ranks[1 - c.Get_rank()], c._ctx + 1) >= 0


def pattern(nbytes, i, root):
    return np.random.default_rng([nbytes, i, root]).integers(0, 256, nbytes, dtype=np.uint8)


def gathers(c, what, count=40, slow_every=0):
    """``count`` Allgathers of every block size (every other one in place);
    every rank checks every byte.  ``slow_every``: one rank (in turn)
    sleeps before every such call, so that the other runs ahead."""
    me, n = c.Get_rank(), c.Get_size()
    for blk in SIZES:
        for i in range(count):
            want = np.concatenate([pattern(blk, i, r) for r in range(n)])
            if slow_every and i % slow_every == 0 and me == (i // slow_every) % n:
                time.sleep(0.002)
            r = np.zeros(blk * n, np.uint8)
            if i % 2:
                r[me * blk:(me + 1) * blk] = pattern(blk, i, me)
                c.Allgather(MPI.IN_PLACE, r)
            else:
                c.Allgather(pattern(blk, i, me), r)
            if not np.array_equal(r, want):
                check(False, f"{what}: Allgather {blk} B a block, round {i}: wrong bytes")
                return


# Alltoall's blocks from 8 KiB to 2 MiB: their addresses by flags, the
# bytes read with CMA (ERDMA_PAIR_CMA_MAX), beyond by messages
A2A_BIG = [8193, 65536, 300001, (2 << 20) - 1, 2 << 20, (2 << 20) + 1]


def alltoalls(c, what, count=20, slow_every=0, big=A2A_BIG):
    """``count`` Alltoalls of every block size (every other one in place),
    as gathers; the large sizes fewer times."""
    me, n = c.Get_rank(), c.Get_size()
    for blk in SIZES + big:
        for i in range(count if blk <= 8192 else min(count, 4)):
            want = np.concatenate([pattern(blk, i * n + me, r) for r in range(n)])
            if slow_every and i % slow_every == 0 and me == (i // slow_every) % n:
                time.sleep(0.002)
            s = np.concatenate([pattern(blk, i * n + r, me) for r in range(n)])
            if i % 2:
                c.Alltoall(MPI.IN_PLACE, s)
                r = s
            else:
                r = np.zeros(blk * n, np.uint8)
                c.Alltoall(s, r)
            if not np.array_equal(r, want):
                check(False, f"{what}: Alltoall {blk} B a block, round {i}: wrong bytes")
                return


def rounds(c, what, count=60, slow_every=0, buf_of=None):
    """``count`` Bcasts of every size, the root turning; the receivers check
    every byte.  ``slow_every``: a receiver sleeps before every such call,
    so that the root runs ahead and must wait for its last bytes to be taken."""
    me, n = c.Get_rank(), c.Get_size()
    for nbytes in SIZES:
        for i in range(count):
            root = i % n
            want = pattern(nbytes, i, root)
            buf = want.copy() if me == root else np.zeros(nbytes, np.uint8)
            if slow_every and me != root and i % slow_every == 0:
                time.sleep(0.002)
            if buf_of is not None:
                buf_of(buf, root)
            else:
                c.Bcast(buf, root=root)
            if me != root and not np.array_equal(buf, want):
                check(False, f"{what}: {nbytes} B, round {i}, root {root}: wrong bytes")
                return


def mixed(c, what, count=30):
    """Each rank in turn roots ``count`` runs of the MIXED sizes back to
    back while a receiver sleeps now and then; after each run an Allgather
    of 3000-byte blocks (which waits for the receiver to take everything)."""
    me, n = c.Get_rank(), c.Get_size()
    for root in range(n):
        for i in range(count):
            for k, nbytes in enumerate(MIXED):
                want = pattern(nbytes, i * 100 + k, root)
                buf = want.copy() if me == root else np.zeros(nbytes, np.uint8)
                if me != root and (i * len(MIXED) + k) % 7 == 0:
                    time.sleep(0.001)
                c.Bcast(buf, root=root)
                if me != root and not np.array_equal(buf, want):
                    check(False, f"{what}: run {i}, {nbytes} B after {MIXED[k - 1]} B, "
                                 f"root {root}: wrong bytes")
                    return
            r = np.zeros(3000 * n, np.uint8)
            c.Allgather(pattern(3000, i, me), r)
            if not np.array_equal(r, np.concatenate([pattern(3000, i, k) for k in range(n)])):
                check(False, f"{what}: Allgather after run {i}, root {root}: wrong bytes")
                return


comm.Barrier()
comm.Barrier()
comm.Barrier()
if size == 2 and not REFERENCE:
    check(pair_on(comm), "two ranks of one host did not agree on flags")

rounds(comm, "world")
rounds(comm, "slow receiver", count=30, slow_every=3)
gathers(comm, "world")
gathers(comm, "one rank late", count=30, slow_every=3)
mixed(comm, "mixed sizes")
alltoalls(comm, "world")
alltoalls(comm, "one rank late", count=16, slow_every=3)

# float64 and int32 arrays, as [buffer, datatype]
for count in (1, 3, 6, 7):
    for root in range(size):
        a = np.arange(count, dtype=np.float64) + 0.5 * root if rank == root else np.zeros(count)
        comm.Bcast([a, MPI.DOUBLE], root=root)
        check(np.array_equal(a, np.arange(count) + 0.5 * root), f"float64 x{count} root {root}")
        b = np.arange(count, dtype=np.int32) * (root + 2) if rank == root else np.zeros(count, np.int32)
        comm.Bcast([b, MPI.INT], root=root)
        check(np.array_equal(b, np.arange(count) * (root + 2)), f"int32 x{count} root {root}")

# between other collectives, blocking and not
fresh = comm.Dup()
for i in range(40):
    fresh.Barrier()
    v = np.full(4, i if rank == 0 else -1, np.int32)
    fresh.Bcast(v, root=0)
    check((v == i).all(), f"mixed Bcast {i}")
    r = fresh.Ibcast(w := np.full(2, i if rank == size - 1 else -1, np.int64), root=size - 1)
    x = fresh.bcast({"i": i} if rank == 0 else None, root=0)
    check(x == {"i": i}, f"mixed bcast {i}")
    r.Wait()
    check((w == i).all(), f"mixed Ibcast {i}")
    s = np.zeros(1, np.int64)
    fresh.Allreduce(np.array([i], np.int64), s)
    check(s[0] == i * size, f"mixed Allreduce {i}")
    u = np.full(3, i if rank == size - 1 else -1, np.int16)
    fresh.Bcast(u, root=size - 1)
    check((u == i).all(), f"mixed Bcast back {i}")
    ag = np.zeros(2 * size, np.int32)
    ir = fresh.Iallgather(np.array([i, rank], np.int32), ag)
    g = np.zeros(size, np.float64)
    fresh.Allgather(np.array([i + rank / 10]), g)
    check(np.allclose(g, [i + k / 10 for k in range(size)]), f"mixed Allgather {i}")
    ir.Wait()
    check(ag.tolist() == sum(([i, k] for k in range(size)), []), f"mixed Iallgather {i}")

# a second object of the same communicator, on rank 0 only
alias = MPI.Intracomm(fresh) if rank == 0 else fresh
rounds(alias, "second object on rank 0", count=6)
gathers(MPI.Intracomm(fresh) if rank == 0 else fresh, "Allgather, second object on rank 0",
        count=4)
alltoalls(MPI.Intracomm(fresh) if rank == 0 else fresh, "Alltoall, second object on rank 0",
          count=4)

# rank 0 on the Python algorithm (an ERDMA_COLL_BCAST override), the others in C
if rank == 0:
    os.environ["ERDMA_COLL_BCAST"] = "binomial"
rounds(fresh, "Python path on rank 0", count=6)
if rank == 0:
    del os.environ["ERDMA_COLL_BCAST"]
    os.environ["ERDMA_COLL_ALLGATHERV"] = "direct"
gathers(fresh, "Allgather, Python path on rank 0", count=6)
if rank == 0:
    del os.environ["ERDMA_COLL_ALLGATHERV"]
    os.environ["ERDMA_COLL_ALLTOALL"] = "pairwise"
# (two ranks, up to 2 MiB: beyond, and at three ranks, the override's messages would
# not meet the others' bulk algorithm)
alltoalls(fresh, "Alltoall, Python path on rank 0", count=6,
          big=A2A_BIG[:4] if size == 2 else [])
if rank == 0:
    del os.environ["ERDMA_COLL_ALLTOALL"]

# a strided datatype on rank 0 (the Python path), a contiguous buffer elsewhere
vec = MPI.DOUBLE.Create_vector(5, 1, 2).Commit()
for root in range(size):
    if rank == 0:
        b2 = np.zeros((5, 2))
        if rank == root:
            b2[:, 0] = np.arange(5) + root
        fresh.Bcast([b2, 1, vec], root=root)
        got = b2[:, 0]
    else:
        got = np.arange(5.0) + root if rank == root else np.zeros(5)
        fresh.Bcast([got, MPI.DOUBLE], root=root)
    check(np.array_equal(got, np.arange(5) + root), f"strided on rank 0, root {root}")
vec.Free()

# a read-only buffer at the root
for root in range(size):
    ro = np.arange(6, dtype=np.int32) * (root + 1)
    if rank == root:
        ro.flags.writeable = False
        fresh.Bcast(ro, root=root)
    else:
        got = np.zeros(6, np.int32)
        fresh.Bcast(got, root=root)
        check(np.array_equal(got, ro), f"read-only root {root}")

# a communicator freed as soon as its Bcast or Allgather by flags returns,
# the peer late (Free must not take the bytes from under it); more rounds
# than a rank has slots, so slots freed that way are reused
for i in range(140):
    root, late = i % size, (i // 2) % size
    d = comm.Dup()
    d.Barrier()
    d.Barrier()     # (the one that agrees: the first remembers the call)
    if pair_on(d) is False:     # (every round: freed slots are reused)
        check(False, f"round {i}: a fresh Dup did not agree on flags at its second Barrier")
    want = pattern(24, i, root)
    buf = want.copy() if rank == root else np.zeros(24, np.uint8)
    if rank == late and i % 3:
        time.sleep(0.002)
    d.Bcast(buf, root=root)
    d.Free()
    check(np.array_equal(buf, want), f"Bcast then Free, round {i}: wrong bytes")
    d = comm.Dup()
    d.Barrier()
    d.Barrier()
    r = np.zeros(8 * size, np.uint8)
    if rank == late and i % 3:
        time.sleep(0.002)
    d.Allgather(pattern(8, i, rank), r)
    d.Free()
    check(np.array_equal(r, np.concatenate([pattern(8, i, k) for k in range(size)])),
          f"Allgather then Free, round {i}: wrong bytes")

# two threads, two communicators
on_two_comms(comm, lambda c, what: (rounds(c, what, count=10), gathers(c, what, count=6),
                                    alltoalls(c, what, count=4)))
fresh.Free()
done("pair_collectives")
