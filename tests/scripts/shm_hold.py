"""Sends that run ahead of their receiver on one host: every message
arrives, in order, whatever the receiver waits for first (a message sent
last, by Recv, Probe, an Iprobe loop, Irecv and a Test loop), with two ranks
flooding each other, and with a rendezvous send answered from behind a
flood.  Under erdmampi the receiver keeps at most ERDMA_SHM_UNEXPECTED_MAX
of a local peer's unexpected messages while it waits for nothing (the rest
stays in the peer's ring and its sends wait); a receive, a probe or a send
of its own lifts that bound to ERDMA_UNEXPECTED_MAX, so none of these
waits forever.  Two ranks."""
import os
import tempfile
import time

import numpy as np
from _mpi import MPI, check, done

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
assert comm.Get_size() == 2
peer = 1 - rank
N, SIZE = 1500, 4096                  # 6 MiB: past the ring (2 MiB) and the bound
HOLD = 1 << 20                        # ERDMA_SHM_UNEXPECTED_MAX's default
ERDMA = MPI.__name__.startswith("erdmampi")
if ERDMA:
    from erdmampi.bootstrap import init_world


def flood(dest, tag=1, count=N):
    buf = np.zeros(SIZE, np.uint8)
    for i in range(count):
        buf[:4] = np.frombuffer(i.to_bytes(4, "little"), np.uint8)
        comm.Send(buf, dest=dest, tag=tag)


def drain(source, what, tag=1, count=N):
    buf = np.empty(SIZE, np.uint8)
    for i in range(count):
        comm.Recv(buf, source=source, tag=tag)
        if int.from_bytes(buf[:4].tobytes(), "little") != i:
            check(False, f"{what}: message {i} out of order")
            return


def last_first(wait):
    """Rank 1 floods tag 1, then sends tag 2; rank 0 idles, then waits for
    tag 2 with ``wait`` and receives the flood after it."""
    if rank == 1:
        flood(0)
        comm.Send(np.full(8, 7, np.int64), dest=0, tag=2)
    else:
        before = init_world().stats()["unexpected"] if ERDMA else 0
        time.sleep(0.3)                       # the flood fills up meanwhile
        if ERDMA:                             # what it took in meanwhile
            held = init_world().stats()["unexpected"] - before
            # (the bound is looked at every 64 KiB read from the ring)
            HELD.append(held)
            check(held * SIZE <= HOLD + (64 << 10) + SIZE,
                  f"{wait.__name__}: {held} messages held")
        got = np.zeros(8, np.int64)
        wait(got)
        check(bool((got == 7).all()), f"{wait.__name__}: the last message")
        drain(1, wait.__name__)
    comm.Barrier()


def by_recv(got):
    comm.Recv(got, source=1, tag=2)


def by_probe(got):
    st = MPI.Status()
    comm.Probe(source=1, tag=2, status=st)
    check(st.Get_count(MPI.BYTE) == 64, "Probe: the message's size")
    comm.Recv(got, source=1, tag=2)


def by_iprobe_loop(got):
    deadline = time.monotonic() + 30
    while not comm.Iprobe(source=1, tag=2):
        if time.monotonic() > deadline:
            check(False, "Iprobe loop: no message in 30 s")
            return
    comm.Recv(got, source=1, tag=2)


def by_test_loop(got):
    req = comm.Irecv(got, source=1, tag=2)
    deadline = time.monotonic() + 30
    while not req.Test():
        if time.monotonic() > deadline:
            check(False, "Test loop: no message in 30 s")
            req.Cancel()
            req.Wait()
            return


HELD = []
for wait in (by_recv, by_probe, by_iprobe_loop, by_test_loop):
    last_first(wait)
# (a progress thread that slept through a whole flood took none of it)
check(not ERDMA or rank == 1 or max(HELD) > 0, f"messages held: {HELD}")

# messages as large as the bound (1 MiB goes into the ring whole), one
# received while the next is still coming in
one = np.arange(1 << 18, dtype=np.int32)       # 1 MiB
if rank == 1:
    for k in range(4):
        comm.Send(one + k, dest=0, tag=4)
else:
    time.sleep(0.2)
    got = np.zeros_like(one)
    for k in range(4):
        comm.Recv(got, source=1, tag=4)
        check(bool((got == one + k).all()), f"1 MiB message {k}")
comm.Barrier()

# buffered sends complete without the receiver, even one outside MPI: rank
# 1 Bsends 4 MiB, then says so through a file that rank 0 waits for
# without calling MPI
path = comm.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
flag = os.path.join(path, "bsends-done")
m8 = np.zeros(1024, np.float64)                # 8 KiB
if rank == 1:
    MPI.Attach_buffer(bytearray(512 * (m8.nbytes + MPI.BSEND_OVERHEAD)))
    for k in range(512):
        comm.Bsend(m8, dest=0, tag=6)
    open(flag, "w").close()
else:
    deadline = time.monotonic() + 30
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    check(os.path.exists(flag), "Bsend: the sender waited for its receiver")
    for k in range(512):
        comm.Recv(m8, source=1, tag=6)
comm.Barrier()
if rank == 1:
    MPI.Detach_buffer()
else:
    os.remove(flag) if os.path.exists(flag) else None
    os.rmdir(path)

# both ranks flood each other before either receives
flood(peer)
drain(peer, "head to head")
comm.Barrier()

# a rendezvous send (past the eager limit) whose answer comes from a rank
# that floods this one first
big = np.arange(1 << 20, dtype=np.int32)      # 4 MiB
if rank == 0:
    comm.Send(big, dest=1, tag=3)
    drain(1, "rendezvous behind a flood")
else:
    flood(0)
    out = np.zeros_like(big)
    comm.Recv(out, source=0, tag=3)
    check(bool((out == big).all()), "rendezvous behind a flood: its data")
comm.Barrier()

# back-to-back rooted collectives: the root falls behind and catches up
blk = np.full(1024, rank, np.float32)
whole = np.zeros(2048, np.float32)
for i in range(3000):
    comm.Gather(blk, whole, root=0)
    comm.Bcast(blk, root=1)
check(rank == 1 or bool((whole[1024:] == 1).all()), "Gather after 3000 calls")
check(bool((blk == 1).all()), "Bcast after 3000 calls")

done("shm_hold")
