"""Point-to-point: wildcards and Status contents, probes, Sendrecv(_replace),
synchronous sends, Wait/Test families, Cancel, sizes 0 B .. 64 MiB, truncation."""
import numpy as np
from _mpi import MPI
from diff_util import RANK, SIZE, call, canon, digest, exc_text, finish, out, status_text

comm = MPI.COMM_WORLD
r, n = RANK, SIZE
right, left = (r + 1) % n, (r - 1) % n


def st_full(st, dt=None):
    s = status_text(st)
    if dt is not None:
        s += f" count[{dt.Get_name()}]={st.Get_count(dt)} elems={st.Get_elements(dt)}"
    return s


# 1. ANY_SOURCE / ANY_TAG, one sender at a time so the order is defined
for sender in range(n):
    if r == sender:
        for dest in range(n):
            if dest != r:
                comm.Send(np.arange(sender + 3, dtype="i4"), dest, tag=100 + sender)
    elif True:
        buf = np.full(10, -1, "i4")
        st = MPI.Status()
        call(f"anysrc.from{sender}", comm.Recv, buf, MPI.ANY_SOURCE, MPI.ANY_TAG, st,
             show=None)
        out(f"anysrc.from{sender}.status", st_full(st, MPI.INT))
        out(f"anysrc.from{sender}.count_byte", st.Get_count(MPI.BYTE))
        out(f"anysrc.from{sender}.count_double", st.Get_count(MPI.DOUBLE))
        out(f"anysrc.from{sender}.val", digest(buf))
    comm.Barrier()

# 2. Probe / Iprobe / Mprobe / Improbe
if r == 0:
    comm.Send(np.arange(4, dtype="f8"), 1, tag=7)
    comm.send({"a": np.arange(3)}, 1, tag=8)
    comm.Send(np.arange(6, dtype="i2"), 1, tag=9)
    comm.send([1, 2, 3], 1, tag=10)
elif r == 1:
    st = MPI.Status()
    comm.Probe(0, 7, st)
    out("probe.status", st_full(st, MPI.DOUBLE))
    out("probe.getcount.float", st.Get_count(MPI.FLOAT))
    b = np.zeros(4)
    comm.Recv(b, 0, 7)
    out("probe.recv", digest(b))
    while not comm.Iprobe(0, 8, st):
        pass
    out("iprobe.tag", (st.Get_source(), st.Get_tag()))
    call("iprobe.recvobj", comm.recv, None, 0, 8)
    m = comm.Mprobe(0, 9, st)
    out("mprobe.status", st_full(st, MPI.SHORT))
    out("mprobe.msg", type(m).__name__ + " " + str(bool(m)))
    b = np.zeros(6, "i2")
    call("mprobe.Recv", m.Recv, b, show=None)
    out("mprobe.val", digest(b))
    out("mprobe.after", str(bool(m)) + " " + str(m == MPI.MESSAGE_NULL))
    m = None
    while m is None:
        m = comm.improbe(0, 10, st)
    out("improbe.src", st.Get_source())
    call("improbe.recv", m.recv)
    out("iprobe.none", comm.Iprobe(0, 99))
    out("improbe.none", canon(comm.Improbe(0, 99)))
    out("improbe.none.obj", canon(comm.improbe(0, 99)))
comm.Barrier()

# 3. PROC_NULL
st = MPI.Status()
call("procnull.Send", comm.Send, np.zeros(3), MPI.PROC_NULL, 5)
b = np.full(3, 2.0)
call("procnull.Recv", comm.Recv, b, MPI.PROC_NULL, 5, st)
out("procnull.status", st_full(st, MPI.DOUBLE))
out("procnull.val", digest(b))
call("procnull.recvobj", comm.recv, None, MPI.PROC_NULL)
call("procnull.sendrecv", comm.sendrecv, 1, MPI.PROC_NULL, 0, None, MPI.PROC_NULL)
m = comm.Mprobe(MPI.PROC_NULL, 0, st)
out("procnull.mprobe", f"{bool(m)} {m == MPI.MESSAGE_NO_PROC} " + st_full(st))
call("procnull.iprobe", comm.Iprobe, MPI.PROC_NULL)

# 4. Sendrecv / Sendrecv_replace / sendrecv, in a ring
b = np.full(5, -1, "i8")
st = MPI.Status()
call("Sendrecv", comm.Sendrecv, np.arange(5, dtype="i8") + r, right, 3, b, left, 3, st,
     show=None)
