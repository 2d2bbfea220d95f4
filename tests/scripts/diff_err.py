"""Error paths: the exception class each bad call raises (every rank makes the
same bad call, so no rank waits for another)."""
import numpy as np
from _mpi import MPI
from diff_util import RANK, SIZE, call, finish, out

comm = MPI.COMM_WORLD
r, n = RANK, SIZE
a = np.zeros(4, "i4")

# bad ranks / tags / roots
call("Send.badrank", comm.Send, a, n)
call("Send.negrank", comm.Send, a, -5)
call("Send.anysource", comm.Send, a, MPI.ANY_SOURCE)
call("Recv.badrank", comm.Recv, a, n + 3)
call("Send.badtag", comm.Send, a, 0, -7)
call("Send.anytag", comm.Send, a, 0, MPI.ANY_TAG)
call("Send.hugetag", comm.Send, a, 0, comm.Get_attr(MPI.TAG_UB) + 1)
call("Recv.badtag", comm.Recv, a, 0, -9)
call("Isend.badrank", comm.Isend, a, n)
call("Irecv.badtag", comm.Irecv, a, 0, -3)
call("send.badrank", comm.send, 1, n)
call("recv.badrank", comm.recv, None, n)
call("Probe.badrank", comm.Probe, n)
call("Iprobe.badtag", comm.Iprobe, 0, -4)
call("Sendrecv.badrank", comm.Sendrecv, a, n, 0, a.copy(), 0)
for name, args in (("Bcast", (a,)), ("Gather", (a, np.zeros(4 * n, "i4"))),
                   ("Scatter", (np.zeros(4 * n, "i4"), a)),
                   ("Reduce", (a, a.copy(), MPI.SUM))):
    call(f"{name}.badroot", getattr(comm, name), *args, root=n)
    call(f"{name}.negroot", getattr(comm, name), *args, root=-1)
call("bcast.badroot", comm.bcast, 1, n)
call("gather.badroot", comm.gather, 1, -2)
call("reduce.badroot", comm.reduce, 1, MPI.SUM, n)

# wrong counts (local checks)
call("Allreduce.mismatch", comm.Allreduce, np.zeros(3, "i4"), np.zeros(4, "i4"), MPI.SUM)
# every rank sends a block larger than its receive blocks: truncation everywhere
call("Allgather.bigsend", comm.Allgather, np.zeros(3, "i4"), np.zeros(2 * n, "i4"))
call("Allreduce.typemismatch", comm.Allreduce, np.zeros(4, "i4"), np.zeros(4, "f8"), MPI.SUM)
if r == 0:   # only the root checks the receive count
    call("Reduce.mismatch", comm.Reduce, np.zeros(3, "i4"), np.zeros(4, "i4"), MPI.SUM, 0)
call("Alltoall.notdiv", comm.Alltoall, np.zeros(n + 1 if n > 1 else 3, "i4"),
     np.zeros(n + 1 if n > 1 else 3, "i4"))
call("RSB.IP.notdiv", comm.Reduce_scatter_block, MPI.IN_PLACE, np.zeros(2 * n + 1, "i4"),
     MPI.SUM)
call("RS.badcounts", comm.Reduce_scatter, np.zeros(4, "i4"), np.zeros(1, "i4"), [1] * (n + 1),
     MPI.SUM)
call("Send.negcount", comm.Send, [a, -1, MPI.INT], 0)

# datatypes
call("Send.unknown_dtype", comm.Send, np.zeros(2, dtype="V3"), 0)
call("Send.object_dtype", comm.Send, np.zeros(2, dtype=object), 0)
call("Send.datatype_null", comm.Send, [a, MPI.DATATYPE_NULL], 0)
call("Allreduce.str", comm.Allreduce, "abc", bytearray(3), MPI.SUM)
call("Send.notbuffer", comm.Send, 12345, 0)
call("Send.readonly_recv", comm.Recv, b"xxxx", 0, 0)
call("Allreduce.readonly", comm.Allreduce, a, b"xxxxxxxxxxxxxxxx", MPI.SUM)
call("Allreduce.noop", comm.Allreduce, a, a.copy(), None)
call("Allreduce.notop", comm.Allreduce, a, a.copy(), "sum")
call("Allreduce.opnull", comm.Allreduce, a, a.copy(), MPI.OP_NULL)
call("Reduce_local.badop", MPI.BAND.Reduce_local, np.zeros(2), np.zeros(2))
call("Reduce_local.mismatch", MPI.SUM.Reduce_local, np.zeros(2), np.zeros(3))
t = MPI.INT.Dup()
t.Free()
call("Datatype.free.again", t.Free)
call("Datatype.predef.free", MPI.INT.Free)
ct = MPI.INT.Create_contiguous(2)
call("Send.uncommitted", comm.Send, [a, 1, ct], 0)
ct.Free()

