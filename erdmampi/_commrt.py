"""Runtime state under the communicators: the engine (``_rt``), handles,
the per-call collective transport (``_CollTransport``), constants and the
buffer/collective helpers shared by the ``comm_*`` mixins and ``comm``.

Lowest layer of the communicator modules: it imports none of them.
"""

import itertools
import os
import socket
import sys
import threading
from pickle import loads as _std_loads

import numpy as np

from . import _collsched, _engine, bootstrap
from . import collectives as coll
from .collectives import sched as _sched_algos
from . import compression as _cz
from .collectives import compressed as _czcoll
from .buffers import IN_PLACE, BOTTOM, is_in_place, message_vector
from . import buffers as _buffers
from .exceptions import (ERR_ARG, ERR_BUFFER, ERR_COMM, ERR_COUNT, ERR_KEYVAL, ERR_OP,
                         ERR_OTHER, ERR_RANK, ERR_ROOT, ERR_TAG, ERR_TRUNCATE, ERR_TYPE,
                         Exception as MPIException, ERR_LASTCODE, raise_error)
from .group import Group, IDENT, CONGRUENT, SIMILAR, UNEQUAL, _set_world_rank
from .message import Message, MESSAGE_NO_PROC
from .msgpickle import pickle as _default_pickle
from .op import Op
from .op import SUM as _SUM
from .request import Request, Prequest, _DoneOp, _EngineOp, _ThreadOp, engine_exception, \
    error_class, error_text, raise_status_code
from .status import Status

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1
ROOT = -3
UNDEFINED = -32766
TAG_UB_VALUE = 2 ** 28 - 1          # MPICH's value
COMM_TYPE_SHARED = 1
COMM_TYPE_HW_GUIDED = 2
COMM_TYPE_HW_UNGUIDED = 3
COMM_TYPE_RESOURCE_GUIDED = -32766

# Attribute keys (mpi4py + MPICH values)
TAG_UB = 1681915905
IO = 1681915909
WTIME_IS_GLOBAL = 1681915911
UNIVERSE_SIZE = 1681915913
LASTUSEDCODE = 1681915915
APPNUM = 1681915917
KEYVAL_INVALID = 603979776

_COLL_TAGS = 1024                   # tags an algorithm may use: 0 .. 1023
_SEQ_MOD = 2 ** 20
_GROUP_TAG_BASE = 1 << 29           # Create_group traffic on the p2p context

_NULL_HANDLE = 0x04000000
_WORLD_HANDLE = 0x44000000
_SELF_HANDLE = 0x44000001


# -----------------------------------------------------------------------------
# Runtime state


class _Runtime:
    """Process-wide state: the engine, init flags and the next context id."""

    def __init__(self):
        self.engine = None
        self.initialized = False
        self.finalized = False
        self.next_ctx = 6           # 0/1 COMM_WORLD, 2/3 COMM_SELF, 4/5 ports (dpm.py)
        self.thread_level = 3
        self.main_thread = threading.main_thread()
        self.lock = threading.Lock()
        self.next_handle = 0x44000002
        self.info = {}


_rt = _Runtime()


def _engine_or_raise():
    eng = _rt.engine
    if eng is None:
        if _rt.finalized:
            raise_error(ERR_OTHER, "MPI has been finalized")
        raise_error(ERR_OTHER, "MPI is not initialized (call MPI.Init)")
    return eng


def _new_handle():
    with _rt.lock:
        h = _rt.next_handle
        _rt.next_handle += 1
    return h


# -----------------------------------------------------------------------------
# Collective transport