out("Sendrecv.val", digest(b))
out("Sendrecv.status", st_full(st, MPI.INT64_T))
b = np.arange(4, dtype="f4") * (r + 1)
call("Sendrecv_replace", comm.Sendrecv_replace, b, right, 4, left, MPI.ANY_TAG, st, show=None)
out("Sendrecv_replace.val", digest(b))
out("Sendrecv_replace.status", st_full(st, MPI.FLOAT))
call("sendrecv", comm.sendrecv, {"from": r, "a": np.ones(r + 1)}, right, 5, None, left, 5)

# 5. Ssend / Issend / ssend
if r == 0:
    call("Ssend", comm.Ssend, np.arange(3, dtype="i4"), 1, 11)
    req = comm.Issend(np.arange(100000, dtype="i4"), 1, 12)
    st = MPI.Status()
    call("Issend.wait", req.Wait, st)
    out("Issend.req.after", bool(req))
    call("ssend.obj", comm.ssend, ["x", 1], 1, 13)
elif r == 1:
    b = np.zeros(3, "i4")
    comm.Recv(b, 0, 11)
    out("Ssend.val", digest(b))
    b = np.zeros(100000, "i4")
    comm.Recv(b, 0, 12)
    out("Issend.val", digest(b))
    call("ssend.recv", comm.recv, None, 0, 13)
comm.Barrier()

# 6. Wait/Test families
reqs = []
bufs = []
for k in range(4):
    b = np.full(2, -1, "i4")
    bufs.append(b)
    reqs.append(comm.Irecv(b, left, 200 + k))
sreqs = [comm.Isend(np.array([r, k], "i4"), right, 200 + k) for k in range(4)]
out("Testall.before", "skip")
st = MPI.Status()
idx = call("Waitany", MPI.Request.Waitany, reqs, st, show=None)
# which one completes first is timing: check it is consistent with its status
out("Waitany.consistent", idx in range(4) and st.Get_tag() == 200 + idx
    and st.Get_source() == left and not reqs[idx])
done = call("Waitsome", MPI.Request.Waitsome, reqs, show=None)
out("Waitsome.nonempty", done is not None and len(done) >= 1)
call("Waitall", MPI.Request.Waitall, reqs)
out("Waitall.reqs", [bool(q) for q in reqs])
out("Testall.done", canon(MPI.Request.Testall(reqs)))
out("Testany.done", canon(MPI.Request.Testany(reqs)))
out("Testsome.done", canon(MPI.Request.Testsome(reqs)))
out("Waitany.empty", canon(MPI.Request.Waitany(reqs)))
out("Waitsome.empty", canon(MPI.Request.Waitsome(reqs)))
MPI.Request.Waitall(sreqs)
out("wait.bufs", [digest(b) for b in bufs])
statuses = [MPI.Status() for _ in range(3)]
reqs = [comm.Irecv(np.zeros(3, "u1"), left, 300 + k) for k in range(3)]
sreqs = [comm.Isend(np.arange(k + 1, dtype="u1"), right, 300 + k) for k in range(3)]
MPI.Request.Waitall(reqs, statuses)
out("Waitall.statuses", [st_full(s, MPI.BYTE) for s in statuses])
MPI.Request.Waitall(sreqs)
# lowercase request objects
rq = comm.irecv(source=left, tag=400)
sq = comm.isend({"r": r}, right, 400)
call("irecv.wait", rq.wait)
call("isend.wait", sq.wait)
rq = comm.irecv(source=left, tag=401)
sq = comm.isend([r] * 3, right, 401)
call("waitall.obj", MPI.Request.waitall, [rq, sq])
out("Request.NULL", bool(MPI.REQUEST_NULL))
call("Test.null", MPI.REQUEST_NULL.Test)
call("Wait.null", MPI.REQUEST_NULL.Wait)
comm.Barrier()

# 7. Cancel an unmatched receive
req = comm.Irecv(np.zeros(4), MPI.ANY_SOURCE, 999)
req.Cancel()
st = MPI.Status()
call("cancel.wait", req.Wait, st)
out("cancel.status", f"cancelled={st.Is_cancelled()}")
comm.Barrier()

# 8. sizes 0 B .. 64 MiB (checksums), ring exchange
for nbytes in (0, 1, 1000, 65535, 65536, 65537, 1 << 20, 5 << 20, 64 << 20):
    s = (np.arange(nbytes, dtype=np.uint64) * (r + 7) % 251).astype(np.uint8)
    b = np.empty(nbytes, np.uint8)
    st = MPI.Status()
    rq = comm.Irecv(b, left, 500)
    comm.Send(s, right, 500)
    rq.Wait(st)
    out(f"size.{nbytes}", digest(b) + " " + st_full(st, MPI.BYTE))
    if nbytes <= (1 << 20):
        got = comm.sendrecv(s, right, 501, None, left, 501)
        out(f"size.obj.{nbytes}", canon(got))

