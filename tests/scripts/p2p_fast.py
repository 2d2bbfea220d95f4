"""Blocking Send/Recv of plain arrays (the lean path): data, statuses, errors."""
import threading
import time

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

# a fresh view over the same memory at every call (comm.Allreduce(x, y[:n]))
# takes the one-call paths as the remembered array did; a read-only one is
# still refused
for c in (MPI.COMM_SELF, comm):
    r, n = c.Get_rank(), c.Get_size()
    peer, src = (r + 1) % n, (r - 1) % n
    x = np.zeros(8)
    y = np.zeros(8)
    for i in range(4):
        x[:4] = r + i
        c.Allreduce(x[:4], y[:4])
        check(y[:4].tolist() == [n * i + n * (n - 1) / 2] * 4 and y[4:].tolist() == [0.0] * 4,
              f"Allreduce into a fresh view {i}")
        y[:4] = r + i if r == 0 else -1
        c.Bcast(y[:4], 0)
        check(y[:4].tolist() == [float(i)] * 4, f"Bcast into a fresh view {i}")
        c.Sendrecv(x[:4], peer, 100 + i, y[:4], src, 100 + i)
        check(y[:4].tolist() == [float(src + i)] * 4, f"Sendrecv of fresh views {i}")
    ro = y[:4]
    ro.flags.writeable = False
    y[:4] = 7
    try:
        c.Allreduce(x[:4], ro)
        check(False, "Allreduce into a read-only view")
    except (BufferError, MPI.Exception):
        pass
    check(y[:4].tolist() == [7.0] * 4, "a read-only view is left alone")
    c.Barrier()

# pickled objects: the one-call send/recv of small objects to a rank of this
# host, mixed with the request path, large objects, a late sender, ANY_SOURCE
import time  # noqa: E402
for c in (MPI.COMM_SELF, comm):
    r, n = c.Get_rank(), c.Get_size()
    peer, src = (r + 1) % n, (r - 1) % n
    objs = [None, 7, "x" * 10, {"k": [1.5, (2, 3)]}, np.arange(5), b"y" * 300000]
    for i, o in enumerate(objs):
        rq = c.isend(o, peer, 20 + i) if i % 2 else None
        if not i % 2:
            if n == 1:
                rq = c.isend(o, peer, 20 + i)
            else:
                c.send(o, peer, 20 + i) if r % 2 == 0 else None
        got = c.recv(source=src, tag=20 + i)
        if n > 1 and r % 2 == 1 and not i % 2:
            c.send(o, peer, 20 + i)
        if rq is not None:
            rq.wait()
        same = (got == o).all() if isinstance(o, np.ndarray) else got == o
        check(same, f"object {i} through send/recv")
    if n > 1:
        # the receiver waits past its first slice (0.5 s) before the object comes
        if r == 0:
            time.sleep(0.8)
            c.send({"late": True}, peer, 30)
        if r == 1:
            check(c.recv(source=0, tag=30) == {"late": True}, "late object")
        c.Barrier()
        # ANY_SOURCE / ANY_TAG, and a recv that asks for the status
        c.send(("from", r), peer, 31)
        check(c.recv() == ("from", src), "ANY_SOURCE recv")
        c.send(r, peer, 32)
        st = MPI.Status()
        check(c.recv(source=MPI.ANY_SOURCE, tag=32, status=st) == src
              and st.Get_source() == src, "recv with a status")
    check(c.recv(source=MPI.PROC_NULL) is None, "recv from PROC_NULL")
    c.send("nothing", MPI.PROC_NULL)
    check(raises(MPI.ERR_RANK, c.send, 1, n, 0), "send bad rank")
    check(raises(MPI.ERR_TAG, c.send, 1, peer, -5), "send bad tag")
    check(raises(MPI.ERR_RANK, c.recv, None, n + 3, 0), "recv bad rank")
    c.Barrier()

