"""MPI handles kept in C memory: MPI._sizeof, MPI._addressof, MPI._handleof.

Every handle object keeps its handle in one unsigned 64-bit field
(``_objmodel.HandleBase``); ctypes reads a handle at ``MPI._addressof(obj)``
and writes one into a new null object, which then is that MPI object: it
compares equal and works in MPI calls (mpi4py's test_ctypes and test_cffi
check the equality; these tests check the rest).
"""
import ctypes

import numpy as np
import pytest

MPI = pytest.importorskip("erdmampi.MPI")

from erdmampi._objmodel import HandleBase  # noqa: E402

KINDS = [MPI.Datatype, MPI.Request, MPI.Prequest, MPI.Grequest, MPI.Info, MPI.Errhandler,
         MPI.Session, MPI.Group, MPI.Win, MPI.Op, MPI.File, MPI.Message, MPI.Comm,
         MPI.Intracomm, MPI.Topocomm, MPI.Cartcomm, MPI.Graphcomm, MPI.Distgraphcomm,
         MPI.Intercomm]

PREDEFINED = [MPI.DATATYPE_NULL, MPI.INT, MPI.DOUBLE, MPI.REQUEST_NULL, MPI.INFO_NULL,
              MPI.INFO_ENV, MPI.ERRHANDLER_NULL, MPI.ERRORS_RETURN, MPI.ERRORS_ARE_FATAL,
              MPI.GROUP_NULL, MPI.GROUP_EMPTY, MPI.WIN_NULL, MPI.OP_NULL, MPI.SUM, MPI.MIN,
              MPI.MAX, MPI.FILE_NULL, MPI.MESSAGE_NULL, MPI.MESSAGE_NO_PROC, MPI.COMM_NULL,
              MPI.COMM_SELF, MPI.COMM_WORLD, MPI.SESSION_NULL]


def read(obj):
    return ctypes.c_uint64.from_address(MPI._addressof(obj)).value


def write(obj, handle):
    ctypes.c_uint64.from_address(MPI._addressof(obj)).value = handle


def copy_through_memory(obj):
    """``type(obj)()`` with ``obj``'s handle written into its memory."""
    new = type(obj)()
    write(new, read(obj))
    return new


def test_every_kind_keeps_an_8_byte_handle_in_c_memory():
    assert MPI._sizeof(MPI.Status) == MPI._sizeof(MPI.Status()) == 20
    for kind in KINDS:
        assert issubclass(kind, HandleBase), kind
        assert MPI._sizeof(kind) == ctypes.sizeof(ctypes.c_uint64), kind
    # the classes' own handle names are the C field's descriptor
    h = HandleBase.__dict__["_h"]
    for kind in (MPI.Datatype, MPI.Op, MPI.Comm):
        assert kind._handle is h
    for name in ("_sizeof", "_addressof", "_handleof"):
        with pytest.raises(TypeError):
            getattr(MPI, name)(None)
    with pytest.raises(TypeError):
        MPI._addressof(MPI.Datatype)


def test_handle_memory_holds_the_handle():
    for obj in PREDEFINED:
        addr = MPI._addressof(obj)
        assert addr != 0 and addr == MPI._addressof(obj)
        assert read(obj) == MPI._handleof(obj) == obj.handle & (2**64 - 1), obj
    # the values are MPICH's (a negative C int handle sign-extended)
    assert MPI._handleof(MPI.COMM_WORLD) == 0x44000000
    assert MPI._handleof(MPI.WIN_NULL) == 0x20000000
    win = MPI.Win.Create(MPI.Alloc_mem(8), 1, MPI.INFO_NULL, MPI.COMM_SELF)
    try:
        assert read(win) == MPI._handleof(win) == win.handle >= 0xffffffffa0000000
        assert MPI.Win.fromhandle(ctypes.c_int32(read(win) & 0xffffffff).value) == win
    finally:
        win.Free()
    assert read(win) == MPI._handleof(MPI.WIN_NULL)


def test_written_predefined_handles_make_equal_objects():
    for obj in PREDEFINED:
        new = type(obj)()
        assert new is not obj
        write(new, read(obj))
        assert new == obj and bool(new) == bool(obj), obj
        assert new.handle == obj.handle


def test_written_datatype_is_that_datatype():
    vec = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    new = copy_through_memory(vec)
    assert new == vec and new.size == 24 and new.extent == 40
    assert new.Get_envelope() == vec.Get_envelope()
    src, dst = np.arange(6.0), np.zeros(6)
    MPI.COMM_SELF.Sendrecv([src, 1, new], 0, 3, [dst, 1, new], 0, 3)
    assert dst.tolist() == [0, 0, 2, 0, 4, 0]
    new.Free()              # frees the handle both objects name
    assert not new and read(new) == MPI._handleof(MPI.DATATYPE_NULL)
    with pytest.raises(MPI.Exception):
        MPI.Datatype.fromhandle(vec.handle)
    assert copy_through_memory(MPI.INT).Get_name() == "MPI_INT"