# 9. truncation: error class on the receiver, status error
if r == 0:
    comm.Send(np.arange(10, dtype="i4"), 1, 600)
    comm.Send(np.arange(100000, dtype="i4"), 1, 601)
    comm.send(list(range(50)), 1, 602)
elif r == 1:
    st = MPI.Status()
    call("trunc.Recv", comm.Recv, np.zeros(5, "i4"), 0, 600, st)
    call("trunc.Recv.big", comm.Recv, np.zeros(5, "i4"), 0, 601)
    call("trunc.recvobj", comm.recv, bytearray(10), 0, 602)
comm.Barrier()
if r == 0:
    comm.Send(np.arange(10, dtype="i4"), 1, 603)
elif r == 1:
    req = comm.Irecv(np.zeros(5, "i4"), 0, 603)
    st = MPI.Status()
    try:
        req.Wait(st)
        out("trunc.Irecv", "ok")
    except Exception as e:  # noqa: BLE001
        out("trunc.Irecv", exc_text(e))
    out("trunc.Irecv.status.err", MPI.Get_error_class(st.Get_error()) if st.Get_error() else 0)
comm.Barrier()

if r == 0:
    comm.Send(np.arange(10, dtype="i4"), 1, 610)
    comm.Send(np.arange(2, dtype="i4"), 1, 611)
    comm.Send(np.arange(10, dtype="i4"), 1, 612)
elif r == 1:
    reqs = [comm.Irecv(np.zeros(5, "i4"), 0, 610), comm.Irecv(np.zeros(5, "i4"), 0, 611)]
    sts = [MPI.Status() for _ in reqs]
    call("trunc.Waitall", MPI.Request.Waitall, reqs, sts)
    out("trunc.Waitall.errors", [MPI.Get_error_class(s.Get_error()) for s in sts])
    out("trunc.Waitall.reqs", [bool(q) for q in reqs])
    req = comm.Irecv(np.zeros(5, "i4"), 0, 612)
    call("trunc.Waitany", MPI.Request.Waitany, [req])
    out("trunc.Waitany.req", bool(req))
comm.Barrier()

# 10. buffer specs and persistent requests
if n >= 2 and r < 2:
    peer = 1 - r
    src = np.arange(12, dtype="i4") * (r + 1)
    specs = {"plain": lambda a: a, "typed": lambda a: [a, MPI.INT],
             "count": lambda a: [a, 5, MPI.INT], "cd": lambda a: [a, (4, 2), MPI.INT],
             "bytes": lambda a: [a, MPI.BYTE], "mv": lambda a: memoryview(a)}
    for name, spec in specs.items():
        b = np.full(12, -1, "i4")
        st = MPI.Status()
        call(f"spec.{name}", comm.Sendrecv, spec(src), peer, 700, spec(b), peer, 700, st,
             show=None)
        out(f"spec.{name}.val", digest(b) + " " + st_full(st, MPI.INT))
    sreq = comm.Send_init(src, peer, 701)
    b = np.zeros(12, "i4")
    rreq = comm.Recv_init(b, peer, 701)
    for it in range(3):
        src[0] = it
        MPI.Prequest.Startall([rreq, sreq])
        st = MPI.Status()
        MPI.Request.Waitall([rreq, sreq])
        out(f"persistent.{it}", digest(b) + f" active={bool(rreq)}")
    rreq.Free()
    sreq.Free()
    out("persistent.freed", (bool(rreq), bool(sreq)))
comm.Barrier()

