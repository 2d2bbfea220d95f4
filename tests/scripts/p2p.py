"""Point-to-point checks (buffers and objects) for any number of ranks."""
import numpy as np
from _mpi import MPI, check, done

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size

for c in (comm, comm.Dup(), MPI.COMM_SELF):
    r, n = c.Get_rank(), c.Get_size()
    rt, lf = (r + 1) % n, (r - 1) % n
    # Sendrecv ring, typed buffers
    for dt in ("i", "d", "b", "F"):
        s = np.full(7, r + 1, dtype=dt)
        d = np.zeros(7, dtype=dt)
        st = MPI.Status()
        c.Sendrecv(s, rt, 3, d, lf, 3, st)
        check((d == lf + 1).all(), f"Sendrecv {dt} got {d}")
        check(st.Get_source() == lf and st.Get_tag() == 3, f"status {st.source} {st.tag}")
        check(st.Get_count(MPI.BYTE) == s.nbytes, "status byte count")
        check(st.Get_count(MPI.Datatype(MPI.__dict__['BYTE'])) == s.nbytes, "count BYTE")
    # Isend/Irecv + Waitall, various sizes including large (rendezvous path)
    for count in (0, 1, 1000, 300_000):
        s = np.arange(count, dtype="d") + r
        d = np.empty(count, dtype="d")
        reqs = [c.Irecv([d, MPI.DOUBLE], lf, 5), c.Isend([s, MPI.DOUBLE], rt, 5)]
        sts = [MPI.Status(), MPI.Status()]
        MPI.Request.Waitall(reqs, sts)
        check(np.array_equal(d, np.arange(count, dtype="d") + lf), f"Isend/Irecv {count}")
        check(sts[0].Get_count(MPI.DOUBLE) == count, f"count {sts[0].Get_count(MPI.DOUBLE)}")
        check(all(q == MPI.REQUEST_NULL for q in reqs), "requests null after Waitall")
    # Issend/Ssend
    d = np.zeros(3, "i")
    rq = c.Irecv(d, lf, 9)
    c.Ssend(np.array([r, r, r], "i"), rt, 9)
    rq.Wait()
    check((d == lf).all(), "Ssend")
    # Sendrecv_replace
    b = np.full(4, r, "l")
    c.Sendrecv_replace(b, rt, 1, lf, 1)
    check((b == lf).all(), "Sendrecv_replace")
    # Probe / Iprobe / Mprobe / Improbe
    rq = c.Isend(np.arange(6, dtype="i"), rt, 11)
    st = MPI.Status()
    c.Probe(lf, 11, st)
    check(st.Get_count(MPI.INT) == 6 and st.Get_source() == lf, "Probe status")
    check(c.Iprobe(lf, 11), "Iprobe")
    m = c.Mprobe(lf, 11)
    d = np.empty(6, "i")
    m.Recv(d)
    check(m == MPI.MESSAGE_NULL, "message null after Recv")
    check((d == np.arange(6)).all(), "Mprobe/Recv")
    rq.Wait()
    check(not c.Iprobe(lf, 11), "Iprobe after receive")
    check(c.Improbe(lf, 12) is None, "Improbe none")
    # PROC_NULL
    st = MPI.Status()
    c.Send(np.ones(3), MPI.PROC_NULL)
    c.Recv(np.ones(3), MPI.PROC_NULL, 0, st)
    check(st.Get_source() == MPI.PROC_NULL and st.Get_tag() == MPI.ANY_TAG
          and st.Get_count(MPI.BYTE) == 0, f"PROC_NULL status {st.source} {st.tag}")
    check(c.Mprobe(MPI.PROC_NULL) == MPI.MESSAGE_NO_PROC, "Mprobe PROC_NULL")
    check(c.recv(source=MPI.PROC_NULL) is None, "recv PROC_NULL")
    # ANY_SOURCE / ANY_TAG with Status
    rq = c.Isend(np.array([r], "i"), rt, 21 + r % 3)
    st = MPI.Status()
    d = np.empty(1, "i")
    c.Recv(d, MPI.ANY_SOURCE, MPI.ANY_TAG, st)
    rq.Wait()
    check(st.source == lf and st.tag == 21 + lf % 3 and d[0] == lf, "ANY_SOURCE/ANY_TAG")
    # Waitany / Testall / Waitsome / Test
    rs = [c.Irecv(np.empty(2, "i"), lf, 30 + i) for i in range(3)]
    ss = [c.Isend(np.array([i, i], "i"), rt, 30 + i) for i in range(3)]
    got = set()
    while len(got) < 3:
        i = MPI.Request.Waitany(rs)
        got.add(i)
    check(MPI.Request.Waitany(rs) == MPI.UNDEFINED, "Waitany all null")
    MPI.Request.Waitall(ss)
    check(MPI.Request.Testall(rs), "Testall on null requests")
    rs = [c.Irecv(np.empty(2, "i"), lf, 40 + i) for i in range(2)]
    ss = [c.Isend(np.array([i, i], "i"), rt, 40 + i) for i in range(2)]
    idx = []
    while len(idx) < 2:
        out = MPI.Request.Waitsome(rs)
        idx += out
    check(sorted(idx) == [0, 1], f"Waitsome {idx}")
    check(MPI.Request.Waitsome(rs) is None, "Waitsome all null")
    MPI.Request.Waitall(ss)
    # Persistent requests
    buf = np.empty(2, "i")
    pr = c.Recv_init(buf, lf, 50)
    ps = c.Send_init(np.array([r, 7], "i"), rt, 50)
    for _ in range(2):
        MPI.Prequest.Startall([pr, ps])
        MPI.Request.Waitall([pr, ps])
        check(buf[0] == lf and buf[1] == 7, "persistent")
    pr.Free()
    ps.Free()
    # Cancel an unmatched receive
    rq = c.Irecv(np.empty(1), lf, 999)
    rq.Cancel()
    st = MPI.Status()
    rq.Wait(st)
    check(st.Is_cancelled(), "cancelled receive")

    # Objects
    N = 1000 if MPI.get_vendor()[0] != "erdmampi" else 100_000  # mpi4py irecv: 32 KiB
    obj = {"r": r, "a": np.arange(N + r), "s": "x" * r}
    rq = c.irecv(source=lf, tag=1)
    c.send(obj, rt, 1)
    got = rq.wait()
    check(got["r"] == lf and got["a"][-1] == N + lf - 1 and got["s"] == "x" * lf,
          "isend/irecv objects")
    got = c.sendrecv([r] * 3, rt, 2, source=lf, recvtag=2)
    check(got == [lf] * 3, "sendrecv objects")
    sq = c.issend(("t", r), rt, 4)
    st = MPI.Status()
    check(c.recv(None, MPI.ANY_SOURCE, 4, st) == ("t", lf), "issend/recv")
    check(st.source == lf and st.tag == 4, "recv status")
    sq.wait()
    rq = c.irecv(source=lf, tag=6)
    c.ssend(r, rt, 6)
    check(rq.wait() == lf, "ssend")
    rq = c.isend(b"hello" * 10, rt, 7)
    m = c.mprobe(lf, 7)
    check(m.recv() == b"hello" * 10, "mprobe/recv")
    rq.wait()
    rq = c.isend(None, rt, 8)
    st = MPI.Status()
    check(c.probe(lf, 8, st) is True and st.Get_source() == lf, "probe objects")
    m = None
    while m is None:
        m = c.improbe(lf, 8)
    check(m.irecv().wait() is None, "improbe/irecv None object")
    rq.wait()
    reqs = [c.irecv(source=lf, tag=60 + i) for i in range(3)]
    sreqs = [c.isend(i * 10, rt, 60 + i) for i in range(3)]
    check(MPI.Request.waitall(reqs) == [0, 10, 20], "waitall objects")
    MPI.Request.waitall(sreqs)
    rq = c.irecv(source=lf, tag=70)
    sq = c.isend("z", rt, 70)
    flag, val = rq.test()
    if not flag:
        idx, val = MPI.Request.waitany([rq])
        check(idx == 0, f"waitany objects {idx}")
    check(val == "z", f"test/waitany objects {val}")
    sq.wait()
    check(MPI.Request.testall([rq]) == (True, [None]), "testall after completion")
done("p2p")
