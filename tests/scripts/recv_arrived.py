"""Blocking receives of messages that arrived before the receive was called
(erdmampi takes those from the unexpected queue without a request): the
bytes, the status, truncation, order among a rendezvous message and eager
ones, ANY_SOURCE / ANY_TAG, and the rooted collectives whose blocks arrive
first.  Two ranks or more; rank 1 sends to rank 0."""
import numpy as np
from _mpi import MPI, check, done

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

if rank == 1:
    comm.Send(np.arange(100, dtype=np.int32), dest=0, tag=1)          # exact
    comm.Send(np.arange(100, dtype=np.int32), dest=0, tag=2)          # truncated
    big = np.arange(1 << 20, dtype=np.int32)                          # 4 MiB: rendezvous
    req = comm.Isend(big, dest=0, tag=3)
    comm.Send(np.full(4, 9, np.int32), dest=0, tag=4)                 # eager, behind it
    comm.Send(np.full(8, 5, np.int8), dest=0, tag=5)
    comm.Barrier()
    req.Wait()
elif rank == 0:
    comm.Barrier()                   # everything sent before any receive is called
    st = MPI.Status()
    a = np.zeros(100, np.int32)
    comm.Recv(a, source=1, tag=1, status=st)
    check(bool((a == np.arange(100)).all()), "exact: the bytes")
    check((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT)) == (1, 1, 100),
          f"exact: the status {(st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT))}")
    small = np.zeros(10, np.int32)
    try:
        comm.Recv(small, source=1, tag=2)
        check(False, "truncated: no error")
    except MPI.Exception as e:
        check(e.Get_error_class() == MPI.ERR_TRUNCATE, f"truncated: class {e.Get_error_class()}")
    # (what the buffer holds after a truncation is undefined: MPICH leaves it)
    # ANY_TAG takes the rendezvous message first: it was sent first
    got = np.zeros(1 << 20, np.int32)
    comm.Recv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
    check(st.Get_tag() == 3 and bool((got == np.arange(1 << 20)).all()),
          f"in order: tag {st.Get_tag()} first")
    four = np.zeros(4, np.int32)
    comm.Recv(four, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
    check(st.Get_tag() == 4 and st.Get_source() == 1 and bool((four == 9).all()),
          "in order: tag 4 second")
    eight = np.zeros(8, np.int8)
    comm.Recv(eight, source=1, tag=MPI.ANY_TAG, status=st)
    check(st.Get_tag() == 5 and bool((eight == 5).all()), "in order: tag 5 last")
else:
    comm.Barrier()
comm.Barrier()

# rooted collectives whose blocks are all there before the root calls
blk = np.full(256, rank + 1, np.float32)
whole = np.zeros(256 * size, np.float32)
for k in range(50):
    if k % 10 == 0:
        comm.Barrier()
    comm.Gather(blk + k, whole, root=0)
    if rank == 0:
        want = np.repeat(np.arange(1, size + 1, dtype=np.float32), 256) + k
        if not (whole == want).all():
            check(False, f"Gather {k}")
            break
    b = np.full(64, k if rank == 0 else -1, np.int64)
    comm.Bcast(b, root=0)
    if not (b == k).all():
        check(False, f"Bcast {k}")
        break

done("recv_arrived")
