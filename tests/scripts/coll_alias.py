"""A collective whose send and receive buffers start at the same address
fails with ERR_BUFFER as under MPICH ("Buffers must not be aliased"), on
every path (the one-call C path, the Python algorithms, nonblocking);
MPI.IN_PLACE, a count of 0 and buffers apart do not.  The rooted calls fail
at the root only, as there.  Two ranks or more; the same script holds for
mpi4py + MPICH."""
import numpy as np
from _mpi import MPI, check, done, raises

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ERR_BUFFER = MPI.ERR_BUFFER

for n in (4, 4096, 100000):                     # the one-call path, the pair, the algorithms
    a = np.ones(n * size, np.int32)
    k = n
    check(raises(ERR_BUFFER, comm.Allreduce, a, a), f"Allreduce {n}")
    check(raises(ERR_BUFFER, comm.Allreduce, [a, MPI.INT], [a, MPI.INT]),
          f"Allreduce [a, INT] {n}")
    check(raises(ERR_BUFFER, comm.Allreduce, a[:k], a[:k]), f"Allreduce of views {n}")
    check(raises(ERR_BUFFER, lambda: comm.Iallreduce(a, a).Wait()), f"Iallreduce {n}")
    check(raises(ERR_BUFFER, comm.Alltoall, a, a), f"Alltoall {n}")
    # (Allgather: the send buffer where this rank's block of the receive buffer is)
    check(raises(ERR_BUFFER, comm.Allgather, a[rank * k:(rank + 1) * k], a), f"Allgather {n}")
    check(raises(ERR_BUFFER, comm.Reduce_scatter_block, a, a[:k]),
          f"Reduce_scatter_block {n}")
    check(raises(ERR_BUFFER, comm.Scan, a[:k], a[:k]), f"Scan {n}")
    check(raises(ERR_BUFFER, comm.Exscan, a[:k], a[:k]), f"Exscan {n}")
    # and the communicator still works: apart, in place, empty
    b = np.zeros_like(a)
    comm.Allreduce(a, b)
    check(bool((b == size).all()), f"Allreduce apart after the errors {n}")
    comm.Allreduce(MPI.IN_PLACE, a)
    check(bool((a == size).all()), f"Allreduce IN_PLACE {n}")
    comm.Allreduce(a[:0], a[:0])
    comm.Allgather(np.full(k, rank, np.int32), b)
    check(bool((b == np.repeat(np.arange(size), k)).all()), f"Allgather apart {n}")

# rooted: the root fails, the others' part completes (a communicator of its own)
c = comm.Dup()
a = np.ones(8 * size, np.int32)
if rank == 0:
    check(raises(ERR_BUFFER, c.Reduce, a, a, root=0), "Reduce at the root")
else:
    c.Reduce(a, None, root=0)
c2 = comm.Dup()
if rank == 0:
    check(raises(ERR_BUFFER, c2.Gather, a[:8], a, root=0), "Gather at the root")
else:
    c2.Gather(a[:8], None, root=0)
comm.Barrier()
done("coll_alias")
