"""Pickle-based communication using protocol 5 (as ``mpi4py.util.pkl5``).

Every object travels as a short header message (the lengths of the pickle
stream and of each out-of-band buffer, as int64) followed by one message per
buffer, all with the same tag, sent with the uppercase (buffer) API.  A lock
per communicator keeps the messages of concurrent sends and receives from
interleaving.  Collectives are built from point-to-point calls on a private
duplicate of the communicator (``MPI._commctx_intra``) with a fresh tag.

``pickle`` and ``_bigmpi`` are module globals looked up at call time so they
can be swapped (tests do).
"""

import struct as _struct

from .. import MPI
from ..MPI import (ANY_SOURCE, ANY_TAG, PROC_NULL, ROOT, Pickle, Status,  # noqa: F401
                   _comm_lock, _commctx_inter, _commctx_intra)

__all__ = ["pickle", "Request", "Message", "Comm", "Intracomm", "Intercomm"]

pickle = Pickle()

_ICODE = "q"                      # header item type (int64 lengths)
_ISIZE = _struct.calcsize(_ICODE)


class _BigMPI:
    """Describe a byte buffer as (buf, count, datatype), with a contiguous
    type for counts past the largest count argument; the cache frees those
    types on exit."""

    blocksize = (1 << 63) - 1 if MPI.Get_version() >= (4, 0) else (1 << 31) - 1

    def __init__(self):
        self.cache = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for dtype in self.cache.values():
            dtype.Free()
        self.cache.clear()

    def __call__(self, buf):
        buf = memoryview(buf)
        count = buf.nbytes
        if count <= self.blocksize:
            return (buf, count, MPI.BYTE)
        dtype = self.cache.get(count)
        if dtype is None:
            dtype = self.cache[count] = MPI.BYTE.Create_contiguous(count).Commit()
        return (buf, 1, dtype)


_bigmpi = _BigMPI()


# -- helpers ------------------------------------------------------------------

def _dumps(obj):
    return pickle.dumps_oob(obj)


def _loads(data, bufs):
    return pickle.loads_oob(data, bufs)


def _itype():
    return MPI.Datatype.fromcode(_ICODE)


def _ipack(values):
    return _struct.pack(f"{len(values)}{_ICODE}", *values)


def _ialloc(n):
    return bytearray(n * _ISIZE)


def _iunpack(raw):
    return _struct.unpack(f"{len(raw) // _ISIZE}{_ICODE}", raw)


def _alloc(n):
    buffer = getattr(MPI, "buffer", None)
    if buffer is not None:
        return buffer.allocate(n)
    return bytearray(n)


def _header(data, bufs):
    return [len(data)] + [memoryview(b).nbytes for b in bufs]


def _root_error(comm):
    comm.Call_errhandler(MPI.ERR_ROOT)
    raise MPI.Exception(MPI.ERR_ROOT)


# -- point to point -------------------------------------------------------------

def _send_raw(comm, send, data, bufs, dest, tag):
    # pylint: disable=too-many-arguments,too-many-positional-arguments
    send(comm, (_ipack(_header(data, bufs)), _itype()), dest, tag)
    with _bigmpi as big:
        send(comm, big(data), dest, tag)
        for b in bufs:
            send(comm, big(b), dest, tag)


def _send(comm, send, obj, dest, tag):
    if dest == PROC_NULL:
        send(comm, (None, 0, MPI.BYTE), dest, tag)
        return
    data, bufs = _dumps(obj)
    with _comm_lock(comm, "send"):
        _send_raw(comm, send, data, bufs, dest, tag)


def _isend(comm, isend, obj, dest, tag):
    reqs = []
    _send(comm, lambda c, b, d, t: reqs.append(isend(c, b, d, t)), obj, dest, tag)
    return Request(reqs)


