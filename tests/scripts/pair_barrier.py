"""Barrier's semantics where two ranks of one host agree to use flags in
shared memory (erdma_pair_*): no rank leaves before the other entered, on
the first Barriers (by messages) and the later ones (by flags), on many
communicators made and freed (more than the slots), on communicators never
freed (the slots run out: messages again), a message sent before a Barrier
found by Iprobe and Test after it, through a second object of the
same communicator on one rank only, with one rank on the Python algorithm,
between nonblocking Barriers and other collectives, and from two threads on
two communicators at once.  Run at 2 ranks (flags) and 3 (messages), and
against mpi4py."""
import os
import time

import numpy as np

from _mpi import MPI, check, done, on_two_comms

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
REFERENCE = os.environ.get("ERDMA_REFERENCE") == "mpi4py"
LATE = 0.02   # how long the late rank sleeps before entering


def pair_on(c):
    """Whether erdmampi agreed on flags for c's Barriers (None: not erdmampi)."""
    if REFERENCE or c.Get_size() != 2:
        return None
    from erdmampi._commrt import _rt
    from erdmampi._engine import lib
    peer = c._ranks[1 - c.Get_rank()]
    return lib.erdma_pair_find(_rt.engine._h, peer, c._ctx + 1) >= 0


def waits_for_late(c, rounds, what, barrier=None):
    """In each round one rank (in turn) sleeps LATE, then enters the Barrier;
    no rank may leave it before that (times of CLOCK_MONOTONIC, which the
    processes of one host share, compared afterwards)."""
    barrier = barrier or c.Barrier
    me = c.Get_rank()
    stamps = []
    for i in range(rounds):
        late = i % c.Get_size()
        c.Barrier()
        if me == late:
            time.sleep(LATE)
            stamps.append(time.monotonic())
            barrier()
        else:
            barrier()
            stamps.append(time.monotonic())
    every = c.allgather(stamps)
    for i in range(rounds):
        late = i % c.Get_size()
        if me != late:
            ahead = every[late][i] - stamps[i]
            check(ahead <= 0, f"{what}: round {i} left {ahead * 1e3:.2f} ms "
                              f"before rank {late} entered")


# the first Barriers go by messages, the later ones by flags
waits_for_late(comm, 8, "world")
check(pair_on(comm) in (None, True, False), "pair_on")
if size == 2 and not REFERENCE:
    check(pair_on(comm), "two ranks of one host did not agree on flags")

# many communicators, each freed: more than the 128 slots, reused in turn
for k in range(160):
    d = comm.Dup()
    for _ in range(3):
        d.Barrier()
    if k % 40 == 0:
        waits_for_late(d, 2, f"dup {k}")
    d.Free()

# communicators never freed fill the slots: a new one goes by messages
kept = [comm.Dup() for _ in range(140)]
for d in kept:
    d.Barrier()
    d.Barrier()
    d.Barrier()
last = comm.Dup()
waits_for_late(last, 6, "after the slots ran out")
if size == 2 and not REFERENCE:
    check(not pair_on(last), "a pair agreed with every slot taken")
for d in kept:
    d.Free()
last.Free()
fresh = comm.Dup()
waits_for_late(fresh, 6, "after the slots were freed")
if size == 2 and not REFERENCE:
    check(pair_on(fresh), "no pair agreed once slots were free again")

# a second object of the same communicator, on rank 0 only
alias = MPI.Intracomm(fresh) if rank == 0 else fresh
waits_for_late(fresh, 3, "original")
waits_for_late(alias, 6, "second object on rank 0")

# rank 0 on the Python algorithm (an ERDMA_COLL_BARRIER override), rank 1 in C
if rank == 0:
    os.environ["ERDMA_COLL_BARRIER"] = "dissemination"
waits_for_late(fresh, 6, "Python path on rank 0")
if rank == 0:
    del os.environ["ERDMA_COLL_BARRIER"]

# what a rank sent before a Barrier is there after it: Iprobe finds it, the
# Test of a receive posted before sees it done (a Barrier by flags drains no
# ring, so probes and tests read the rings themselves)
for i in range(40):
    got = np.full(4, -1, np.int64)
    req = fresh.Irecv(got, source=0, tag=77) if rank == 1 and i % 2 else None
    if rank == 0:
        fresh.Send(np.full(4, i, np.int64), dest=1, tag=77)
    fresh.Barrier()
    if rank == 1:
        if req is None:
            check(fresh.Iprobe(source=0, tag=77), f"Iprobe after Barrier {i}")
            fresh.Recv(got, source=0, tag=77)
        else:
            check(req.Test(), f"Test after Barrier {i}")
            req.Wait()
        check((got == i).all(), f"sent before Barrier {i}")
    fresh.Barrier()

# nonblocking Barriers and other collectives in between
for i in range(20):
    fresh.Barrier()
    r = fresh.Ibarrier()
    x = fresh.bcast(i if rank == 0 else None, root=0)
    check(x == i, f"bcast {i}")
    r.Wait()
    fresh.Barrier()
waits_for_late(fresh, 4, "after Ibarrier")

# two threads, two communicators
on_two_comms(comm, lambda c, what: waits_for_late(c, 10, what))
fresh.Free()
done("pair_barrier")