# 11. odd counts, object status, request queries
if n >= 2 and r < 2:
    peer = 1 - r
    st = MPI.Status()
    comm.Sendrecv(np.arange(7, dtype="u1"), peer, 800, np.zeros(16, "u1"), peer, 800, st)
    out("oddcount", f"{st.Get_count(MPI.INT)} {st.Get_elements(MPI.INT)} "
                    f"{st.Get_count(MPI.BYTE)} {st.Get_count(MPI.SHORT)}")
    st = MPI.Status()
    got = comm.sendrecv({"k": [1, 2.5, "x"]}, peer, 801, None, peer, 801, st)
    out("objstatus", f"{canon(got)} src={st.Get_source()} tag={st.Get_tag()}")
    got = comm.sendrecv(b"abc" * 10, peer, 802, None, peer, 802, st)
    out("objstatus.count", st.Get_count())
    rq = comm.irecv(source=peer, tag=803)
    out("irecv.test.before", canon(rq.test()))
    comm.sendrecv(None, peer, 898, None, peer, 898)
    sq = comm.isend([r], peer, 803)
    sq.wait()
    out("irecv.wait", canon(rq.wait()))
    out("irecv.after", (bool(rq), canon(rq.test())))
    b = np.zeros(3, "i4")
    rq = comm.Irecv(b, peer, 804)
    comm.Send(np.array([r, r, r], "i4"), peer, 804)
    st = MPI.Status()
    while not rq.Get_status(st):
        pass
    out("get_status", f"{bool(rq)} {st.Get_source()} {st.Get_tag()}")
    out("test.after", canon(rq.Test()))
    out("test.null", canon(rq.Test()))
    flag, obj = MPI.REQUEST_NULL.test()
    out("test.null.obj", canon((flag, obj)))
    rqs = [comm.Irecv(np.zeros(2), peer, 805 + k) for k in range(2)]
    out("testany.none", canon(MPI.Request.Testany(rqs)[1]))
    out("testsome.none", canon(MPI.Request.Testsome(rqs)))
    out("testall.none", canon(MPI.Request.Testall(rqs)))
    comm.sendrecv(None, peer, 899, None, peer, 899)   # both tested before either sends
    for k in range(2):
        comm.Send(np.ones(2), peer, 805 + k)
    MPI.Request.Waitall(rqs)
comm.Barrier()

# 12. buffers of odd shapes and kinds
if n >= 2 and r < 2:
    peer = 1 - r
    a = np.arange(24, dtype="f8").reshape(4, 6)
    call("noncontig.Send", comm.Send, a[:, ::2], peer, 900)
    call("fortran.Sendrecv", comm.Sendrecv, np.asfortranarray(a), peer, 901,
         np.zeros((4, 6), order="F"), peer, 901, show=None)
    b = np.zeros((2, 12))
    call("2d.Sendrecv", comm.Sendrecv, a, peer, 902, b, peer, 902, show=None)
    out("2d.val", digest(b))
    b = np.zeros(24, "i8")
    call("typepun.Sendrecv", comm.Sendrecv, a, peer, 903, b, peer, 903, show=None)
    out("typepun.val", digest(b))
    bb = np.zeros(5, "?")
    call("bool.Sendrecv", comm.Sendrecv, np.array([1, 0, 1, 1, 0], "?"), peer, 904, bb, peer,
         904, show=None)
    out("bool.val", digest(bb))
    ba = bytearray(6)
    call("bytes.Sendrecv", comm.Sendrecv, b"hello!", peer, 905, ba, peer, 905, show=None)
    out("bytes.val", bytes(ba))
    big = np.arange(300000, dtype="i4") + r
    call("big.Sendrecv_replace", comm.Sendrecv_replace, big, peer, 906, peer, 906, show=None)
    out("big.Sendrecv_replace.val", digest(big))
    st = MPI.Status()
    comm.Send(np.arange(5, dtype="i2"), peer, 907)
    m = comm.Mprobe(peer, 907, st)
    b = np.zeros(5, "i2")
    rq = m.Irecv(b)
    rq.Wait()
    out("mprobe.Irecv", digest(b) + " " + st_full(st, MPI.SHORT))
    comm.send({"z": 1}, peer, 908)
    m = comm.mprobe(peer, 908)
    out("mprobe.irecv", canon(m.irecv().wait()))
    comm.Send(np.arange(3, dtype="i4"), peer, 909)
    while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, st):
        pass
    out("iprobe.any", st_full(st, MPI.INT))
    comm.Recv(np.zeros(3, "i4"), st.Get_source(), st.Get_tag())
comm.Barrier()

# 13. Status object itself
st = MPI.Status()
out("status.new", f"{st.Get_source()} {st.Get_tag()} {st.Get_error()} {st.Get_count()}")
st.Set_source(3)
st.Set_tag(4)
st.Set_elements(MPI.INT, 5)
out("status.set", f"{st.Get_source()} {st.Get_tag()} {st.Get_count(MPI.INT)} "
    f"{st.Get_count(MPI.BYTE)} {st.Get_elements(MPI.INT)}")
out("status.attrs", f"{st.source} {st.tag} {st.error}")

finish()