def _recv_raw(comm, recv, buf, source, tag, status=None):
    # pylint: disable=too-many-arguments,too-many-positional-arguments
    if status is None:
        status = Status()
    MPI.Comm.Probe(comm, source, tag, status)
    source, tag = status.Get_source(), status.Get_tag()
    itype = _itype()
    raw = _ialloc(status.Get_elements(itype))
    MPI.Comm.Recv(comm, (raw, itype), source, tag, status)
    info = _iunpack(raw)
    data = None
    if buf is not None:
        # a user buffer is used for the stream when it is large enough
        buf = memoryview(buf).cast("B")
        if len(buf) >= info[0]:
            data = buf[:info[0]]
    if data is None:
        data = _alloc(info[0])
    bufs = [_alloc(n) for n in info[1:]]
    with _bigmpi as big:
        recv(comm, big(data), source, tag)
        for b in bufs:
            recv(comm, big(b), source, tag)
    status.Set_elements(MPI.BYTE, sum(info))
    return data, bufs


def _recv(comm, recv, buf, source, tag, status):
    # pylint: disable=too-many-arguments,too-many-positional-arguments
    if source == PROC_NULL:
        recv(comm, (None, 0, MPI.BYTE), source, tag, status)
        return None
    with _comm_lock(comm, "recv"):
        data, bufs = _recv_raw(comm, recv, buf, source, tag, status)
    return _loads(data, bufs)


def _mprobe(comm, mprobe, source, tag, status):
    if source == PROC_NULL:
        return Message([MPI.Comm.Mprobe(comm, source, tag, status)])
    if status is None:
        status = Status()
    with _comm_lock(comm, "recv"):
        first = mprobe(comm, source, tag, status)
        if first is None:
            return None
        msgs = [first]
        source, tag = status.Get_source(), status.Get_tag()
        nbytes = 0
        for _ in range(status.Get_elements(_itype())):
            msgs.append(MPI.Comm.Mprobe(comm, source, tag, status))
            nbytes += status.Get_elements(MPI.BYTE)
        status.Set_elements(MPI.BYTE, nbytes)
        return Message(msgs)


def _mrecv_header(msg, count, status=None):
    itype = _itype()
    raw = _ialloc(count)
    MPI.Message.Recv(msg, (raw, itype), status)
    return _iunpack(raw)


def _mrecv_data(message, mrecv, status=None):
    if message[0] == MPI.MESSAGE_NO_PROC:
        _mrecv_header(message[0], 0, status)
        mrecv(MPI.MESSAGE_NO_PROC, (None, 0, MPI.BYTE))
        data, bufs = _dumps(None)
        return bytearray(data), bufs
    msgs = iter(message)
    info = _mrecv_header(next(msgs), len(message) - 1, status)
    data = _alloc(info[0])
    bufs = [_alloc(n) for n in info[1:]]
    with _bigmpi as big:
        mrecv(next(msgs), big(data))
        for b in bufs:
            mrecv(next(msgs), big(b))
    if status is not None:
        status.Set_elements(MPI.BYTE, sum(info))
    return data, bufs


def _mrecv(message, status):
    data, bufs = _mrecv_data(message, MPI.Message.Recv, status)
    return _loads(data, bufs)


def _imrecv(message):
    reqs = []
    data, bufs = _mrecv_data(message, lambda m, b: reqs.append(MPI.Message.Irecv(m, b)))
    request = Request(reqs)
    request._data_bufs = (data, bufs)
    return request


def _req_load(request):
    pending = getattr(request, "_data_bufs", None)
    if pending is None:
        return None
    if request == MPI.REQUEST_NULL:
        del request._data_bufs
    return _loads(*pending)


def _test(request, test, status):
    flag = test(request, None if status is None else [status])
    return (flag, _req_load(request)) if flag else (flag, None)


def _testall(requests, testall, statuses):
    if isinstance(statuses, list):
        statuses.extend(Status() for _ in range(len(requests) - len(statuses)))
    flat = [r for req in requests for r in req]
    flat_st = None
    if statuses is not None:
        flat_st = [st for req, st in zip(requests, statuses) for _ in req]
    flag = testall(flat, flat_st)
    if flag:
        return flag, [_req_load(req) for req in requests]
    return flag, None


