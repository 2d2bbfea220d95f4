"""Topologies and inter-communicators: what the upstream suite leaves out
(neighbour order on small periodic grids, multigraphs, inter-communicator
ranks, merge order, non-commutative inter-communicator reductions)."""
import numpy as np

from _mpi import MPI, check, done, raises

w = MPI.COMM_WORLD
r, n = w.Get_rank(), w.Get_size()

# a periodic ring: the block from the left neighbour comes first, even when
# both neighbours are one process (n = 1, 2)
cart = w.Create_cart([n], [True])
got = np.full(2, -1, "i")
cart.Neighbor_alltoall(np.array([10 * r + 1, 10 * r + 2], "i"), got)   # [to left, to right]
left, right = (r - 1) % n, (r + 1) % n
check(got.tolist() == [10 * left + 2, 10 * right + 1], f"cart alltoall order {got}")
check(cart.neighbor_allgather(r) == [left, right], "cart neighbor_allgather")
line = w.Create_cart([n], [False])
objs = line.neighbor_allgather(r)
check(objs == [r - 1 if r else None, r + 1 if r < n - 1 else None], f"line ends {objs}")
check(line.Shift(0, 1) == (r - 1 if r else MPI.PROC_NULL, r + 1 if r < n - 1 else MPI.PROC_NULL),
      "line shift")

# a multigraph: every process lists rank 0 twice; messages pair up in order
dests = [i for i in range(n) for _ in range(2)] if r == 0 else []
dg = w.Create_dist_graph_adjacent([0, 0], dests)
out = dg.neighbor_alltoall([("to", i, k) for i in range(n) for k in range(2)] if r == 0 else [])
check(out == [("to", r, 0), ("to", r, 1)], f"multigraph order {out}")
dg.Free()

check(raises(MPI.ERR_TOPOLOGY, w.Create_dist_graph_adjacent, [r], [r], None, [1]),
      "weights on one side only")
check(MPI.Cartcomm(MPI.COMM_NULL) == MPI.COMM_NULL, "null Cartcomm")
check(type(w.Create_cart([0])) is MPI.Cartcomm, "empty grid type")

if n >= 2:
    low = r < n // 2
    local = w.Split(0 if low else 1, r)
    ic = local.Create_intercomm(0, w, n // 2 if low else 0, 11)
    check(ic.Is_inter() and ic.Get_remote_size() == (n - n // 2 if low else n // 2), "sizes")
    # point-to-point: ranks name the remote group, statuses too
    st = MPI.Status()
    if ic.rank == 0:
        ic.send(r, dest=0, tag=5)
        got = ic.recv(source=MPI.ANY_SOURCE, tag=5, status=st)
        check(got == (n // 2 if low else 0) and st.Get_source() == 0, "inter p2p")
        check(raises(MPI.ERR_RANK, ic.Send, np.zeros(1), ic.Get_remote_size()), "remote rank")
    # non-commutative reduction over the remote group, in rank order
    cat = ic.allreduce(str(r), op=lambda a, b: a + b)
    remote = range(n // 2, n) if low else range(n // 2)
    check(cat == "".join(str(i) for i in remote), f"inter allreduce order {cat}")
    # merge: high=False first; equal flags: the group created first in order
    check(ic.Merge(not low).Get_rank() == r, "merge low first")
    check(ic.Merge(low).Get_rank() == (r - n // 2 if not low else r + n - n // 2), "merge high")
    check(ic.Merge().Get_rank() == r, "merge same flag")
    d = ic.Dup()
    check(MPI.Comm.Compare(d, ic) == MPI.CONGRUENT and d.Get_remote_size() == ic.remote_size,
          "dup")
    half = ic.Split(0 if ic.rank == 0 else MPI.UNDEFINED)
    check((half.Get_remote_size() == 1) if ic.rank == 0 else half == MPI.COMM_NULL, "split")
    check(type(half) is MPI.Intercomm, "split type")
    x = np.zeros(3, "d")
    ic.Bcast(x if not low else np.arange(3.0),
             root=(MPI.ROOT if ic.rank == 0 else MPI.PROC_NULL) if low else 0)
    check(low or x.tolist() == [0.0, 1.0, 2.0], "Bcast ROOT")
    check(raises(MPI.ERR_ROOT, ic.Bcast, x, ic.Get_remote_size()), "bad root")
done("topo_inter")
