"""Comm's blocking calls however they are called: positional, by keyword,
with defaults, unbound through the class, from a subclass through super(),
with a Status, after repeated calls with the same buffers; errors and wrong
argument counts as mpi4py's."""
import numpy as np
from _mpi import MPI, check, done, raises

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
peer, src = (rank + 1) % size, (rank - 1) % size


class Counting(MPI.Intracomm):
    """A subclass whose Send and Bcast count their calls, then call the base."""

    sends = bcasts = 0

    def Send(self, buf, dest, tag=0):
        type(self).sends += 1
        return super().Send(buf, dest, tag)

    def Bcast(self, buf, root=0):
        type(self).bcasts += 1
        return super().Bcast(buf, root)


def ring(c, send, recv, tag=0):
    """Send to the next rank and receive from the previous one with
    send(buf, dest) / recv(buf, source), the even ranks sending first (one
    rank: the receive posted first, by Irecv from tag ``tag``)."""
    s = np.arange(4, dtype="i") + c.Get_rank()
    d = np.zeros(4, "i")
    if c.Get_size() == 1:
        rq = c.Irecv(d, 0, tag)
        send(s, 0)
        rq.Wait()
        ok = np.array_equal(d, s)
        d[:] = 0
        rq = c.Isend(s, 0, tag)
        recv(d, 0)
        rq.Wait()
        return ok and np.array_equal(d, s)
    elif c.Get_rank() % 2 == 0:
        send(s, (c.Get_rank() + 1) % c.Get_size())
        recv(d, (c.Get_rank() - 1) % c.Get_size())
    else:
        recv(d, (c.Get_rank() - 1) % c.Get_size())
        send(s, (c.Get_rank() + 1) % c.Get_size())
    return np.array_equal(d, np.arange(4, dtype="i") + (c.Get_rank() - 1) % c.Get_size())