# -- collectives ---------------------------------------------------------------

def _bcast_intra_raw(comm, bcast, data, bufs, root):
    itype = _itype()
    if comm.Get_rank() == root:
        info = _header(data, bufs)
        bcast(comm, (_ipack([len(info)]), itype), root)
        bcast(comm, (_ipack(info), itype), root)
    else:
        raw = _ialloc(1)
        bcast(comm, (raw, itype), root)
        raw = _ialloc(_iunpack(raw)[0])
        bcast(comm, (raw, itype), root)
        info = _iunpack(raw)
        data = _alloc(info[0])
        bufs = [_alloc(n) for n in info[1:]]
    with _bigmpi as big:
        bcast(comm, big(data), root)
        for b in bufs:
            bcast(comm, big(b), root)
    return data, bufs


def _bcast_intra(comm, bcast, obj, root):
    data, bufs = _dumps(obj if comm.Get_rank() == root else None)
    with _comm_lock(comm, "bcast"):
        data, bufs = _bcast_intra_raw(comm, bcast, data, bufs, root)
    return _loads(data, bufs)


def _bcast_inter(comm, bcast, obj, root):
    rank = comm.Get_rank()
    rsize = comm.Get_remote_size()
    dup, tag, local, _ = _commctx_inter(comm)
    if root == PROC_NULL:
        return None
    if root == ROOT:
        data, bufs = _dumps(obj)
        _send_raw(dup, MPI.Comm.Send, data, bufs, 0, tag)
        return None
    if 0 <= root < rsize:
        # the remote root sends to local rank 0, which broadcasts locally
        if rank == 0:
            data, bufs = _recv_raw(dup, MPI.Comm.Recv, None, root, tag)
        else:
            data, bufs = _dumps(None)
        with _comm_lock(local, "bcast"):
            data, bufs = _bcast_intra_raw(local, bcast, data, bufs, 0)
        return _loads(data, bufs)
    return _root_error(dup)


def _bcast(comm, bcast, obj, root):
    if comm.Is_inter():
        return _bcast_inter(comm, bcast, obj, root)
    return _bcast_intra(comm, bcast, obj, root)


def _p2p():
    """(pending sends, nonblocking send, blocking receive) for collectives."""
    reqs = []

    def send(comm, buf, dest, tag):
        reqs.append(MPI.Comm.Isend(comm, buf, dest, tag))

    def recv(comm, buf, source, tag):
        MPI.Comm.Recv(comm, buf, source, tag)

    return reqs, send, recv


def _context(comm):
    """(duplicate, tag, size of the group data goes to/comes from)."""
    if comm.Is_inter():
        dup, tag, *_ = _commctx_inter(comm)
        return dup, tag, comm.Get_remote_size()
    dup, tag = _commctx_intra(comm)
    return dup, tag, comm.Get_size()


def _rooted_roles(comm, root, size, root_sends):
    """(sends, receives) of this process in a rooted collective."""
    if comm.Is_inter():
        if root == PROC_NULL:
            return False, False
        if root == ROOT:
            return root_sends, not root_sends
        if 0 <= root < size:
            return not root_sends, root_sends
        return _root_error(comm)
    if root < 0 or root >= size:
        return _root_error(comm)
    me = comm.Get_rank() == root
    return (me if root_sends else True), (True if root_sends else me)


def _recv_objs(dup, recv, sources, tag):
    out = []
    for source in sources:
        data, bufs = _recv_raw(dup, recv, None, source, tag)
        out.append(_loads(data, bufs))
    return out


def _gather(comm, obj, root):
    reqs, send, recv = _p2p()
    dup, tag, size = _context(comm)
    sends, recvs = _rooted_roles(dup, root, size, False)
    if sends:
        data, bufs = _dumps(obj)
        _send_raw(dup, send, data, bufs, root, tag)
    objs = _recv_objs(dup, recv, range(size), tag) if recvs else None
    MPI.Request.Waitall(reqs)
    return objs