class _CollTransport:
    """:class:`erdmampi.collectives.base.Transport` for one collective call.

    Algorithm tags 0..1023 become ``(seq % 2**20) * 1024 + tag`` on the
    communicator's collective context id; ``seq`` counts collective calls on
    the communicator, so concurrent (nonblocking) collectives never mix.
    """

    __slots__ = ("rank", "size", "_hosts", "_eng", "_ranks", "_ctx", "_base", "_pkl", "_fast",
                 "_comm", "blocking")

    def __init__(self, comm, ctx, base, ranks=None, rank=None):
        self._eng = _engine_or_raise()
        self._ranks = ranks if ranks is not None else comm._ranks
        self.size = len(self._ranks)
        self.rank = rank if rank is not None else comm._rank
        self._ctx = ctx
        self._base = base
        self._pkl = _default_pickle
        self._comm = comm if ranks is None and rank is None and ctx == comm._ctx + 1 else None
        self._fast = None       # the communicator's _engine.fast state, on first use
        self._hosts = False
        self.blocking = False   # a blocking call's (pair_barrier)

    @property
    def hosts(self):
        """Host of each rank (hierarchical algorithms when ranks span hosts), or None."""
        if self._hosts is False:
            world_hosts = (getattr(_rt, "info", None) or {}).get("hosts")
            self._hosts = [world_hosts[w] for w in self._ranks] if world_hosts else None
        return self._hosts

    def schedule(self, chunked=True):
        """A builder for :mod:`erdmampi.collectives.sched` algorithms."""
        return _collsched.CollSchedule(self._eng, self._ranks, self._ctx, self._base,
                                       chunked)

    def pair_barrier(self):
        """A blocking Barrier of two ranks by flags in shared memory, once
        the two agreed on them at an earlier Barrier (erdma_pair_* in
        erdma_shm.c; the C paths offer them): True when done, False (nothing
        done) otherwise.  Every path of a blocking Barrier takes them once
        agreed, so that ranks on different paths still meet; a nonblocking
        one never does (it matches only its own kind)."""
        if not self.blocking or self.size != 2:
            return False
        try:
            return self._eng.pair_barrier(self._ranks[1 - self.rank], self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def pair_bcast(self, buf, root):
        """A blocking Bcast of two ranks of fewer than _engine.PAIR_BCAST_MAX
        bytes by flags (above PAIR_DATA_MAX copied with CMA), as
        pair_barrier (the C paths take them too): True when done, False
        (nothing done) otherwise."""
        if not self.blocking or self.size != 2 or not 0 < buf.nbytes < _engine.PAIR_BCAST_MAX:
            return False
        arr = buf if buf.flags.c_contiguous else np.ascontiguousarray(buf)
        try:
            done = self._eng.pair_bcast(self._ranks[1 - self.rank], self._ctx, arr.ctypes.data,
                                        arr.nbytes, self.rank == root)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if done and arr is not buf and self.rank != root:
            buf[...] = arr
        return done

    def pair_allgather(self, sendbuf, recvbuf, counts, displs):
        """A blocking Allgather of two ranks by flags, blocks of at most
        _engine.PAIR_DATA_MAX bytes packed in ``recvbuf`` (as pair_bcast;
        ``sendbuf`` None: in place): True when done, False otherwise."""
        if not self.blocking or self.size != 2 or len(counts) != 2 or counts[0] != counts[1]:
            return False
        blk = int(counts[0]) * recvbuf.itemsize
        if not 0 < blk <= _engine.PAIR_DATA_MAX or (
                displs is not None and [int(d) for d in displs] != [0, int(counts[0])]):
            return False
        sarr = None
        if sendbuf is not None:
            sarr = np.ascontiguousarray(sendbuf).view(np.uint8)[:blk]
        return self._pair_blocks(self._eng.pair_allgather, sarr, recvbuf, blk)

    def pair_alltoall(self, sendbuf, recvbuf):
        """A blocking Alltoall of two ranks by flags, blocks below
        _engine.PAIR_CMA_MAX bytes (above PAIR_DATA_MAX read with CMA),
        packed in ``recvbuf`` (``sendbuf`` None: in place), as
        pair_allgather: True when done, False
        otherwise."""
        if not self.blocking or self.size != 2:
            return False
        blk = recvbuf.nbytes // 2
        if not 0 < blk < _engine.PAIR_CMA_MAX or recvbuf.nbytes != 2 * blk:
            return False
        sarr = None
        if sendbuf is not None:
            sarr = np.ascontiguousarray(sendbuf).reshape(-1).view(np.uint8)
            if sarr.nbytes < 2 * blk:
                return False
        return self._pair_blocks(self._eng.pair_alltoall, sarr, recvbuf, blk)

    def _pair_blocks(self, fn, sarr, recvbuf, blk):
        """``fn`` (Engine.pair_allgather or pair_alltoall) on ``sarr`` (None:
        in place) and ``recvbuf``, through a contiguous copy of the latter
        where it is not: True when done."""
        rarr = recvbuf if recvbuf.flags.c_contiguous else np.ascontiguousarray(recvbuf)
        try:
            done = fn(self._ranks[1 - self.rank], self._ctx,
                      None if sarr is None else sarr.ctypes.data, rarr.ctypes.data, blk,
                      self.rank)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if done and rarr is not recvbuf:
            recvbuf[...] = rarr
        return done

    def isend(self, buf, dest, tag):
        _collsched.notify_started()
        buf = np.ascontiguousarray(buf)
        try:
            return self._eng.isend(buf.ctypes.data, buf.nbytes, self._ranks[dest],
                                   self._base + tag, self._ctx, keep=buf)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def irecv(self, buf, source, tag):
        _collsched.notify_started()
        try:
            return self._eng.irecv(buf.ctypes.data, buf.nbytes, self._ranks[source],
                                   self._base + tag, self._ctx, keep=buf)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def irecv_upto(self, buf, source, tag):
        """A receive that accepts a message of at most ``buf.nbytes`` bytes
        (the engine reports the length; encodings carry it themselves)."""
        return self.irecv(buf, source, tag)

    def send_obj_bytes(self, data, dest, tag):
        """Send pickled ``data`` and wait until it went (the engine path)."""
        q = self.isend(np.frombuffer(data, dtype=np.uint8), dest, tag)
        self.waitall([q])

    def send_obj(self, obj, dest, tag):
        q = self.isend_bytes(self._pkl._encode(obj), dest, tag)
        if q is not None:
            self.waitall([q])

    def recv_obj(self, source, tag):
        return self._pkl._decode(self.recv_bytes(source, tag))

    def _fast_state(self):
        c = self._comm
        if c is None:
            return None
        f = self._fast = c._fast or c._fast_obj_state()
        return f

    def isend_bytes(self, data, dest, tag):
        """Send ``data`` (bytes: an object collective's message): None when
        it went at once (eager into a local peer's ring), else a request."""
        _collsched.notify_started()
        if not _fast_send_bytes(self._fast or self._fast_state(), data, dest, tag, self._base):
            return None
        return self.isend(np.frombuffer(data, dtype=np.uint8), dest, tag)

    def recv_bytes(self, source, tag):
        """Receive one message of any size (sent with :meth:`isend_bytes`)."""
        _collsched.notify_started()
        try:
            got = _recv_bytes_fast(self._fast or self._fast_state(), source, tag, self._base)
            if got is not None:
                data, err = got
            else:
                req = self._eng.irecv_alloc(self._ranks[source], self._base + tag, self._ctx)
                err = req.wait().error
                data = None if err else req.take()
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if err:
            raise_error(error_class(err), "collective receive failed: "
                        + error_text(err, "engine error"))
        return data

    def waitall(self, reqs):
        for r in reqs:
            try:
                raw = r.wait()
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            if raw.error:
                why = ("mismatched counts across ranks?" if raw.error == _engine.ERR_TRUNCATE
                       else error_text(raw.error, "engine error"))
                raise_error(error_class(raw.error), f"collective message failed ({why})")


def _committed(msg):
    dt = getattr(msg, "datatype", None)
    if dt is not None and not dt._is_committed():
        raise_error(ERR_TYPE, "datatype has not been committed")
    return msg


def message_p2p(*args, **kw):
    return _committed(_buffers.message_p2p(*args, **kw))


_ndarray = np.ndarray
_plain_datatype = _buffers.plain_datatype
_plain_spec = _buffers.plain_spec
_plain_counted = _buffers.plain_counted
_SMALL_COLL_MAX = 64 * 1024  # bytes: Bcast/Allreduce in one engine call (eager size)
_C_OPS = {name: _engine.SCHED_OPS[name] for name in _engine.SCHED_OPS}
# os.environ's own mapping (encoded keys): a cheap look for ERDMA_COLL_<NAME>
_environ_data = getattr(os.environ, "_data", None)
if not isinstance(_environ_data, dict):
    _environ_data = os.environ
# the override each one-call collective honours (Allgather's algorithms are Allgatherv's)
_COLL_ENV = {name: (coll.ENV_PREFIX + name.upper())
             for name in ("barrier", "bcast", "allreduce", "alltoall", "reduce_scatter",
                          "gather", "scatter", "reduce")}
_COLL_ENV["allgather"] = coll.ENV_PREFIX + "ALLGATHERV"
if _environ_data is not os.environ:
    _COLL_ENV = {k: os.fsencode(v) for k, v in _COLL_ENV.items()}
_LOGICAL_OPS = frozenset(("LAND", "LOR", "LXOR"))
_C_DTYPES = {}               # id(datatype) -> (datatype, ERDMA_DT_*, is bool, item size)


def _c_dtype(datatype):
    """The C reducer's entry for ``datatype`` (see _C_DTYPES), or None."""
    ent = _C_DTYPES.get(id(datatype))
    if ent is not None and ent[0] is datatype:
        return ent
    base = getattr(datatype, "_base", None) or datatype
    rdt = getattr(base, "_reduce_dtype", None)
    npd = rdt if rdt is not None else datatype.np_dtype
    if npd is None or datatype._elements(1) != 1:
        return None
    npd = np.dtype(npd)
    isbool = npd == np.bool_
    name = "uint8" if isbool else npd.name
    code = _engine.SCHED_DTYPES.get(name)
    if code is None or npd.byteorder == ">" or npd.itemsize != datatype.Get_size() \
            or not datatype._predefined:
        return None
    ent = (datatype, code, isbool, npd.itemsize)
    _C_DTYPES[id(datatype)] = ent
    return ent


def _spec_np_dtype(spec, arr):
    """The element dtype the normal path would see for a plain spec."""
    if spec is arr:
        return arr.dtype
    npd = spec[1].np_dtype
    return npd if npd is not None else np.dtype(np.uint8)


def _spec_is(spec, arr, dt):
    """Whether ``spec`` is (still) the plain spec of ``arr`` (with ``dt``;
    None: the array alone)."""
    if dt is None:
        return spec is arr
    t = type(spec)
    return (t is list or t is tuple) and len(spec) == 2 and spec[0] is arr and spec[1] is dt


def _plain_array(spec, readonly):
    """The array of a spec that is one whole plain host array (an exact
    ``numpy.ndarray``, alone or with a predefined datatype without gaps),
    else None; see :func:`erdmampi.buffers.plain_datatype` and ``plain_spec``."""
    t = type(spec)
    if t is _ndarray:
        return spec if _plain_datatype(spec, readonly) is not None else None
    if t is list or t is tuple:
        return _plain_spec(spec, readonly)
    return None


_UNUSED = object()


def _same_spec(spec, arr, dt, nbytes, writable):
    """Whether ``spec`` is still what a one-call cache entry resolved: the
    plain spec of ``arr`` of ``nbytes`` (writable if asked), or, for a buffer
    the call did not use (dt ``_UNUSED``: IN_PLACE, None, the receive buffer
    off the root), the same object."""
    if dt is _UNUSED:
        return spec is arr
    return (_spec_is(spec, arr, dt) and arr.nbytes == nbytes
            and (not writable or arr.flags.writeable))


def _plain_with_type(spec, readonly):
    """``(array, datatype)`` of a whole plain host array spec, else (None, None)."""
    if type(spec) is _ndarray:
        dt = _plain_datatype(spec, readonly)
        return (spec, dt) if dt is not None else (None, None)
    arr = _plain_spec(spec, readonly)
    return (arr, spec[1]) if arr is not None else (None, None)
_P2P_CACHE_MAX = 1 << 16     # bytes: a cached spec keeps its array alive
_COLL_CACHE_MAX = 1 << 20    # bytes of a one-call collective's arrays that a cache may keep
_buffer_pointer = _engine.buffer_pointer
_deferred = _engine._deferred
_reap_deferred = _engine._reap_deferred


def _fast_miss4(state, a, b, c):
    return 1


if _engine.fast is not None:
    _fast_send, _fast_recv, _fast_remember = (_engine.fast.send, _engine.fast.recv,
                                              _engine.fast.remember)
    _fast_allreduce = _engine.fast.allreduce
    _fast_bcast, _fast_barrier = _engine.fast.bcast, _engine.fast.barrier
    _fast_alltoall, _fast_allgather = _engine.fast.alltoall, _engine.fast.allgather
    _fast_remember_bcast = _engine.fast.remember_bcast
    _fast_remember_barrier = _engine.fast.remember_barrier
    _fast_remember_alltoall = _engine.fast.remember_alltoall
    _fast_remember_allgather = _engine.fast.remember_allgather
    _fast_reduce_scatter = _engine.fast.reduce_scatter
    _fast_remember_reduce_scatter = _engine.fast.remember_reduce_scatter
    _fast_recv_status, _fast_hits = _engine.fast.recv_status, _engine.fast.hits
    _fast_sendrecv = _engine.fast.sendrecv
    _fast_sendrecv_replace = _engine.fast.sendrecv_replace
    _fast_remember_packed = _engine.fast.remember_packed
    _fast_isend, _fast_irecv = _engine.fast.isend, _engine.fast.irecv
    _fast_rooted, _fast_remember_rooted = _engine.fast.rooted, _engine.fast.remember_rooted
    _fast_remember_allreduce = _engine.fast.remember_allreduce
    _fast_send_bytes, _fast_recv_bytes = _engine.fast.send_bytes, _engine.fast.recv_bytes
    _fast_recv_obj, _fast_send_obj = _engine.fast.recv_obj, _engine.fast.send_obj
    _FastMore, _fast_pair_obj = _engine.fast.More, _engine.fast.pair_obj
else:
    _fast_send = _fast_recv = _fast_allreduce = _fast_recv_status = _fast_miss4
    _fast_remember = _fast_remember_allreduce = None
    _fast_remember_bcast = _fast_remember_barrier = _fast_remember_alltoall = None
    _fast_remember_allgather = _fast_remember_reduce_scatter = None
    _fast_reduce_scatter = _fast_miss4

    def _fast_bcast(state, buf, root):
        return 1
    _fast_alltoall = _fast_allgather = _fast_bcast

    def _fast_barrier(state):
        return 1

    def _fast_send_bytes(*args):
        return 1
    _fast_recv_bytes = _fast_sendrecv = _fast_send_obj = _fast_send_bytes
    _fast_hits = _fast_send_bytes
    _fast_sendrecv_replace = _fast_send_bytes

    class _FastMore:
        value = 1

    def _fast_recv_obj(state, source, tag, loads, *base, _miss=_FastMore()):
        return _miss

    def _fast_pair_obj(state, send, own, recv, wire, loads, nothing, *base,
                       _miss=_FastMore()):
        return _miss
    _fast_remember_packed = None
    _fast_isend = _fast_miss4
    _fast_remember_rooted = None

    def _fast_rooted(state, which, sendbuf, recvbuf, root, op):
        return 1

    def _fast_irecv(state, buf, source, tag, index):
        return 1


def _recv_bytes_fast(state, source, tag, *base):
    """A message of any length through _engine.fast.recv_bytes: ``(payload or
    None, error)``, or None on a miss (nothing posted).  A receive still
    pending after the first slice is waited for here (EngineError on failure)."""
    r = _fast_recv_bytes(state, source, tag, *base)
    if r == 1:
        return None
    if type(r[0]) is int:
        return _engine.fast_rest_bytes(r, "recv")
    return r


def _pair_send_bytes(comm, f, data, dest, tag, base):
    """An object collective's message of a two-rank communicator (fast state
    ``f``, call tag base ``base``) without a transport where it can."""
    if _fast_send_bytes(f, data, dest, tag, base):
        _CollTransport(comm, comm._ctx + 1, base).send_obj_bytes(data, dest, tag)


def _pair_recv_bytes(comm, f, source, tag, base):
    """The receiving side of :func:`_pair_send_bytes`: the payload."""
    try:
        got = _recv_bytes_fast(f, source, tag, base)
    except _engine.EngineError as e:
        raise engine_exception(e) from None
    if got is None:
        return _CollTransport(comm, comm._ctx + 1, base).recv_bytes(source, tag)
    data, err = got
    if err:
        _coll_recv_error(err)
    return data


def _coll_recv_error(err):
    raise_error(error_class(err), "collective receive failed: "
                + error_text(err, "engine error"))


def _recv_obj_payload(r):
    """The value of a fast recv_obj's More that is not a miss:
    ``(payload or None, error)``, waiting on for a receive still pending."""
    if type(r[0]) is not int:
        return r
    try:
        return _engine.fast_rest_bytes(r, "recv")
    except _engine.EngineError as e:
        raise engine_exception(e) from None


def _pair_recv_obj(comm, f, source, tag, base, pkl):
    """:func:`_pair_recv_bytes` and the object it pickles (loaded in the
    same C call when it is an in-band pickle for pickle.loads)."""
    loads = pkl._loads
    r = _fast_recv_obj(f, source, tag, loads if loads is _std_loads else None, base)
    if r.__class__ is not _FastMore:
        return r
    r = r.value
    if r == 1:
        return pkl._decode(_CollTransport(comm, comm._ctx + 1, base).recv_bytes(source, tag))
    data, err = _recv_obj_payload(r)
    if err:
        _coll_recv_error(err)
    return pkl._decode(data)


def _fast_coll_raise(r, what):
    """A fast collective answered ``(rc, pending)``: finish it or raise."""
    try:
        _engine.fast_coll_rest(r, what)
    except _engine.EngineError as e:
        raise engine_exception(e) from None


def _fast_raise(r, keep, what):
    """A fast Send/Recv answered ``r`` other than 0 or 1: raise its error."""
    if type(r) is tuple:
        try:
            r = _engine.fast_rest(r, keep, what).error
        except _engine.EngineError as e:
            raise engine_exception(e) from None
    if r:
        raise_status_code(r)


def _p2p_buffer(buf, readonly):
    """``(addr, nbytes, keep, msg)`` of a point-to-point buffer spec: a plain
    NumPy array, alone or as ``[array, predefined datatype]``, skips the
    parser (``msg`` is then None), see :func:`erdmampi.buffers.plain_datatype`
    and :func:`erdmampi.buffers.plain_spec`."""
    arr = _plain_array(buf, readonly)
    if arr is not None:
        ptr = _buffer_pointer(arr)
        return ptr, arr.nbytes, ptr, None
    msg = message_p2p(buf, readonly)
    return msg.addr, msg.nbytes, msg, msg


def _send_fields(raw):
    return (ANY_SOURCE, ANY_TAG, error_class(raw.error), 0, raw.cancelled, None)


def message_cco(*args, **kw):
    return _committed(_buffers.message_cco(*args, **kw))


def _u8(arr):
    """uint8 view of a contiguous 1-D array (no copy)."""
    if arr is None:
        return None
    return arr.reshape(-1).view(np.uint8)


def _extent(msg):
    return msg.datatype.Get_extent()[1]


def _mult(msg):
    return msg.datatype._elements(1)


def _u8_of(msg):
    """uint8 view of a message's bytes, None for no message."""
    return None if msg is None else _u8(msg.array)


def _mismatch(smsg, rmsg):
    return ValueError(f"mismatch in send count {smsg.count} "
                      f"and receive count {rmsg.count}")


def _blocks(blk, size):
    """Byte counts and displacements of ``size`` consecutive ``blk``-byte blocks."""
    return [blk] * size, [blk * i for i in range(size)]


def _message_vector_bytes(spec, readonly, size):
    """``(msg, counts, byte counts, byte displacements)`` of a vector message."""
    msg, c, d = message_vector(spec, readonly, size)
    ext = _extent(msg) if msg.nbytes else 0
    return msg, c, [x * ext for x in c], [x * ext for x in d]


def _run_gatherv(t, smsg, rmsg, counts, displs, root):
    def run():
        coll.gatherv(t, _u8_of(smsg), _u8_of(rmsg), counts, displs, root)
        if rmsg is not None:
            rmsg.finish()
    return run


def _run_scatterv(t, smsg, rmsg, counts, displs, root):
    def run():
        coll.scatterv(t, _u8_of(smsg), counts, displs, _u8_of(rmsg), root)
        if rmsg is not None:
            rmsg.finish()
    return run


def _run_blocks(fn, t, smsg, rmsg, *args):
    """Runner of an equal-block collective (``coll.gather``/``scatter``/``alltoall``),
    which may pick tree algorithms since every rank knows the block size."""
    def run():
        fn(t, _u8_of(smsg), _u8_of(rmsg), *args)
        if rmsg is not None:
            rmsg.finish()
    return run


def _run_allgatherv(t, smsg, rmsg, counts, displs):
    def run():
        coll.allgatherv(t, _u8_of(smsg), _u8(rmsg.array), counts, displs)
        rmsg.finish()
    return run


def _run_compressed(fn, t, smsg, rmsg, cd, *args):
    """Runner of a compressed block collective over host messages."""
    def run():
        fn(t, None if smsg is None else smsg.array, None if rmsg is None else rmsg.array,
           *args, cd)
        if rmsg is not None:
            rmsg.finish()
    return run


def _check_op(op):
    if not isinstance(op, Op):
        raise TypeError(f"expected MPI.Op, got {type(op).__name__}")
    if op._predefined and op._name in ("REPLACE", "NO_OP", "OP_NULL"):
        if op._adopt():     # a handle written into a null object
            return _check_op(op)
        if op._name != "OP_NULL":
            # MPICH: REPLACE and NO_OP are for one-sided accumulates only
            raise_error(ERR_OP, f"MPI_{op._name} is not valid in a reduction collective")
    return op


def _reduce_fn(op, datatype):
    def fn(inarr, inoutarr):
        op._apply(inarr, inoutarr, datatype)
    if op._predefined:
        # lets collectives.sched reduce in C: (op name, element dtype)
        rdt = datatype._base._reduce_dtype
        fn.sched = (op._name, rdt if rdt is not None else datatype.np_dtype)
    return fn


def _py_op(op):
    if isinstance(op, Op):
        return op._py
    if callable(op):
        return op
    raise TypeError(f"expected MPI.Op or callable, got {type(op).__name__}")


# -----------------------------------------------------------------------------
# Compression hooks (erdmampi.compression, erdmampi.collectives.compressed)


def _hints_of(info):
    """The hints erdmampi reads from an Info object: ``{key: value or None}``
    (None: the key is present with an empty value, i.e. reset)."""
    if info is None:
        return {}
    get = getattr(info, "Get", None)
    if get is None:
        raise TypeError(f"expected MPI.Info, got {type(info).__name__}")
    if not info:          # INFO_NULL
        return {}
    val = get(_cz.INFO_KEY)
    if val is None:
        return {}
    return {_cz.INFO_KEY: _cz.parse_mode(val, f"Info {_cz.INFO_KEY} value")}


_SKIP = object()   # compress= value meaning "already planned: normal algorithm"


def _dev(obj):
    """``obj`` if it is a bare device array a compressed call could take
    without staging, else None."""
    return obj if _cz.is_device(obj) else None


def _dev_dtype_datatype(dtype):
    return message_cco(np.empty(1, dtype), True, 1).datatype


def _dev_msg(obj):
    """(1-D device view, dtype) of a bare device array."""
    return _cz.device_view(obj), _cz.device_dtype(obj)


def _dev_addr(obj):
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return id(obj)


def _sum(op, _cache=[]):
    """Lowercase (object) reductions: None means SUM, as in mpi4py."""
    if op is not None:
        return op
    if not _cache:      # imported once (an import statement costs a call's time)
        from .op import SUM
        _cache.append(SUM)
    return _cache[0]


def _op_arg(op):
    """Uppercase (buffer) reductions: mpi4py's ``op`` must be an ``Op`` (default SUM)."""
    if not isinstance(op, Op):
        raise TypeError(f"Argument 'op' has incorrect type (expected MPI.Op, "
                        f"got {type(op).__name__})")
    return op


def _status_arg(status):
    """mpi4py's TypeError for a ``status`` that is neither None nor a Status."""
    if status is not None and not isinstance(status, Status):
        raise TypeError(f"Argument 'status' has incorrect type (expected MPI.Status, "
                        f"got {type(status).__name__})")


def _icoll(run):
    # The algorithm runs in a thread; the caller waits until it has posted its
    # first message or started its C schedule (erdmampi._collsched), so that a
    # schedule is running before the caller goes back to computing.
    started = threading.Event()

    def body():
        _collsched.icoll_enter(started)
        try:
            return run()
        finally:
            _collsched.icoll_exit()
            started.set()
    req = Request._new(_ThreadOp(body))
    started.wait()
    return req


class _PairOp:
    """The operation of a request that completes with both halves of an Isendrecv."""
    __slots__ = ("fields", "obj", "_rop", "_sop")
    persistent = False

    def __init__(self, rop, sop):
        self.fields = None
        self.obj = None
        self._rop, self._sop = rop, sop

    def test(self):
        if self.fields is not None:
            return True
        if self._rop.test() and self._sop.test():
            self.fields = self._rop.fields
            self.obj = self._rop.obj
            return True
        return False

    def wait(self):
        self._rop.wait()
        self._sop.wait()
        self.test()

    def cancel(self):
        self._rop.cancel()
        self._sop.cancel()

    def free(self):
        self._rop.free()
        self._sop.free()


def _pair_request(recv_req, send_req):
    """One request completing when both halves have (Isendrecv)."""
    return Request._new(_PairOp(recv_req._op, send_req._op))
