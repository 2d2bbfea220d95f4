"""Blocking Send/Recv of plain arrays (the lean path): data, statuses, errors."""
import numpy as np
from _mpi import MPI, check, done, raises

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

for c in (MPI.COMM_SELF, comm):
    r, n = c.Get_rank(), c.Get_size()
    peer = (r + 1) % n
    src = (r - 1) % n
    for dt in ("d", "i", "q", "F", "?"):
        s = (np.arange(6) + r).astype(dt).reshape(2, 3)
        d = np.zeros((2, 3), dt)
        st = MPI.Status()
        st.Set_error(MPI.ERR_OTHER)          # Recv leaves MPI_ERROR alone
        if n == 1:                           # MPICH's Send to self waits for the Recv
            rq = c.Isend(s, 0, 7)
            c.Recv(d, 0, 7, st)
            rq.Wait()
            d2 = np.zeros((2, 3), dt)
            rq = c.Irecv(d2, 0, 7)
            c.Send(s, 0, 7)
            rq.Wait()
            check(np.array_equal(d2, d), f"Send {dt}")
        elif r % 2 == 0:
            c.Send(s, peer, 7)
            c.Recv(d, src, 7, st)
        else:
            c.Recv(d, src, 7, st)
            c.Send(s, peer, 7)
        check(np.array_equal(d, (np.arange(6) + src).astype(dt).reshape(2, 3)), f"data {dt}")
        check((st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE), st.Get_error())
              == (src, 7, s.nbytes, MPI.ERR_OTHER), f"status {dt}")
    # Ssend then Recv without a status, ANY_SOURCE / ANY_TAG
    out = np.zeros(3, "l")
    if n == 1:
        rq = c.Irecv(out, MPI.ANY_SOURCE, MPI.ANY_TAG)
        c.Ssend(np.array([5, 6, 7], "l"), 0, 3)
        rq.Wait()
    else:
        rq = c.Isend(np.array([5, 6, 7], "l"), peer, 3)
        c.Recv(out, MPI.ANY_SOURCE, MPI.ANY_TAG)
        rq.Wait()
    check(out.tolist() == [5, 6, 7], "ANY_SOURCE Recv")
    # truncation: the error class, the status it leaves
    big = np.arange(4.0)
    small = np.zeros(2)
    rq = c.Isend(big, peer, 4)
    st = MPI.Status()
    check(raises(MPI.ERR_TRUNCATE, c.Recv, small, src, 4, st), "Recv truncates")
    check((st.Get_source(), st.Get_tag()) == (src, 4), f"truncated status {st.source} {st.tag}")
    rq.Wait()
    c.Barrier()
    # PROC_NULL
    st = MPI.Status()
    c.Recv(np.zeros(2), MPI.PROC_NULL, 1, st)
    check((st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)) == (MPI.PROC_NULL, MPI.ANY_TAG, 0),
          "PROC_NULL status")
    c.Send(np.zeros(2), MPI.PROC_NULL)
    # bad arguments are checked with a plain array too
    check(raises(MPI.ERR_RANK, c.Send, np.zeros(2), n, 0), "Send bad rank")
    check(raises(MPI.ERR_TAG, c.Send, np.zeros(2), peer, -5), "Send bad tag")
    check(raises(MPI.ERR_RANK, c.Recv, np.zeros(2), n + 3, 0), "Recv bad rank")
    ro = np.zeros(2)
    ro.flags.writeable = False
    try:
        c.Recv(ro, peer, 0)
        check(False, "Recv into a read-only array")
    except BufferError:
        pass
    c.Barrier()

done("p2p_fast")