for c in (MPI.COMM_SELF, comm):
    n = c.Get_size()
    for k in range(3):      # the first call learns the buffers, the next ones hit
        check(ring(c, lambda b, d: c.Send(b, d), lambda b, s: c.Recv(b, s)), f"defaults {k}")
        check(ring(c, lambda b, d: c.Send(b, d, 5), lambda b, s: c.Recv(b, s, 5), 5),
              f"positional {k}")
        check(ring(c, lambda b, d: c.Send(buf=b, dest=d, tag=6),
                   lambda b, s: c.Recv(buf=b, source=s, tag=6), 6), f"keywords {k}")
        check(ring(c, lambda b, d: MPI.Comm.Send(c, b, d, 7),
                   lambda b, s: MPI.Comm.Recv(c, b, s, 7), 7), f"unbound {k}")
        check(ring(c, lambda b, d: c.Send(b, d, 8),
                   lambda b, s: c.Recv(b, MPI.ANY_SOURCE, MPI.ANY_TAG, None), 8),
              f"status None {k}")
        st = MPI.Status()
        check(ring(c, lambda b, d: c.Send(b, d, 9), lambda b, s: c.Recv(b, s, 9, st), 9),
              f"status {k}")
        check((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT))
              == ((c.Get_rank() - 1) % n, 9, 4), f"status fields {k}")
        st2 = MPI.Status()
        check(ring(c, lambda b, d: c.Send(b, d, 10),
                   lambda b, s: c.Recv(b, s, 10, status=st2), 10), f"status keyword {k}")
        check(st2.Get_tag() == 10, f"status keyword fields {k}")

        x = np.array([c.Get_rank() + 1.0, 2.0])
        y = np.zeros(2)
        c.Allreduce(x, y)                       # op defaults to SUM
        check(y[0] == n * (n + 1) / 2 and y[1] == 2.0 * n, f"Allreduce default op {k}")
        c.Allreduce(x, y, MPI.MAX)
        check(y[0] == n, f"Allreduce MAX {k}")
        c.Allreduce(sendbuf=x, recvbuf=y, op=MPI.MIN)
        check(y[0] == 1, f"Allreduce keywords {k}")
        b = np.full(3, c.Get_rank(), "i")
        c.Bcast(b)                              # root defaults to 0
        check((b == 0).all(), f"Bcast default root {k}")
        b[:] = c.Get_rank()
        c.Bcast(b, n - 1)
        check((b == n - 1).all(), f"Bcast root {k}")
        b[:] = c.Get_rank()
        c.Bcast(buf=b, root=n - 1)
        check((b == n - 1).all(), f"Bcast keywords {k}")
        c.Barrier()
        g = np.zeros(n, "i")
        c.Gather(np.array([c.Get_rank()], "i"), g)
        check(c.Get_rank() != 0 or list(g) == list(range(n)), f"Gather default root {k}")
        g[:] = -1
        c.Gather(np.array([c.Get_rank()], "i"), g, n - 1)
        check(c.Get_rank() != n - 1 or list(g) == list(range(n)), f"Gather root {k}")
        out = np.zeros(1, "i")
        c.Scatter(np.arange(n, dtype="i") * 3, out)
        check(out[0] == 3 * c.Get_rank(), f"Scatter default root {k}")
        c.Scatter(np.arange(n, dtype="i") * 5, out, n - 1)
        check(out[0] == 5 * c.Get_rank(), f"Scatter root {k}")
        red = np.zeros(2)
        c.Reduce(x, red)                        # op SUM, root 0
        check(c.Get_rank() != 0 or red[0] == n * (n + 1) / 2, f"Reduce defaults {k}")
        c.Reduce(x, red, MPI.MAX, n - 1)
        check(c.Get_rank() != n - 1 or red[0] == n, f"Reduce op and root {k}")
        c.Reduce(x, red, root=n - 1)
        check(c.Get_rank() != n - 1 or red[0] == n * (n + 1) / 2, f"Reduce root keyword {k}")
        ag = np.zeros(2 * n, "i")
        c.Allgather(np.array([c.Get_rank()] * 2, "i"), ag)
        check(list(ag) == [i // 2 for i in range(2 * n)], f"Allgather {k}")
        at = np.zeros(n, "i")
        c.Alltoall(np.arange(n, dtype="i") + 10 * c.Get_rank(), at)
        check(list(at) == [10 * i + c.Get_rank() for i in range(n)], f"Alltoall {k}")
        rs = np.zeros(1, "i")
        c.Reduce_scatter_block(np.ones(n, "i"), rs)
        check(rs[0] == n, f"Reduce_scatter_block default op {k}")

        # the pickle API: send / recv by every route
        me, nx, pv = c.Get_rank(), (c.Get_rank() + 1) % n, (c.Get_rank() - 1) % n
        sends = (lambda o: c.send(o, nx), lambda o: c.send(o, nx, 3),
                 lambda o: c.send(obj=o, dest=nx, tag=4), lambda o: MPI.Comm.send(c, o, nx, 5))
        recvs = (lambda: c.recv(None, pv), lambda: c.recv(source=pv, tag=3),
                 lambda: c.recv(None, pv, 4, None), lambda: MPI.Comm.recv(c, None, pv, 5))
        for i, (snd, rcv) in enumerate(zip(sends, recvs)):
            o = {"rank": me, "k": k, "i": i, "a": np.arange(3) + me}
            if n == 1:                  # MPICH's send to self waits for the receive
                rq = c.irecv(source=0, tag=MPI.ANY_TAG)
                snd(o)
                got = rq.wait()
            elif me % 2 == 0:
                snd(o)
                got = rcv()
            else:
                got = rcv()
                snd(o)
            check(got["rank"] == pv and got["i"] == i and list(got["a"]) == [pv, pv + 1, pv + 2],
                  f"send/recv route {i} {k}")
        st3 = MPI.Status()
        if n == 1:
            rq = c.isend([me] * 3, 0, 12)
            got = c.recv(None, 0, 12, st3)
            rq.wait()
        elif me % 2 == 0:
            c.send([me] * 3, nx, 12)
            got = c.recv(None, pv, 12, st3)
        else:
            got = c.recv(None, pv, 12, st3)
            c.send([me] * 3, nx, 12)
        check(got == [pv] * 3 and st3.Get_source() == pv and st3.Get_tag() == 12,
              f"recv with a status {k}")

    # errors: the class mpi4py raises, by any route
    a = np.zeros(2)
    check(raises(MPI.ERR_RANK, c.Send, a, n), "Send to size")
    check(raises(MPI.ERR_RANK, c.Send, a, dest=n), "Send to size, keyword")
    check(raises(MPI.ERR_TAG, c.Send, a, 0, -5), "Send tag")
    check(raises(MPI.ERR_RANK, c.Recv, a, n), "Recv from size")
    check(raises(MPI.ERR_ROOT, c.Bcast, a, n), "Bcast root")
    check(raises(MPI.ERR_ROOT, c.Gather, a, None, -2), "Gather root")
    check(raises(MPI.ERR_RANK, c.send, 1, n), "send to size")
    check(raises(MPI.ERR_TAG, c.send, 1, 0, -5), "send tag")
    check(raises(MPI.ERR_RANK, c.recv, None, n), "recv from size")
    for call, args in ((c.Send, ()), (c.Send, (a,)), (c.Recv, ()), (c.Send, (a, 0, 0, 0)),
                       (c.Bcast, ()), (c.Barrier, (1,)), (c.Allreduce, (a,)),
                       (c.send, (1,)), (c.recv, (None, 0, 0, None, 1))):
        try:
            call(*args)
        except TypeError:
            pass
        else:
            check(False, f"{call.__name__}{args!r}: no TypeError")
    try:
        c.Send(a, 0, 0, nonsense=1)
    except TypeError:
        pass
    else:
        check(False, "Send with an unknown keyword: no TypeError")

# a subclass's own methods run, and reach the base's through super()
sub = Counting(comm)
for k in range(3):
    check(ring(sub, lambda b, d: sub.Send(b, d, 11), lambda b, s: sub.Recv(b, s, 11), 11),
          f"subclass ring {k}")
    b = np.full(2, rank, "i")
    sub.Bcast(b)
    check((b == 0).all(), f"subclass Bcast {k}")
check(Counting.sends == 3 and Counting.bcasts == 3, "subclass methods ran")
done("comm_methods")