# Sendrecv of the same arrays again and again (one C call from the second):
# data, statuses, ANY_TAG, truncation, a late peer, PROC_NULL, bad arguments
for c in (MPI.COMM_SELF, comm):
    r, n = c.Get_rank(), c.Get_size()
    peer, src = (r + 1) % n, (r - 1) % n
    s = np.zeros(4, "i")
    d = np.zeros(4, "i")
    for i in range(5):
        s[:] = np.arange(4) + 10 * r + i
        st = MPI.Status()
        st.Set_error(MPI.ERR_OTHER)
        c.Sendrecv(s, peer, 40 + i, d, src, MPI.ANY_TAG if i % 2 else 40 + i, st)
        check(d.tolist() == (np.arange(4) + 10 * src + i).tolist(), f"Sendrecv data {i}")
        check((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT), st.Get_error())
              == (src, 40 + i, 4, MPI.ERR_OTHER), f"Sendrecv status {i}")
    c.Sendrecv(s, peer, 1, d, src, 1)                # without a status
    short = np.zeros(2, "i")
    for i in range(2):                                # the second one through the fast path
        st = MPI.Status()
        check(raises(MPI.ERR_TRUNCATE, c.Sendrecv, s, peer, 50 + i, short, src, 50 + i, st),
              f"Sendrecv truncates {i}")
        check((st.Get_source(), st.Get_tag()) == (src, 50 + i), f"Sendrecv truncated status {i}")
    c.Barrier()
    if n > 1:
        # the peer comes past the first slice (0.5 s) of the waiting one
        c.Sendrecv(s, peer, 59, d, src, 59)
        if r == 1:
            time.sleep(0.8)
        c.Sendrecv(s, peer, 60, d, src, 60)
        check(d.tolist() == (np.arange(4) + 10 * src + 4).tolist(), "Sendrecv with a late peer")
    st = MPI.Status()
    c.Sendrecv(s, MPI.PROC_NULL, 0, d, MPI.PROC_NULL, 0, st)
    check(st.Get_source() == MPI.PROC_NULL, "Sendrecv with PROC_NULL")
    check(raises(MPI.ERR_RANK, c.Sendrecv, s, n, 0, d, src, 0), "Sendrecv bad rank")
    check(raises(MPI.ERR_TAG, c.Sendrecv, s, peer, -5, d, src, 0), "Sendrecv bad tag")
    c.Barrier()
    # Isend / Irecv over more buffers than the fast path keeps, three rounds
    sb = [np.full(3, 100 * r + i, "d") for i in range(10)]
    rb = [np.zeros(3, "d") for _ in range(10)]
    for rnd in range(3):
        for i in range(10):
            rq = [c.Irecv(rb[i], src, 70 + i), c.Isend(sb[i], peer, 70 + i)]
            st = [MPI.Status(), MPI.Status()]
            MPI.Request.Waitall(rq, st)
            check(rb[i].tolist() == [100 * src + i] * 3, f"Irecv data {rnd} {i}")
            check((st[0].Get_source(), st[0].Get_tag(), st[0].Get_count(MPI.DOUBLE))
                  == (src, 70 + i, 3), f"Irecv status {rnd} {i}")
            check(rq[0] == MPI.REQUEST_NULL and rq[1] == MPI.REQUEST_NULL, "requests freed")
    for i in range(2):
        q = c.Irecv(short, src, 80)
        c.Isend(s, peer, 80).Wait()
        st = MPI.Status()
        check(raises(MPI.ERR_TRUNCATE, q.Wait, st), f"Irecv truncates {i}")
        check((st.Get_source(), st.Get_tag()) == (src, 80), f"Irecv truncated status {i}")
    q = c.Irecv(d, MPI.ANY_SOURCE, MPI.ANY_TAG)
    c.Isend(s, peer, 81).Wait()
    st = MPI.Status()
    q.Wait(st)
    check((st.Get_source(), st.Get_tag()) == (src, 81), "Irecv ANY_SOURCE / ANY_TAG")
    # Waitany / Testany over requests of the one-call path; Cancel; a request
    # dropped while pending (the engine keeps its buffer until the message)
    rq = [c.Irecv(rb[i], src, 90 + i) for i in range(3)]
    sq = [c.Isend(sb[i], peer, 92 - i) for i in range(3)]
    got = set()
    for _ in range(3):
        i = MPI.Request.Waitany(rq)
        got.add(i)
        check(rb[i].tolist() == [100 * src + 2 - i] * 3, f"Waitany data {i}")
    check(got == {0, 1, 2} and MPI.Request.Waitany(rq) == MPI.UNDEFINED, "Waitany all")
    MPI.Request.Waitall(sq)
    q = c.Irecv(rb[0], src, 95)
    check(MPI.Request.Testany([q])[1] is False, "Testany of a pending receive")
    q.Cancel()
    st = MPI.Status()
    q.Wait(st)
    check(st.Is_cancelled(), "Irecv cancelled")
    c.Barrier()
    q = c.Irecv(rb[1], src, 96)
    del q                                    # dropped while pending
    c.Send(sb[1], peer, 96)
    c.Barrier()
    q = c.Irecv(rb[2], src, 97)
    c.Isend(sb[2], peer, 97).Wait()
    q.Wait()
    check(rb[2].tolist() == [100 * src + 2] * 3, "receive after a dropped request")
    check(raises(MPI.ERR_RANK, c.Isend, s, n, 0), "Isend bad rank")
    check(raises(MPI.ERR_TAG, c.Irecv, d, src, -5), "Irecv bad tag")
    c.Barrier()
    # small Isends of a remembered buffer (into a local peer's ring: complete
    # at once here): active until completed, then null
    sq = [c.Isend(sb[0], peer, 98) for _ in range(3)]
    check(all(q != MPI.REQUEST_NULL for q in sq), "Isend requests active")
    for i in range(3):
        c.Recv(rb[3], src, 98)
        check(rb[3].tolist() == [100 * src] * 3, f"Isend data {i}")
    st = MPI.Status()
    sq[1].Wait(st)
    check(st.Get_error() == MPI.SUCCESS and not st.Is_cancelled(), "Isend status")
    check(sq[1] == MPI.REQUEST_NULL and sq[0] != MPI.REQUEST_NULL, "Wait ends one")
    MPI.Request.Waitall(sq)
    check(all(q == MPI.REQUEST_NULL for q in sq), "Waitall ends them")
    c.Barrier()