def test_written_info_op_errhandler():
    info = MPI.Info.Create({"a": "1"})
    try:
        new = copy_through_memory(info)
        new.Set("b", "2")
        assert info.Get("b") == "2" and new.Get("a") == "1"
    finally:
        info.Free()
    op = MPI.Op.Create(lambda a, b, t: np.copyto(np.frombuffer(b, "d"),
                                                  np.frombuffer(a, "d") * np.frombuffer(b, "d")),
                       commute=True)
    try:
        new = copy_through_memory(op)
        assert new == op and new.Is_commutative() and not new.is_predefined
        out = np.full(2, 3.0)
        new.Reduce_local(np.full(2, 2.0), out)
        assert out.tolist() == [6.0, 6.0]
        assert copy_through_memory(MPI.MAX).Reduce_local(np.ones(1), out[:1]) is None
    finally:
        op.Free()
    eh = MPI.Comm.Create_errhandler(lambda comm, code: None)
    new = copy_through_memory(eh)
    assert new == eh
    eh.Free()


def test_written_file_session_win(tmp_path):
    fh = MPI.File.Open(MPI.COMM_SELF, str(tmp_path / "f"), MPI.MODE_CREATE | MPI.MODE_RDWR)
    try:
        new = copy_through_memory(fh)
        assert new == fh
        new.Write_at(0, np.arange(4, dtype="i"))
        out = np.zeros(4, dtype="i")
        fh.Read_at(0, out)
        assert out.tolist() == [0, 1, 2, 3]
    finally:
        fh.Close()
    assert not fh and read(fh) == MPI._handleof(MPI.FILE_NULL)
    session = MPI.Session.Init()
    try:
        new = copy_through_memory(session)
        assert new == session and new.Get_num_psets() == session.Get_num_psets()
    finally:
        session.Finalize()
    mem = MPI.Alloc_mem(16)
    win = MPI.Win.Create(mem, 1, MPI.INFO_NULL, MPI.COMM_SELF)
    try:
        new = copy_through_memory(win)
        new.Fence()
        new.Put(np.full(4, 7, dtype="i"), 0)
        new.Fence()
        assert np.frombuffer(mem, "i").tolist() == [7, 7, 7, 7]
    finally:
        win.Free()
    MPI.Free_mem(mem)


def test_written_communicator_and_group_work():
    dup = MPI.COMM_SELF.Dup()
    try:
        dup.Set_name("dup")
        new = copy_through_memory(dup)
        assert type(new) is MPI.Intracomm and new == dup and dup == new
        assert new.Get_name() == "dup" and new.Get_size() == 1 and new.Get_rank() == 0
        assert new.allreduce(5) == 5
        buf = np.zeros(3)
        req = new.Irecv(buf, 0, 7)
        dup.Send(np.arange(3.0), 0, 7)       # same communicator: the message matches
        req.Wait()
        assert buf.tolist() == [0.0, 1.0, 2.0]
        group = dup.Get_group()
        gnew = copy_through_memory(group)
        assert gnew == group and gnew.Get_size() == 1
        assert MPI.Group.Translate_ranks(gnew, [0], group) == [0]
        group.Free()
        assert read(group) == MPI._handleof(MPI.GROUP_NULL)
    finally:
        dup.Free()
    assert not dup and read(dup) == MPI._handleof(MPI.COMM_NULL)
    # a freed communicator's handle makes nothing
    stale = MPI.Intracomm()
    write(stale, MPI._handleof(new))
    assert not stale and stale == MPI.COMM_NULL


def test_written_request_completes():
    buf = np.zeros(2)
    req = MPI.COMM_SELF.Irecv(buf, 0, 11)
    new = copy_through_memory(req)
    assert new == req and new and read(new) == MPI._handleof(req) != 0
    MPI.COMM_SELF.Send(np.ones(2), 0, 11)
    status = MPI.Status()
    new.Wait(status)
    assert buf.tolist() == [1.0, 1.0] and status.Get_source() == 0 and status.Get_tag() == 11
    assert not new and read(new) == 0       # deallocated: the null handle
    # completion nulls the handle in memory: a completed request does not take
    # back the request through a copy that shares its handle
    req = MPI.COMM_SELF.Irecv(buf, 0, 14)
    copy = MPI.Request(req)
    assert req.py2f() == copy.py2f() != 0
    MPI.COMM_SELF.Send(np.ones(2), 0, 14)
    req.Wait()
    assert read(req) == 0 and not req and req.py2f() == 0
    copy.Wait()
    # the list calls see a written request too
    req = MPI.COMM_SELF.Irecv(buf, 0, 12)
    new = copy_through_memory(req)
    MPI.COMM_SELF.Send(np.full(2, 4.0), 0, 12)
    assert MPI.Request.Waitany([MPI.REQUEST_NULL, new]) == 1
    assert buf.tolist() == [4.0, 4.0]
    # a persistent request: the written object starts and completes it
    preq = MPI.COMM_SELF.Recv_init(buf, 0, 13)
    pnew = copy_through_memory(preq)
    assert type(pnew) is MPI.Prequest and pnew == preq
    pnew.Start()
    MPI.COMM_SELF.Send(np.full(2, 5.0), 0, 13)
    pnew.Wait()
    assert buf.tolist() == [5.0, 5.0]
    preq.Free()


def test_written_message_receives():
    MPI.COMM_SELF.Send(np.full(2, 9.0), 0, 21)
    msg = MPI.COMM_SELF.Mprobe(0, 21)
    new = copy_through_memory(msg)
    assert new == msg and new
    buf = np.zeros(2)
    new.Recv(buf)
    assert buf.tolist() == [9.0, 9.0]
    assert not new and read(new) == MPI._handleof(MPI.MESSAGE_NULL)
    noproc = copy_through_memory(MPI.MESSAGE_NO_PROC)
    assert noproc == MPI.MESSAGE_NO_PROC
    noproc.Recv(None)
    assert not noproc