# communicator use after Free, COMM_NULL
d = comm.Dup()
d.Free()
out("freed.eq_null", d == MPI.COMM_NULL)
call("freed.Get_size", d.Get_size)
call("freed.Barrier", d.Barrier)
call("freed.Send", d.Send, a, 0)
call("freed.Free", d.Free)
call("null.Get_rank", MPI.COMM_NULL.Get_rank)
call("null.Get_size", MPI.COMM_NULL.Get_size)
call("null.Barrier", MPI.COMM_NULL.Barrier)
call("null.Dup", MPI.COMM_NULL.Dup)
call("null.bcast", MPI.COMM_NULL.bcast, 1)
call("null.Free", MPI.COMM_NULL.Free)
call("world.Free", comm.Free)
call("self.Free", MPI.COMM_SELF.Free)
call("null.Get_name", MPI.COMM_NULL.Get_name)
call("null.Compare", MPI.Comm.Compare, MPI.COMM_NULL, comm)
call("Comm.Compare.null2", MPI.Comm.Compare, MPI.COMM_NULL, MPI.COMM_NULL)

# groups
g = comm.Get_group()
call("group.Incl.bad", g.Incl, [n])
# not compared: g.Incl([0, 0]) succeeds under MPICH (a group with a repeated
# process, erroneous per MPI 4.0 section 7.3.2); erdmampi raises ERR_RANK.
call("group.Excl.bad", g.Excl, [n + 1])
call("group.Range_incl.bad", g.Range_incl, [(0, n, 1)])
call("group.Translate.bad", MPI.Group.Translate_ranks, g, [n], g)
call("group.null.size", MPI.GROUP_NULL.Get_size)
call("Create.badgroup", comm.Create, MPI.GROUP_NULL)
g.Free()
call("group.freed.size", g.Get_size)

# requests, messages, statuses
call("Request.null.Free", MPI.REQUEST_NULL.Free)
call("Message.null.Recv", MPI.MESSAGE_NULL.Recv, a)
call("Status.count.null_type", MPI.Status().Get_count, MPI.DATATYPE_NULL)
call("Waitall.notlist", MPI.Request.Waitall, 5)

# attributes, keyvals, names
call("Get_attr.badkey", comm.Get_attr, 123456)
call("Get_attr.invalid", comm.Get_attr, MPI.KEYVAL_INVALID)
call("Delete_attr.badkey", comm.Delete_attr, 123456)
call("Set_name.int", comm.Set_name, 5)
call("Split_type.bad", comm.Split_type, 123456)
call("Split.badcolor", comm.Split, -5, 0)
call("Create_group.null", comm.Create_group, MPI.GROUP_NULL)
call("Get_error_string.5", MPI.Get_error_string, 5, show=lambda s: str(bool(s)))
call("Get_error_class.bad", MPI.Get_error_class, 2 ** 20)
call("Get_error_string.ok", MPI.Get_error_string, MPI.ERR_TRUNCATE, show=lambda s: str(bool(s)))
call("Exception.class", lambda: MPI.Exception(MPI.ERR_RANK).Get_error_class())
call("Exception.code", lambda: MPI.Exception(MPI.ERR_RANK).Get_error_code())
call("Exception.eq", lambda: MPI.Exception(MPI.ERR_RANK) == MPI.ERR_RANK)
call("Exception.int", lambda: int(MPI.Exception(MPI.ERR_TAG)))
call("Exception.bases", lambda: [c.__name__ for c in MPI.Exception.__mro__])

comm.Barrier()
finish()