# bytes and bytearray as buffers (BYTE; one C call once the communicator has
# a fast-path state): every size, a new object every call, statuses, too
# small a bytearray, bytes as a receive buffer (not writable)
def pattern(r, i, nbytes):
    return bytes((r * 7 + i + k) % 256 for k in range(nbytes))


def exchange(c, send, recv):
    """Even ranks send first, odd ones receive first."""
    for step in ((send, recv) if c.Get_rank() % 2 == 0 else (recv, send)):
        step()


def bad_receives(c, src):
    check(raises(MPI.ERR_TRUNCATE, c.Recv, bytearray(2), src, 61), "bytearray too small")
    try:
        c.Recv(bytes(4), src, 62)
        check(False, "bytes as a receive buffer")
    except BufferError:
        pass
    c.Recv(bytearray(4), src, 62)


if size > 1:
    c = comm.Dup()          # (a communicator whose first calls are these)
    peer, src = (rank + 1) % size, (rank - 1) % size
    for i, nbytes in enumerate((0, 1, 69, 4096, 300000) * 3):
        data, want = pattern(rank, i, nbytes), pattern(src, i, nbytes)
        got, st = bytearray(nbytes + 3), MPI.Status()
        send = data if i % 2 else bytearray(data)
        exchange(c, lambda: c.Send(send, peer, 40 + i), lambda: c.Recv(got, src, 40 + i, st))
        check(bytes(got[:nbytes]) == want and got[nbytes:] == bytearray(3),
              f"bytes {nbytes}: data")
        check(st.Get_count(MPI.BYTE) == nbytes and st.Get_source() == src,
              f"bytes {nbytes}: status")
        got = bytearray(nbytes + 1)
        exchange(c, lambda: c.Send(data, peer, 60), lambda: c.Recv(got, src, 60))
        check(bytes(got[:nbytes]) == want, f"bytes {nbytes}: data, no status")
    exchange(c, lambda: (c.Send(b"abcd", peer, 61), c.Send(b"efgh", peer, 62)),
             lambda: bad_receives(c, src))
    # Sendrecv with bytes or a bytearray on either side (numpy on the other)
    for i, nbytes in enumerate((0, 1, 69, 4096, 300000) * 2):
        data, want = pattern(rank, i, nbytes), pattern(src, i, nbytes)
        send = (data, bytearray(data), np.frombuffer(data, np.uint8))[i % 3]
        got = (bytearray(nbytes + 3), np.zeros(nbytes + 3, np.uint8))[i % 2]
        st = MPI.Status()
        c.Sendrecv(send, peer, 80 + i, got, src, 80 + i, st)
        check(bytes(got[:nbytes]) == want and not any(got[nbytes:]),
              f"Sendrecv bytes {nbytes} ({type(send).__name__}, {type(got).__name__}): data")
        check(st.Get_count(MPI.BYTE) == nbytes and st.Get_source() == src
              and st.Get_tag() == 80 + i, f"Sendrecv bytes {nbytes}: status")
    check(raises(MPI.ERR_TRUNCATE, c.Sendrecv, b"toolong", peer, 90, bytearray(2), src, 90),
          "Sendrecv into too small a bytearray")
    try:      # (refused before anything is sent, as MPICH checks both sides first)
        c.Sendrecv(b"ab", peer, 91, b"xy", src, 91)
        check(False, "Sendrecv with bytes as the receive buffer")
    except BufferError:
        pass
    c.Barrier()
    check(not c.Iprobe(src, 91), "a Sendrecv refused sent nothing")
    # a receive into a bytearray that waits past the engine's 0.5 s wait
    # slice: the bytearray cannot be resized meanwhile (its memory stays
    # exported for the whole call); a Recv, then a Sendrecv
    calls = (("Recv", b"late", lambda ba: c.Recv(ba, 0, 70)),
             ("Sendrecv", b"LATE", lambda ba: c.Sendrecv(b"go", 0, 71, ba, 0, 70)))
    for what, data, call in calls:
        c.Barrier()
        if rank == 0:
            if what == "Sendrecv":
                c.Recv(bytearray(2), 1, 71)
            time.sleep(1.5)
            c.Send(data * 4, 1, 70)
        elif rank == 1:
            ba, seen = bytearray(16), []

            def resize():
                time.sleep(0.8)
                try:
                    ba.extend(bytes(100000))
                    seen.append("resized")
                except BufferError:
                    seen.append("refused")
            th = threading.Thread(target=resize)
            th.start()
            call(ba)
            th.join()
            check(seen == ["refused"] and ba == bytearray(data * 4),
                  f"bytearray resized during a long {what}: {seen}")
    c.Barrier()
    c.Free()

done("p2p_fast")