def _objlist(objs, size):
    if objs is None:
        return [None] * size
    if not isinstance(objs, list):
        objs = list(objs)
    if len(objs) != size:
        raise ValueError(f"expecting {size} items, got {len(objs)}")
    return objs


def _scatter(comm, objs, root):
    reqs, send, recv = _p2p()
    dup, tag, size = _context(comm)
    sends, recvs = _rooted_roles(dup, root, size, True)
    if sends:
        for dest, item in enumerate(_objlist(objs, size)):
            data, bufs = _dumps(item)
            _send_raw(dup, send, data, bufs, dest, tag)
    obj = _recv_objs(dup, recv, [root], tag)[0] if recvs else None
    MPI.Request.Waitall(reqs)
    return obj


def _allgather(comm, obj):
    reqs, send, recv = _p2p()
    dup, tag, size = _context(comm)
    data, bufs = _dumps(obj)
    for dest in range(size):
        _send_raw(dup, send, data, bufs, dest, tag)
    objs = _recv_objs(dup, recv, range(size), tag)
    MPI.Request.Waitall(reqs)
    return objs


def _alltoall(comm, objs):
    reqs, send, recv = _p2p()
    dup, tag, size = _context(comm)
    for dest, item in enumerate(_objlist(objs, size)):
        data, bufs = _dumps(item)
        _send_raw(dup, send, data, bufs, dest, tag)
    objs = _recv_objs(dup, recv, range(size), tag)
    MPI.Request.Waitall(reqs)
    return objs


# -- public classes ---------------------------------------------------------------

class Request(tuple):
    """Request: the tuple of the MPI requests of one object's messages."""

    def __new__(cls, request=None):
        if request is None:
            request = (MPI.REQUEST_NULL,)
        elif isinstance(request, MPI.Request):
            request = (request,)
        return super().__new__(cls, request)

    def __eq__(self, other):
        if isinstance(other, Request):
            return tuple(self) == tuple(other)
        if isinstance(other, MPI.Request):
            return all(req == other for req in self)
        return NotImplemented

    def __ne__(self, other):
        if isinstance(other, Request):
            return tuple(self) != tuple(other)
        if isinstance(other, MPI.Request):
            return any(req != other for req in self)
        return NotImplemented

    def __bool__(self):
        return any(req for req in self)

    def Free(self) -> None:  # noqa: N802
        """Free a communication request."""
        for req in self:
            req.Free()

    def free(self) -> None:
        """Free a communication request."""
        for req in self:
            req.free()

    def cancel(self):
        """Cancel a communication request."""
        for req in self:
            req.Cancel()

    def get_status(self, status=None):
        """Non-destructive test for the completion of a request."""
        statuses = [status] + [None] * max(len(self) - 1, 0)
        return all([MPI.Request.Get_status(r, s) for r, s in zip(self, statuses)])

    def test(self, status=None):
        """Test for the completion of a request."""
        return _test(self, MPI.Request.Testall, status)

    def wait(self, status=None):
        """Wait for a request to complete."""
        return _test(self, MPI.Request.Waitall, status)[1]

    @classmethod
    def get_status_all(cls, requests, statuses=None):
        """Non-destructive test for the completion of all requests."""
        if statuses is None:
            return all([req.get_status() for req in requests])
        statuses += [Status() for _ in range(len(statuses), len(requests))]
        return all([req.get_status(st) for req, st in zip(requests, statuses)])

    @classmethod
    def testall(cls, requests, statuses=None):
        """Test for the completion of all requests."""
        return _testall(requests, MPI.Request.Testall, statuses)

    @classmethod
    def waitall(cls, requests, statuses=None):
        """Wait for all requests to complete."""
        return _testall(requests, MPI.Request.Waitall, statuses)[1]


