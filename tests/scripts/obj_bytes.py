"""Object collectives as one message per pickle: every collective with small
objects, large ones (1 MB, from every rank), NumPy arrays pickled with
out-of-band buffers, every root; also run over QUIC (ERDMA_SHM=0) and
against mpi4py (ERDMA_REFERENCE=mpi4py)."""
import numpy as np
from _mpi import MPI, check, done

w = MPI.COMM_WORLD
r, n = w.Get_rank(), w.Get_size()


def mine(rank, kind):
    if kind == "small":
        return {"rank": rank, "x": [rank] * 3}
    if kind == "large":
        return bytes([rank % 251]) * (1 << 20)
    return np.arange(50_000, dtype=np.float64) + rank      # out-of-band buffers


def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


for comm in (w, w.Split(r % 2, -r)):
    cr, cn = comm.Get_rank(), comm.Get_size()
    for kind in ("small", "large", "array"):
        for root in range(cn):
            got = comm.bcast(mine(cr, kind) if cr == root else None, root)
            check(same(got, mine(root, kind)), f"bcast {kind} root {root}")
            got = comm.gather(mine(cr, kind), root)
            check(cr != root and got is None or cr == root and len(got) == cn and all(
                same(g, mine(i, kind)) for i, g in enumerate(got)), f"gather {kind} {root}")
            got = comm.scatter([mine(i + root, kind) for i in range(cn)] if cr == root
                               else None, root)
            check(same(got, mine(cr + root, kind)), f"scatter {kind} {root}")
        got = comm.allgather(mine(cr, kind))
        check(all(same(g, mine(i, kind)) for i, g in enumerate(got)), f"allgather {kind}")
        got = comm.alltoall([mine(cr * 10 + j, kind) for j in range(cn)])
        check(all(same(g, mine(i * 10 + cr, kind)) for i, g in enumerate(got)),
              f"alltoall {kind}")
    check(comm.allreduce(cr) == cn * (cn - 1) // 2, "allreduce")
    check(comm.reduce([cr], root=cn - 1) == (list(range(cn)) if cr == cn - 1 else None),
          "reduce lists")
    # a broadcast object is a fresh copy on the root too
    o = [1, 2]
    check(comm.bcast(o, 0) is not o or cn == 0, "bcast copies")
    if comm is not w:
        comm.Free()
# p2p objects around them: the same ordering rules
if n > 1:
    peer, src = (r + 1) % n, (r - 1) % n
    w.send(("a", r), peer, 5)              # small: at once (eager)
    q = w.isend(mine(r, "large"), peer, 5)  # large: waits for its receive
    w.send(("b", r), peer, 5)
    check(w.recv(source=src, tag=5) == ("a", src), "p2p order 1")
    check(w.recv(source=src, tag=5) == mine(src, "large"), "p2p order 2")
    check(w.recv(source=src, tag=5) == ("b", src), "p2p order 3")
    q.wait()
    check(w.sendrecv(r, peer, 6, source=src, recvtag=6) == src, "sendrecv")
w.barrier()
done("obj_bytes")