class Message(tuple):
    """Matched message: the tuple of the MPI messages of one object."""

    def __new__(cls, message=None):
        if message is None:
            message = (MPI.MESSAGE_NULL,)
        elif isinstance(message, MPI.Message):
            message = (message,)
        return super().__new__(cls, message)

    def __eq__(self, other):
        if isinstance(other, Message):
            return tuple(self) == tuple(other)
        if isinstance(other, MPI.Message):
            return all(msg == other for msg in self)
        return NotImplemented

    def __ne__(self, other):
        if isinstance(other, Message):
            return tuple(self) != tuple(other)
        if isinstance(other, MPI.Message):
            return any(msg != other for msg in self)
        return NotImplemented

    def __bool__(self):
        return any(msg for msg in self)

    def free(self) -> None:
        """Do nothing."""
        for msg in self:
            msg.free()

    def recv(self, status=None):
        """Blocking receive of matched message."""
        return _mrecv(self, status)

    def irecv(self):
        """Nonblocking receive of matched message."""
        return _imrecv(self)

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking test for a matched message."""
        return _mprobe(comm, MPI.Comm.Mprobe, source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking test for a matched message."""
        return _mprobe(comm, MPI.Comm.Improbe, source, tag, status)


class Comm(MPI.Comm):
    """Communicator whose lowercase methods use the pkl5 protocol."""

    def send(self, obj, dest, tag=0):
        """Blocking send in standard mode."""
        _send(self, MPI.Comm.Send, obj, dest, tag)

    def bsend(self, obj, dest, tag=0):
        """Blocking send in buffered mode."""
        _send(self, MPI.Comm.Bsend, obj, dest, tag)

    def ssend(self, obj, dest, tag=0):
        """Blocking send in synchronous mode."""
        MPI.Request.Waitall(list(_isend(self, MPI.Comm.Issend, obj, dest, tag)))

    def isend(self, obj, dest, tag=0):
        """Nonblocking send in standard mode."""
        return _isend(self, MPI.Comm.Isend, obj, dest, tag)

    def ibsend(self, obj, dest, tag=0):
        """Nonblocking send in buffered mode."""
        return _isend(self, MPI.Comm.Ibsend, obj, dest, tag)

    def issend(self, obj, dest, tag=0):
        """Nonblocking send in synchronous mode."""
        return _isend(self, MPI.Comm.Issend, obj, dest, tag)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking receive."""
        return _recv(self, MPI.Comm.Recv, buf, source, tag, status)

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):  # noqa: ARG002
        """Nonblocking receive (not available: the size is unknown)."""
        raise RuntimeError("unsupported")

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None,
                 source=ANY_SOURCE, recvtag=ANY_TAG, status=None):
        """Send and receive."""
        # pylint: disable=too-many-arguments,too-many-positional-arguments
        sreq = _isend(self, MPI.Comm.Isend, sendobj, dest, sendtag)
        robj = _recv(self, MPI.Comm.Recv, recvbuf, source, recvtag, status)
        MPI.Request.Waitall(list(sreq))
        return robj

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking test for a matched message."""
        return _mprobe(self, MPI.Comm.Mprobe, source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking test for a matched message."""
        return _mprobe(self, MPI.Comm.Improbe, source, tag, status)

    def bcast(self, obj, root=0):
        """Broadcast."""
        return _bcast(self, MPI.Comm.Bcast, obj, root)

    def gather(self, sendobj, root=0):
        """Gather."""
        return _gather(self, sendobj, root)

    def scatter(self, sendobj, root=0):
        """Scatter."""
        return _scatter(self, sendobj, root)

    def allgather(self, sendobj):
        """Gather to All."""
        return _allgather(self, sendobj)

    def alltoall(self, sendobj):
        """All to All Scatter/Gather."""
        return _alltoall(self, sendobj)


class Intracomm(Comm, MPI.Intracomm):
    """Intracommunicator."""


class Intercomm(Comm, MPI.Intercomm):
    """Intercommunicator."""
