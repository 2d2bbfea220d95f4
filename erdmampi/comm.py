"""Communicators: Comm and Intracomm over the engine and the collectives.

Point-to-point calls resolve their buffer spec with :mod:`erdmampi.buffers`
and hand address/length to the engine, which speaks COMM_WORLD ranks and byte
counts; this module translates ranks through the communicator's
:class:`~erdmampi.group.Group` and bytes to counts through
:class:`~erdmampi.status.Status`.  Collective calls build one
:class:`_CollTransport` per call over the communicator's collective context id
(``ctx + 1``), with engine tags unique per call.
"""

import itertools
import os
import socket
import sys
import threading

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
        self.next_ctx = 4           # 0/1 COMM_WORLD, 2/3 COMM_SELF
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


def init(thread_level=3):
    """Start the engine and set up COMM_WORLD and COMM_SELF (MPI_Init)."""
    if _rt.initialized:
        raise_error(ERR_OTHER, "MPI is already initialized")
    if _rt.finalized:
        raise_error(ERR_OTHER, "MPI cannot be initialized again after Finalize")
    from . import rc as _rc
    _cz.configure(_rc)      # ERDMA_COMPRESS / rc.compress (bad values raise here)
    eng = bootstrap.init_world()
    _rt.engine = eng
    _rt.info = bootstrap.world_info()
    _rt.initialized = True
    _rt.thread_level = thread_level
    _set_world_rank(eng.rank)
    COMM_WORLD._setup(Group._from_ranks(range(eng.size)), 0)
    COMM_SELF._setup(Group._from_ranks([eng.rank]), 2)
    return eng


def finalize():
    """Synchronise COMM_WORLD and shut the engine down (MPI_Finalize)."""
    if not _rt.initialized:
        raise_error(ERR_OTHER, "MPI is not initialized")
    if _rt.finalized:
        raise_error(ERR_OTHER, "MPI is already finalized")
    try:
        if COMM_WORLD._ranks is not None and len(COMM_WORLD._ranks) > 1:
            COMM_WORLD.Barrier()
    except MPIException:
        pass
    finally:
        _rt.finalized = True
        try:
            bootstrap.shutdown_world()
        finally:
            _rt.engine = None


# -----------------------------------------------------------------------------
# Collective transport


class _CollTransport:
    """:class:`erdmampi.collectives.base.Transport` for one collective call.

    Algorithm tags 0..1023 become ``(seq % 2**20) * 1024 + tag`` on the
    communicator's collective context id; ``seq`` counts collective calls on
    the communicator, so concurrent (nonblocking) collectives never mix.
    """

    __slots__ = ("rank", "size", "_hosts", "_eng", "_ranks", "_ctx", "_base", "_pkl", "_fast",
                 "_comm")

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
    _fast_recv_status = _engine.fast.recv_status
    _fast_remember_allreduce = _engine.fast.remember_allreduce
    _fast_send_bytes, _fast_recv_bytes = _engine.fast.send_bytes, _engine.fast.recv_bytes
else:
    _fast_send = _fast_recv = _fast_allreduce = _fast_recv_status = _fast_miss4
    _fast_remember = _fast_remember_allreduce = None

    def _fast_send_bytes(*args):
        return 1
    _fast_recv_bytes = _fast_send_bytes


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
    if op._predefined and op._name in ("REPLACE", "NO_OP"):
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


# -----------------------------------------------------------------------------
# Errhandler (exceptions are always raised; kept for API compatibility)


class Errhandler:
    """Error handler, as ``MPI.Errhandler``; erdmampi always raises exceptions."""

    __slots__ = ("_name",)

    def __init__(self, errhandler=None):
        self._name = errhandler._name if isinstance(errhandler, Errhandler) else None

    @classmethod
    def _make(cls, name):
        e = cls()
        e._name = name
        return e

    def __eq__(self, other):
        return isinstance(other, Errhandler) and self._name == other._name

    __hash__ = object.__hash__

    def __bool__(self):
        return self._name is not None

    def __repr__(self):
        return f"<Errhandler {self._name or 'ERRHANDLER_NULL'}>"

    def Free(self):
        pass

    free = Free


ERRHANDLER_NULL = Errhandler()
ERRORS_RETURN = Errhandler._make("ERRORS_RETURN")
ERRORS_ARE_FATAL = Errhandler._make("ERRORS_ARE_FATAL")
ERRORS_ABORT = Errhandler._make("ERRORS_ABORT")

_keyvals = {}
_next_keyval = [1700000000]


# -----------------------------------------------------------------------------
# Communicators


class Comm:
    """Communication context, as ``MPI.Comm``.

    ``_ranks`` is the tuple of COMM_WORLD ranks (None: null or freed),
    ``_ctx`` the point-to-point context id (collectives use ``_ctx + 1``).
    ``_fast``: the state of the one-call Send/Recv path (see ``_p2p_plain``).
    """

    _fast = None
    _csmall = _cranks = _arcache = _bccache = _bkcache = None

    def __init__(self, comm=None):
        self._ranks = None
        self._group = None
        self._rank = UNDEFINED
        self._ctx = -1
        self._seqc = itertools.count()
        self._name = ""
        self._attrs = {}
        self._predef = False
        self._handle = _NULL_HANDLE
        self._lock = threading.Lock()
        self._errhandler = ERRORS_RETURN
        self._pkl = _default_pickle
        self._chints = {}           # Info hints erdmampi reads (erdma_compress)
        if comm is not None:
            if not isinstance(comm, Comm):
                raise TypeError(f"expected Comm, got {type(comm).__name__}")
            self._share(comm)

    def _share(self, comm):
        for k in ("_ranks", "_group", "_rank", "_ctx", "_name", "_attrs", "_handle",
                  "_errhandler", "_predef", "_chints"):
            setattr(self, k, getattr(comm, k))
        self._lock = comm._lock
        self._seqc = comm._seqc
        self._predef = False

    def _setup(self, group, ctx, name=None):
        self._fast = None
        self._group = group
        self._ranks = group._ranks
        self._rank = group.Get_rank()
        self._ctx = ctx
        if name is not None:
            self._name = name
        if self._handle == _NULL_HANDLE:
            self._handle = _new_handle()

    @classmethod
    def _from_group(cls, group, ctx):
        c = cls()
        c._setup(group, ctx)
        return c

    # Private helpers

    def _check(self):
        if self._ranks is None:
            raise_error(ERR_COMM, "invalid communicator (COMM_NULL or freed)")
        if _rt.engine is None:
            _engine_or_raise()
        return self._ranks

    def _next_seq(self):
        # an itertools.count: atomic under the GIL, and shared with the C
        # fast path (_engine.fast), which counts the calls it runs itself
        return next(self._seqc)

    def _fast_state(self):
        """A new state of this communicator for _engine.fast, or None."""
        eng = _rt.engine
        if eng is None or self._ranks is None:
            return None
        return eng.fast_state(self._ctx, self._ranks, self._rank, TAG_UB_VALUE, self._seqc)

    def _transport(self):
        return _CollTransport(self, self._ctx + 1, self._coll_base())

    def _coll_base(self):
        """Tag base of the next collective call (one per call, every rank)."""
        return (self._next_seq() % _SEQ_MOD) * _COLL_TAGS

    def _dest(self, dest):
        ranks = self._check()
        dest = int(dest)
        if dest == PROC_NULL:
            return None
        if dest < 0 or dest >= len(ranks):
            raise_error(ERR_RANK, f"invalid rank {dest} (communicator size {len(ranks)})")
        return ranks[dest]

    def _source(self, source):
        ranks = self._check()
        source = int(source)
        if source == PROC_NULL:
            return None
        if source == ANY_SOURCE:
            return _engine.ANY_SOURCE
        if source < 0 or source >= len(ranks):
            raise_error(ERR_RANK, f"invalid source rank {source} "
                        f"(communicator size {len(ranks)})")
        return ranks[source]

    @staticmethod
    def _send_tag(tag):
        tag = int(tag)
        if tag < 0 or tag > TAG_UB_VALUE:
            raise_error(ERR_TAG, f"invalid tag {tag} (must be 0..{TAG_UB_VALUE})")
        return tag

    @staticmethod
    def _recv_tag(tag):
        tag = int(tag)
        if tag == ANY_TAG:
            return _engine.ANY_TAG
        if tag < 0 or tag > TAG_UB_VALUE:
            raise_error(ERR_TAG, f"invalid tag {tag} (must be 0..{TAG_UB_VALUE} or ANY_TAG)")
        return tag

    def _root(self, root):
        ranks = self._check()
        root = int(root)
        if root < 0 or root >= len(ranks):
            raise_error(ERR_ROOT, f"invalid root {root} (communicator size {len(ranks)})")
        return root

    def _comm_rank(self, world):
        if world < 0:
            return world
        return self._group._index.get(world, UNDEFINED)

    def _finish_fields(self, raw, msg=None):
        err = error_class(raw.error)
        if msg is not None and not err and not raw.cancelled:
            msg.finish()
        return (self._comm_rank(raw.source), raw.tag, err, raw.nbytes, raw.cancelled)

    # Point-to-point: engine operations (return request operations)

    def _isend_op(self, buf, dest, tag, sync=False):
        addr, nbytes, keep, _ = _p2p_buffer(buf, True)
        wdest = self._dest(dest)
        tag = self._send_tag(tag)
        if wdest is None:
            return _DoneOp()
        eng = _engine_or_raise()
        try:
            ereq = eng.isend(addr, nbytes, wdest, tag, self._ctx, sync=sync, keep=keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, _send_fields, pure=True)

    def _irecv_op(self, buf, source, tag):
        addr, nbytes, keep, msg = _p2p_buffer(buf, False)
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return _DoneOp()
        eng = _engine_or_raise()
        try:
            ereq = eng.irecv(addr, nbytes, wsrc, tag, self._ctx, keep=keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: self._finish_fields(raw, msg) + (None,),
                         pure=msg is None or not msg.device)

    def _send(self, buf, dest, tag, sync):
        """Blocking send without a request (the engine's lean path)."""
        addr, nbytes, keep, _ = _p2p_buffer(buf, True)
        wdest = self._dest(dest)
        tag = self._send_tag(tag)
        if wdest is None:
            return
        eng = _engine_or_raise()
        try:
            st = eng.send(addr, nbytes, wdest, tag, self._ctx, sync, keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if st.error:
            raise_status_code(st.error)

    def _recv(self, buf, source, tag, status):
        """Blocking receive without a request (the engine's lean path)."""
        addr, nbytes, keep, msg = _p2p_buffer(buf, False)
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            Request._new(_DoneOp()).Wait(status)
            return
        eng = _engine_or_raise()
        try:
            st = eng.recv(addr, nbytes, wsrc, tag, self._ctx, keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if status is not None or st.error or msg is not None:
            # as Request.Wait: finish, fill the status (MPI_ERROR untouched), raise
            fields = self._finish_fields(st, msg)
            if status is not None:
                status._fill(*fields[:2], status._error, fields[3], bool(fields[4]))
            if fields[2]:
                raise_status_code(st.error)

    def _isend_obj_op(self, obj, dest, tag, sync=False, data=None):
        wdest = self._dest(dest)
        tag = self._send_tag(tag)
        if wdest is None:
            return _DoneOp()
        if data is None:
            data = self._pkl._encode(obj)
        arr = np.frombuffer(data, dtype=np.uint8)
        eng = _engine_or_raise()
        try:
            ereq = eng.isend(arr.ctypes.data if arr.size else 0, arr.nbytes, wdest, tag,
                             self._ctx, sync=sync, keep=(data, arr))
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: (ANY_SOURCE, ANY_TAG, error_class(raw.error), 0,
                                            raw.cancelled, None))

    def _obj_finish(self, ereq):
        def finish(raw):
            fields = self._finish_fields(raw)
            obj = None
            if not fields[2] and not raw.cancelled:
                obj = self._pkl._decode(ereq.take())
            return fields + (obj,)
        return finish

    def _irecv_obj_op(self, source, tag, buf=None):
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return _DoneOp()
        eng = _engine_or_raise()
        if buf is not None:
            # mpi4py: a given buffer bounds the pickled message (ERR_TRUNCATE if larger)
            arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
            try:
                ereq = eng.irecv(arr.ctypes.data if arr.size else 0, arr.nbytes, wsrc, tag,
                                 self._ctx, keep=arr)
            except _engine.EngineError as e:
                raise engine_exception(e) from None

            def finish(raw):
                fields = self._finish_fields(raw)
                obj = None
                if not fields[2] and not raw.cancelled:
                    obj = self._pkl._decode(arr[:raw.nbytes].tobytes())
                return fields + (obj,)
            return _EngineOp(ereq, finish)
        try:
            ereq = eng.irecv_alloc(wsrc, tag, self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, self._obj_finish(ereq))

    def _mrecv_buf(self, emsg, buf):
        msg = message_p2p(buf, False)
        eng = _engine_or_raise()
        try:
            ereq = eng.imrecv(emsg, msg.addr, msg.nbytes, keep=msg)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: self._finish_fields(raw, msg) + (None,))

    def _mrecv_obj(self, emsg):
        eng = _engine_or_raise()
        try:
            ereq = eng.imrecv_alloc(emsg)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, self._obj_finish(ereq))

    def _probe_raw(self, source, tag, blocking, matched=False):
        """The engine's (m)probe answer: RawStatus, ``(EngineMessage, RawStatus)``
        when ``matched``, None (nothing yet) or ``"noproc"`` (PROC_NULL)."""
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return "noproc"
        eng = _engine_or_raise()
        if matched:
            fn = eng.mprobe if blocking else eng.improbe
        else:
            fn = eng.probe if blocking else eng.iprobe
        try:
            return fn(wsrc, tag, self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def _fill_probe(self, status, raw):
        if status is None:
            return
        if raw == "noproc":
            status._fill(PROC_NULL, ANY_TAG, 0, 0, False)
        else:
            status._fill(self._comm_rank(raw.source), raw.tag, 0, raw.nbytes, False)

    # -- Group, size, rank --------------------------------------------------

    def Get_group(self):
        """Return a copy of the group of the communicator."""
        self._check()
        return Group._from_ranks(self._ranks)

    def Get_size(self):
        """Number of processes."""
        return len(self._check())

    def Get_rank(self):
        """Rank of this process."""
        self._check()
        return self._rank

    @property
    def group(self):
        return self.Get_group()

    @property
    def size(self):
        return self.Get_size()

    @property
    def rank(self):
        return self.Get_rank()

    @classmethod
    def Compare(cls, comm1, comm2):
        """IDENT, CONGRUENT, SIMILAR or UNEQUAL."""
        a, b = comm1._check(), comm2._check()
        if comm1._ctx == comm2._ctx and a == b:
            return IDENT
        if a == b:
            return CONGRUENT
        if sorted(a) == sorted(b):
            return SIMILAR
        return UNEQUAL

    # -- Equality -----------------------------------------------------------

    def __eq__(self, other):
        if not isinstance(other, Comm):
            return NotImplemented
        if self._ranks is None or other._ranks is None:
            return self._ranks is None and other._ranks is None
        return self._handle == other._handle

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = object.__hash__

    def __bool__(self):
        return self._ranks is not None

    def __repr__(self):
        if self._ranks is None:
            return f"<{type(self).__name__} COMM_NULL>"
        return f"<{type(self).__name__} {self._name or hex(self._handle)} size={len(self._ranks)}>"

    # -- Communicator constructors ------------------------------------------

    def _agree_ctx(self):
        """A context id unused by every member (Allreduce MAX of next_ctx)."""
        t = self._transport()
        val = np.array([_rt.next_ctx], dtype=np.int64)
        coll.allreduce(t, None, val, lambda a, io: np.maximum(a, io, out=io))
        new = int(val[0])
        with _rt.lock:
            _rt.next_ctx = max(_rt.next_ctx, new + 2)
        return new

    def Dup(self, info=None):
        """Duplicate the communicator (same group, new context)."""
        self._check()
        ctx = self._agree_ctx()
        c = type(self)()
        c._setup(Group._from_ranks(self._ranks), ctx)
        c._attrs = dict(self._attrs)
        c._chints = dict(self._chints)
        if info is not None:
            c.Set_info(info)
        return c

    def Clone(self):
        """Duplicate the communicator (same group, new context)."""
        return self.Dup()

    Dup_with_info = Dup

    def Idup(self, info=None):
        """Nonblocking Dup: returns ``(newcomm, request)``."""
        return self.Dup(info), Request._new(_DoneOp())

    def Free(self):
        """Free the communicator; it becomes COMM_NULL."""
        self._check()
        if self._predef:
            raise_error(ERR_COMM, "cannot free a predefined communicator")
        self._ranks = None
        self._group = None
        self._rank = UNDEFINED
        self._fast = None

    def free(self):
        """Free the communicator if it is not null or predefined."""
        if self._ranks is not None and not self._predef:
            self.Free()

    Disconnect = Free

    # -- Names and attributes -----------------------------------------------

    def Get_name(self):
        if self._ranks is None:
            return "MPI_COMM_NULL"    # MPICH names the null handle
        return self._name

    def Set_name(self, name):
        self._check()
        if not isinstance(name, str):
            raise TypeError(f"expected str, got {type(name).__name__}")
        self._name = name

    @property
    def name(self):
        return self.Get_name()

    @name.setter
    def name(self, value):
        self.Set_name(value)

    def Get_attr(self, keyval):
        """Attribute value (predefined: TAG_UB, APPNUM, UNIVERSE_SIZE, ...)."""
        self._check()
        keyval = int(keyval)
        if keyval == TAG_UB:
            return TAG_UB_VALUE
        if keyval == WTIME_IS_GLOBAL:
            return 0
        if keyval == IO:
            return ANY_SOURCE
        if keyval == LASTUSEDCODE:
            return ERR_LASTCODE
        if keyval == APPNUM:
            return int(_rt.info.get("appnum", 0))
        if keyval == UNIVERSE_SIZE:
            if "ERDMA_UNIVERSE_SIZE" in os.environ:
                return int(_rt.info.get("universe_size", len(self._ranks)))
            return None
        if keyval not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        return self._attrs.get(keyval)

    def Set_attr(self, keyval, attrval):
        self._check()
        if int(keyval) not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        self._attrs[int(keyval)] = attrval

    def Delete_attr(self, keyval):
        self._check()
        if int(keyval) not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        self._attrs.pop(int(keyval), None)

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        with _rt.lock:
            k = _next_keyval[0]
            _next_keyval[0] += 1
        _keyvals[k] = (copy_fn, delete_fn)
        return k

    @classmethod
    def Free_keyval(cls, keyval):
        _keyvals.pop(int(keyval), None)
        return KEYVAL_INVALID

    def Get_errhandler(self):
        self._check()
        return self._errhandler

    def Set_errhandler(self, errhandler):
        self._check()
        self._errhandler = errhandler

    def Call_errhandler(self, errorcode):
        self._check()
        raise MPIException(errorcode)

    def Get_info(self):
        """A new Info object with the hints in use (``erdma_compress``), as
        MPI_Comm_get_info."""
        self._check()
        from .MPI import Info
        return Info.Create(self._chints)

    def Set_info(self, info):
        """Take the hints erdmampi knows from ``info`` (``erdma_compress``:
        see :mod:`erdmampi.compression`); other keys are ignored, as MPI allows."""
        self._check()
        for k, v in _hints_of(info).items():
            if v is None:
                self._chints.pop(k, None)
            else:
                self._chints[k] = v

    info = property(Get_info, Set_info)

    def Is_inter(self):
        self._check()
        return False

    def Is_intra(self):
        self._check()
        return True

    @property
    def is_inter(self):
        return self.Is_inter()

    @property
    def is_intra(self):
        return self.Is_intra()

    def Get_topology(self):
        self._check()
        return UNDEFINED

    @property
    def topology(self):
        return self.Get_topology()

    @property
    def is_topo(self):
        return self.Get_topology() != UNDEFINED

    @classmethod
    def Get_parent(cls):
        return COMM_NULL

    def py2f(self):
        return self._handle if self._ranks is not None else _NULL_HANDLE

    toint = py2f

    @property
    def handle(self):
        return self.py2f()

    @classmethod
    def f2py(cls, arg):
        arg = int(arg)
        for c in (COMM_WORLD, COMM_SELF):
            if c._handle == arg:
                return c
        if arg == _NULL_HANDLE:
            return COMM_NULL
        raise_error(ERR_COMM, f"unknown communicator handle {arg:#x}")

    fromint = f2py

    def Abort(self, errorcode=0):
        """Terminate every process of the job (this one exits with ``errorcode``)."""
        try:
            sys.stdout.flush()
        except Exception:
            pass
        rank = _rt.engine.rank if _rt.engine is not None else 0
        try:
            sys.stderr.write(f"application called MPI_Abort({self._name or 'comm'}, "
                             f"{int(errorcode)}) - process {rank}\n")
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(int(errorcode) & 0xFF if int(errorcode) else 0)

    # -- Point-to-point: blocking -------------------------------------------

    def Send(self, buf, dest, tag=0):
        """Blocking send."""
        # fast path: the buffer spec remembered last (see _p2p_plain), a valid
        # rank and tag: one C call (_engine.fast); the rest: _send_more
        if _deferred:
            _reap_deferred()
        r = _fast_send(self._fast, buf, dest, tag)
        if r:
            self._send_more(r, buf, dest, tag)

    def _send_more(self, r, buf, dest, tag):
        """Send after the fast call answered ``r`` (see _engine.fast)."""
        if r != 1:
            return _fast_raise(r, buf, "send")
        # a plain host array (alone or with a predefined datatype, see
        # _p2p_plain), a valid rank and tag; everything else goes through
        # _send, which parses and checks
        ranks = self._ranks
        eng = _rt.engine
        if (type(dest) is int and type(tag) is int and ranks is not None and eng is not None
                and 0 <= dest < len(ranks) and 0 <= tag <= TAG_UB_VALUE):
            ptr, n, arr = self._p2p_plain(buf, True)
            if arr is not None:
                try:
                    err = eng.send_plain(ptr, n, ranks[dest], tag, self._ctx, arr)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                if err:
                    raise_status_code(err)
                return
        self._send(buf, dest, tag, False)

    def Bsend(self, buf, dest, tag=0):
        """Buffered send (the engine buffers: same as Send)."""
        self.Send(buf, dest, tag)

    def Rsend(self, buf, dest, tag=0):
        """Ready send (same as Send)."""
        self.Send(buf, dest, tag)

    def Ssend(self, buf, dest, tag=0):
        """Synchronous send: returns once the receive has matched."""
        self._send(buf, dest, tag, True)

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking receive."""
        # fast path as in Send
        if status is None:
            r = _fast_recv(self._fast, buf, source, tag)
            if not r:
                return
            if r != 1:
                return _fast_raise(r, buf, "recv")
        else:
            r = _fast_recv_status(self._fast, buf, source, tag)
            if r != 1:
                return self._fast_status(r, buf, status)
        self._recv_more(buf, source, tag, status)

    def _fast_status(self, r, keep, status):
        """Fill ``status`` from a fast receive's answer (as Request.Wait:
        MPI_ERROR untouched), then raise its error, if any."""
        if len(r) == 2:
            try:
                st = _engine.fast_rest(r, keep, "recv")
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            r = (st.error, st.source, st.tag, st.nbytes)
        status._fill(self._comm_rank(r[1]), r[2], status._error, r[3], False)
        if r[0]:
            raise_status_code(r[0])

    def _recv_more(self, buf, source, tag, status):
        """Recv after a fast-call miss: a plain host array as in _send_more
        (remembered, so that the next call takes the one-call path; with a
        status this one still goes through _recv), the rest through _recv."""
        ranks = self._ranks
        eng = _rt.engine
        if (type(source) is int and type(tag) is int and ranks is not None and eng is not None
                and (0 <= tag <= TAG_UB_VALUE or tag == ANY_TAG)):
            if 0 <= source < len(ranks):
                wsrc = ranks[source]
            elif source == ANY_SOURCE:
                wsrc = _engine.ANY_SOURCE
            else:
                wsrc = None
            if wsrc is not None:
                ptr, n, arr = self._p2p_plain(buf, False)
                if arr is not None and status is None:
                    etag = _engine.ANY_TAG if tag == ANY_TAG else tag
                    try:
                        err = eng.recv_plain(ptr, n, wsrc, etag, self._ctx, arr)
                    except _engine.EngineError as e:
                        raise engine_exception(e) from None
                    if err:
                        raise_status_code(err)
                    return
        self._recv(buf, source, tag, status)

    def _p2p_plain(self, buf, readonly):
        """``(pointer, nbytes, array)`` of a spec that is one whole plain host
        array (``numpy.ndarray`` alone, or with a predefined datatype without
        gaps), else ``(None, 0, None)``.  A small one is remembered per
        direction by the communicator's fast-path state (by the identity of
        the spec, its array and datatype), so that the next Send/Recv of the
        same spec is one C call (see _engine.fast)."""
        arr = _plain_array(buf, readonly)
        if arr is None:
            return None, 0, None
        ptr = _buffer_pointer(arr)
        n = arr.nbytes
        if n <= _P2P_CACHE_MAX and _engine.fast is not None:
            dt = None if arr is buf else buf[1]
            recv = not readonly
            f = self._fast
            if f is None or not _fast_remember(f, recv, buf, arr, dt, arr.flags.num):
                f = self._fast_state()
                if f is not None and _fast_remember(f, recv, buf, arr, dt, arr.flags.num):
                    self._fast = f
        return ptr, n, arr

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send and receive."""
        rreq = Request._new(self._irecv_op(recvbuf, source, recvtag))
        sreq = Request._new(self._isend_op(sendbuf, dest, sendtag))
        rreq.Wait(status)
        sreq.Wait()

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                         status=None):
        """Send and receive in one buffer."""
        msg = message_p2p(buf, False)
        tmp = np.array(msg.array, copy=True).reshape(-1).view(np.uint8)
        sreq = Request._new(self._isend_op([tmp, "B"], dest, sendtag))
        rreq = Request._new(self._irecv_op(buf, source, recvtag))
        rreq.Wait(status)
        sreq.Wait()

    # -- Point-to-point: nonblocking ----------------------------------------

    def Isend(self, buf, dest, tag=0):
        return Request._new(self._isend_op(buf, dest, tag))

    Ibsend = Isend
    Irsend = Isend

    def Issend(self, buf, dest, tag=0):
        return Request._new(self._isend_op(buf, dest, tag, sync=True))

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return Request._new(self._irecv_op(buf, source, tag))

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                  recvtag=ANY_TAG):
        rop = self._irecv_op(recvbuf, source, recvtag)
        sop = self._isend_op(sendbuf, dest, sendtag)
        return _pair_request(Request._new(rop), Request._new(sop))

    # -- Persistent ---------------------------------------------------------

    def Send_init(self, buf, dest, tag=0):
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(lambda: self._isend_op(buf, dest, tag))

    Bsend_init = Send_init
    Rsend_init = Send_init

    def Ssend_init(self, buf, dest, tag=0):
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(lambda: self._isend_op(buf, dest, tag, sync=True))

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        self._source(source)
        self._recv_tag(tag)
        return Prequest._persistent(lambda: self._irecv_op(buf, source, tag))

    # -- Probes -------------------------------------------------------------

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Block until a matching message is available."""
        raw = self._probe_raw(source, tag, True)
        self._fill_probe(status, raw)
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Whether a matching message is available."""
        raw = self._probe_raw(source, tag, False)
        if raw is None:
            return False
        self._fill_probe(status, raw)
        return True

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Matched probe: returns a Message removed from the queue."""
        return self._probed_message(self._probe_raw(source, tag, True, True), status)

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe: a Message or None."""
        got = self._probe_raw(source, tag, False, True)
        if got is None:
            return None
        return self._probed_message(got, status)

    def _probed_message(self, got, status):
        if got == "noproc":
            self._fill_probe(status, got)
            return MESSAGE_NO_PROC
        emsg, raw = got
        self._fill_probe(status, raw)
        return Message._new(self, emsg)

    # -- Python objects: point-to-point -------------------------------------

    def send(self, obj, dest, tag=0):
        """Send a Python object."""
        data = self._pkl._encode(obj)
        # a small object to a rank of this host: one C call (_engine.fast)
        if not _fast_send_bytes(self._fast or self._fast_obj_state(), data, dest, tag):
            return
        Request._new(self._isend_obj_op(obj, dest, tag, data=data)).wait()

    bsend = send

    def ssend(self, obj, dest, tag=0):
        """Synchronous send of a Python object."""
        Request._new(self._isend_obj_op(obj, dest, tag, sync=True)).wait()

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Receive a Python object; ``buf`` (optional) bounds its pickled size."""
        if buf is None and status is None:
            # receive and copy out in one C call (_engine.fast)
            try:
                got = _recv_bytes_fast(self._fast or self._fast_obj_state(), source, tag)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            if got is not None:
                data, err = got
                if err:
                    raise_status_code(err)
                return self._pkl._decode(data)
        return Request._new(self._irecv_obj_op(source, tag, buf)).wait(status)

    def _fast_obj_state(self):
        """The communicator's _engine.fast state, made now if it has none yet."""
        f = self._fast = self._fast_state()
        return f

    def isend(self, obj, dest, tag=0):
        return Request._new(self._isend_obj_op(obj, dest, tag))

    ibsend = isend

    def issend(self, obj, dest, tag=0):
        return Request._new(self._isend_obj_op(obj, dest, tag, sync=True))

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        """Nonblocking receive of a Python object; ``wait()`` returns it."""
        return Request._new(self._irecv_obj_op(source, tag, buf))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send and receive Python objects."""
        if recvbuf is None and status is None:
            data = self._pkl._encode(sendobj)
            # a small object to a rank of this host goes at once: then the fast recv
            if not _fast_send_bytes(self._fast or self._fast_obj_state(), data, dest, sendtag):
                return self.recv(None, source, recvtag)
            sreq = Request._new(self._isend_obj_op(sendobj, dest, sendtag, data=data))
            obj = Request._new(self._irecv_obj_op(source, recvtag)).wait()
            sreq.wait()
            return obj
        rreq = Request._new(self._irecv_obj_op(source, recvtag))
        sreq = Request._new(self._isend_obj_op(sendobj, dest, sendtag))
        obj = rreq.wait(status)
        sreq.wait()
        return obj

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Probe(source, tag, status)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Iprobe(source, tag, status)

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Mprobe(source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Improbe(source, tag, status)

    # -- Collectives: buffers -----------------------------------------------
    # Each _c_* method parses and checks its arguments in the caller's thread
    # and returns a closure that runs the algorithm (run now, or in a thread
    # for the nonblocking variant).

    def _cplan(self, name, compress, dtype, nbytes, op=None, device=False, addr=0):
        """The compression coder of this call, or None (normal algorithm)."""
        if compress is _SKIP:
            return None
        if compress is None and not self._chints:
            mode = _cz._config.mode
            if mode == "off" or (mode == "auto" and nbytes < _cz.AUTO_MIN_BYTES):
                return None          # the common case: no per-call work
        hosts = self.__dict__.get("_chosts")
        if hosts is None or len(hosts) != len(self._ranks):
            world_hosts = (_rt.info or {}).get("hosts")
            hosts = ([world_hosts[w] for w in self._ranks] if world_hosts
                     else [None] * len(self._ranks))
            self._chosts = hosts
        return _cz.plan(self, name, compress, dtype, nbytes, op=op, hosts=hosts,
                        rank=self._rank, device=device, addr=addr)

    def _cdev(self, compress):
        """Whether a call with device buffers may be compressed, so that the
        device path (no staging) is worth trying: a mode other than off, and
        for ``auto`` a communicator spanning hosts."""
        try:
            mode = _cz.mode_of(self, compress)[0]
        except ValueError:
            return True            # plan() reports it
        if mode in (None, "off"):
            return False
        if mode == "auto":
            world_hosts = (_rt.info or {}).get("hosts")
            if not world_hosts or len({world_hosts[w] for w in self._ranks}) < 2:
                return False
        try:
            from numba import cuda  # noqa: F401
        except ImportError:
            return False
        return True

    def _cplan_msgs(self, name, compress, whole, part, size):
        """Plan a block collective from its messages: ``whole`` holds all
        ``size`` blocks where present on this rank, else ``part`` one block
        (so every rank computes the same vector size)."""
        if compress is _SKIP:
            return None
        msg = whole if whole is not None else part
        if msg is None or msg.datatype.np_dtype is None:
            return None if msg is None else self._cplan(name, compress, np.uint8,
                                                        msg.nbytes * (1 if whole else size),
                                                        addr=msg.addr)
        nbytes = msg.nbytes if whole is not None else msg.nbytes * size
        return self._cplan(name, compress, msg.array.dtype, nbytes, addr=msg.addr)

    def _dev_blocks(self, name, compress, sendbuf, recvbuf, size, recv_blocks, root,
                    algo, send_blocks=False):
        """Device path of a block collective: None (not device buffers), a
        runner (compressed on the GPU), or False (plan said no: stage)."""
        bufs = [b for b in (sendbuf, recvbuf) if b is not None]
        if not bufs or any(_dev(b) is None for b in bufs) or not self._cdev(compress):
            return None
        sarr = rarr = None
        if sendbuf is not None:
            sarr, dtype = _dev_msg(sendbuf)
        if recvbuf is not None:
            rarr, dtype = _dev_msg(recvbuf)
        if sarr is not None and rarr is not None:
            sblk = sarr.size // size if send_blocks else sarr.size
            rblk = rarr.size // size if (recv_blocks and name != "scatter") else rarr.size
            if sblk != rblk:
                raise ValueError(f"mismatch in send count {sarr.size} and receive "
                                 f"count {rarr.size}")
        if name in ("gather",):
            whole = rarr
            nbytes = (rarr.size if rarr is not None else sarr.size * size) * dtype.itemsize
        elif name == "scatter":
            nbytes = (sarr.size if sarr is not None else rarr.size * size) * dtype.itemsize
        else:
            nbytes = rarr.size * dtype.itemsize
        cd = self._cplan(name, compress, dtype, nbytes, device=True,
                         addr=_dev_addr(recvbuf if recvbuf is not None else sendbuf))
        if cd is None:
            return False
        t = self._transport()
        if root is None:
            return lambda: algo(t, sarr, rarr, cd)
        return lambda: algo(t, sarr, rarr, root, cd)

    def _c_barrier(self):
        self._check()
        t = self._transport()
        return lambda: coll.barrier(t)

    def _c_bcast(self, buf, root, compress=None):
        self._check()
        root = self._root(root)
        if _dev(buf) is not None and self._cdev(compress):
            arr, dtype = _dev_msg(buf)
            cd = self._cplan("bcast", compress, dtype, arr.size * dtype.itemsize,
                             device=True, addr=_dev_addr(buf))
            if cd is not None:
                t = self._transport()
                return lambda: _czcoll.bcast(t, arr, root, cd)
            compress = _SKIP
        msg = message_cco(buf, self._rank == root, 1)
        t = self._transport()
        cd = self._cplan("bcast", compress, msg.array.dtype, msg.nbytes, addr=msg.addr)
        if cd is not None:
            def crun():
                _czcoll.bcast(t, msg.array, root, cd)
                msg.finish()
            return crun

        def run():
            coll.bcast(t, _u8(msg.array), root)
            msg.finish()
        return run

    def _c_reduce(self, sendbuf, recvbuf, op, root):
        self._check()
        root = self._root(root)
        _check_op(op)
        isroot = self._rank == root
        smsg = None if (isroot and is_in_place(sendbuf)) else message_cco(sendbuf, True, 1)
        rmsg = message_cco(recvbuf, False, 1) if isroot else None
        if smsg is not None and rmsg is not None and smsg.nbytes != rmsg.nbytes:
            raise _mismatch(smsg, rmsg)
        dt = (smsg or rmsg).datatype
        op._check(dt)
        t = self._transport()
        sarr = smsg.array if smsg is not None else None
        rarr = rmsg.array if rmsg is not None else None

        def run():
            coll.reduce(t, sarr, rarr, root, _reduce_fn(op, dt), op.Is_commutative())
            if rmsg is not None:
                rmsg.finish()
        return run

    def _reduce_msgs(self, sendbuf, recvbuf, op):
        """``(smsg or None for IN_PLACE, rmsg, datatype)`` of an all-rank reduction."""
        self._check()
        _check_op(op)
        rmsg = message_cco(recvbuf, False, 1)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        if smsg is not None and smsg.nbytes != rmsg.nbytes:
            raise _mismatch(smsg, rmsg)
        dt = rmsg.datatype
        op._check(dt)
        return smsg, rmsg, dt

    def _c_allreduce(self, sendbuf, recvbuf, op, compress=None):
        inplace = is_in_place(sendbuf)
        if (_dev(recvbuf) is not None and (inplace or _dev(sendbuf) is not None)
                and self._cdev(compress)):
            self._check()
            _check_op(op)
            rarr, dtype = _dev_msg(recvbuf)
            sarr = None
            if not inplace:
                sarr, sdt = _dev_msg(sendbuf)
                if sarr.size != rarr.size or sdt != dtype:
                    raise ValueError(f"mismatch in send ({sarr.size} x {sdt}) and "
                                     f"receive ({rarr.size} x {dtype}) buffers")
            dt = _dev_dtype_datatype(dtype)
            op._check(dt)
            cd = self._cplan("allreduce", compress, dtype, rarr.size * dtype.itemsize,
                             op=op, device=True, addr=_dev_addr(recvbuf))
            if cd is not None:
                t = self._transport()
                return lambda: _czcoll.allreduce(t, sarr, rarr, _reduce_fn(op, dt), cd)
            compress = _SKIP
        smsg, rmsg, dt = self._reduce_msgs(sendbuf, recvbuf, op)
        t = self._transport()
        if rmsg.datatype.np_dtype is not None and (_mult(rmsg) == 1 or op._predefined):
            cd = self._cplan("allreduce", compress, rmsg.array.dtype, rmsg.nbytes, op=op,
                             addr=rmsg.addr)
            if cd is not None:
                def crun():
                    _czcoll.allreduce(t, None if smsg is None else smsg.array, rmsg.array,
                                      _reduce_fn(op, dt), cd)
                    rmsg.finish()
                return crun

        def run():
            coll.allreduce(t, None if smsg is None else smsg.array, rmsg.array,
                           _reduce_fn(op, dt), op.Is_commutative())
            rmsg.finish()
        return run

    def _c_scan(self, sendbuf, recvbuf, op, exclusive):
        smsg, rmsg, dt = self._reduce_msgs(sendbuf, recvbuf, op)
        t = self._transport()
        fn = coll.exscan if exclusive else coll.scan

        def run():
            fn(t, None if smsg is None else smsg.array, rmsg.array, _reduce_fn(op, dt))
            rmsg.finish()
        return run

    def _c_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, block):
        self._check()
        _check_op(op)
        size = len(self._ranks)
        rmsg = message_cco(recvbuf, False, 1)
        inplace = is_in_place(sendbuf)
        if block and inplace:
            # mpi4py: the IN_PLACE buffer holds all blocks, one per rank
            if rmsg.count % size:
                raise ValueError(f"receive buffer size {rmsg.count} "
                                 f"is not a multiple of {size}")
            counts = [rmsg.count // size] * size
        elif block:
            counts = [rmsg.count] * size
        elif recvcounts is None:
            counts = None
        else:
            counts = [int(c) for c in recvcounts]
            if len(counts) != size:
                raise ValueError(f"expecting {size} items, got {len(counts)}")
        smsg = None if inplace else message_cco(sendbuf, True, 1)
        dt = rmsg.datatype
        op._check(dt)
        mult = _mult(rmsg)
        t = self._transport()
        if counts is None:
            t2 = self._transport()

        def run():
            cnts = counts
            if cnts is None:
                mine = np.array([rmsg.count], dtype=np.int64)
                allc = np.empty(size, dtype=np.int64)
                coll.allgatherv(t2, mine, allc, [1] * size, None)
                cnts = [int(c) for c in allc]
            ecounts = [c * mult for c in cnts]
            total = sum(ecounts)
            if inplace:
                full = rmsg.array
                if full.size < total:
                    raise ValueError(f"receive buffer too small for IN_PLACE "
                                     f"({full.size} < {total} elements)")
                coll.reduce_scatter(t, None, full, ecounts, _reduce_fn(op, dt),
                                    op.Is_commutative())
            else:
                if smsg.array.size < total:
                    raise ValueError(f"send buffer too small ({smsg.array.size} "
                                     f"< {total} elements)")
                coll.reduce_scatter(t, smsg.array[:total], rmsg.array, ecounts,
                                    _reduce_fn(op, dt), op.Is_commutative())
            rmsg.finish()
        return run

    def _c_gather(self, sendbuf, recvbuf, root, compress=None):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        inplace = isroot and is_in_place(sendbuf)
        dev = self._dev_blocks("gather", compress, None if inplace else sendbuf,
                               recvbuf if isroot else None, size, isroot, root,
                               _czcoll.gather)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size) if isroot else None
        smsg = None if inplace else message_cco(sendbuf, True, 1)
        if rmsg is not None:
            blk = rmsg.nbytes // size
            if smsg is not None and smsg.nbytes != blk:
                raise _mismatch(smsg, rmsg)
        t = self._transport()
        cd = self._cplan_msgs("gather", compress, rmsg, smsg, size)
        if cd is not None:
            return _run_compressed(_czcoll.gather, t, smsg, rmsg, cd, root)
        return _run_blocks(coll.gather, t, smsg, rmsg, root)

    def _c_gatherv(self, sendbuf, recvbuf, root):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        counts = displs = None
        rmsg = None
        if isroot:
            rmsg, _, counts, displs = _message_vector_bytes(recvbuf, False, size)
        smsg = None if (isroot and is_in_place(sendbuf)) else message_cco(sendbuf, True, 1)
        if isroot and smsg is not None and smsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {counts[self._rank] // max(_extent(rmsg), 1)}")
        return _run_gatherv(self._transport(), smsg, rmsg, counts, displs, root)

    def _c_scatter(self, sendbuf, recvbuf, root, compress=None):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        inplace = isroot and is_in_place(recvbuf)
        dev = self._dev_blocks("scatter", compress, sendbuf if isroot else None,
                               None if inplace else recvbuf, size, isroot, root,
                               _czcoll.scatter, send_blocks=True)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        smsg = message_cco(sendbuf, True, size) if isroot else None
        rmsg = None if inplace else message_cco(recvbuf, False, 1)
        if smsg is not None:
            blk = smsg.nbytes // size
            if rmsg is not None and rmsg.nbytes != blk:
                raise _mismatch(smsg, rmsg)
        t = self._transport()
        cd = self._cplan_msgs("scatter", compress, smsg, rmsg, size)
        if cd is not None:
            return _run_compressed(_czcoll.scatter, t, smsg, rmsg, cd, root)
        return _run_blocks(coll.scatter, t, smsg, rmsg, root)

    def _c_scatterv(self, sendbuf, recvbuf, root):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        smsg = counts = displs = None
        if isroot:
            smsg, _, counts, displs = _message_vector_bytes(sendbuf, True, size)
        rmsg = None if (isroot and is_in_place(recvbuf)) else message_cco(recvbuf, False, 1)
        if isroot and rmsg is not None and rmsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count and receive count {rmsg.count}")
        return _run_scatterv(self._transport(), smsg, rmsg, counts, displs, root)

    def _c_allgather(self, sendbuf, recvbuf, compress=None):
        self._check()
        size = len(self._ranks)
        inplace = is_in_place(sendbuf)
        dev = self._dev_blocks("allgather", compress, None if inplace else sendbuf,
                               recvbuf, size, True, None, _czcoll.allgather)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        blk = rmsg.nbytes // size
        if smsg is not None and smsg.nbytes > blk:
            # every rank receives blocks larger than its receive blocks (MPICH: truncation)
            raise_error(ERR_TRUNCATE, f"send count {smsg.count} exceeds the receive "
                                      f"block ({rmsg.count} // {size})")
        if smsg is not None and smsg.nbytes != blk:
            raise _mismatch(smsg, rmsg)
        counts, displs = _blocks(blk, size)
        t = self._transport()
        cd = self._cplan_msgs("allgather", compress, rmsg, None, size)
        if cd is not None:
            return _run_compressed(_czcoll.allgather, t, smsg, rmsg, cd)
        return _run_allgatherv(t, smsg, rmsg, counts, displs)

    def _c_allgatherv(self, sendbuf, recvbuf):
        self._check()
        size = len(self._ranks)
        rmsg, c, counts, displs = _message_vector_bytes(recvbuf, False, size)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        if smsg is not None and smsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {c[self._rank]}")
        return _run_allgatherv(self._transport(), smsg, rmsg, counts, displs)

    def _c_alltoall(self, sendbuf, recvbuf, compress=None):
        self._check()
        size = len(self._ranks)
        inplace = is_in_place(sendbuf)
        dev = self._dev_blocks("alltoall", compress, None if inplace else sendbuf,
                               recvbuf, size, True, None, _czcoll.alltoall,
                               send_blocks=True)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size)
        smsg = None if inplace else message_cco(sendbuf, True, size)
        if smsg is not None and smsg.nbytes != rmsg.nbytes:
            raise _mismatch(smsg, rmsg)
        t = self._transport()
        cd = self._cplan_msgs("alltoall", compress, rmsg, None, size)
        if cd is not None:
            return _run_compressed(_czcoll.alltoall, t, smsg, rmsg, cd)
        return _run_blocks(coll.alltoall, t, smsg, rmsg)

    def _c_alltoallv(self, sendbuf, recvbuf):
        self._check()
        size = len(self._ranks)
        rmsg, _, rcounts, rdispls = _message_vector_bytes(recvbuf, False, size)
        scounts = sdispls = None
        smsg = None
        if not is_in_place(sendbuf):
            smsg, _, scounts, sdispls = _message_vector_bytes(sendbuf, True, size)
        t = self._transport()

        def run():
            coll.alltoallv(t, _u8_of(smsg), scounts, sdispls, _u8_of(rmsg), rcounts, rdispls)
            rmsg.finish()
        return run

    def Barrier(self):
        """Block until every process has entered."""
        if self._small_ok("barrier"):
            try:
                _engine.coll_barrier(_rt.engine, self._cranks, len(self._ranks), self._rank,
                                     self._coll_base(), self._ctx + 1)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            return
        self._c_barrier()()

    def Bcast(self, buf, root=0, *, compress=None):
        if compress is None and type(root) is int and self._small_ok("bcast"):
            c = self._bccache       # the last call's resolved buffer, if the same
            n = len(self._ranks)
            if (c is not None and _spec_is(buf, c[0], c[1]) and c[0].nbytes == c[2]
                    and 0 <= root < n and self._no_compress("bcast", c[2], c[3], arr=c[0])):
                f = c[0].flags
                if f.writeable and f.c_contiguous:
                    try:
                        _engine.coll_bcast(_rt.engine, c[4], c[2], root, self._cranks, n,
                                           self._rank, self._coll_base(), self._ctx + 1)
                    except _engine.EngineError as e:
                        raise engine_exception(e) from None
                    return
            arr = _plain_array(buf, False)
            npd = None if arr is None else _spec_np_dtype(buf, arr)
            if (arr is not None and 0 <= root < n
                    and (arr.nbytes <= _SMALL_COLL_MAX
                         or n == 2 and arr.nbytes < coll.BULK_BCAST_MIN)  # binomial too
                    and self._no_compress("bcast", arr.nbytes, npd, arr=arr)):
                ptr = _buffer_pointer(arr)
                self._bccache = (arr, None if arr is buf else buf[1], arr.nbytes, npd, ptr)
                try:
                    _engine.coll_bcast(_rt.engine, ptr, arr.nbytes, root,
                                       self._cranks, n, self._rank, self._coll_base(),
                                       self._ctx + 1)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                return
        self._c_bcast(buf, root, compress)()

    # -- small collectives in one engine call (erdma_coll_*) ----------------
    #
    # A Barrier, or a Bcast / Allreduce of at most _SMALL_COLL_MAX bytes of a
    # plain host array with a predefined (C-reducible) op, runs its whole
    # algorithm in the calling thread inside the engine: the same messages
    # (tags, sizes, order of reduction) as the Python algorithm the default
    # rule picks for it (dissemination, binomial, recursive doubling), so a
    # rank that takes the Python path (a strided buffer, say) still matches.
    # Not where that rule may pick another one: an ERDMA_COLL_<NAME> override,
    # ranks on several hosts (hierarchical), compression.

    def _small_ok(self, name):
        ranks = self._ranks
        if ranks is None or _rt.engine is None:
            return False
        c = self._csmall
        if c is None or c[0] is not ranks:
            world_hosts = (_rt.info or {}).get("hosts")
            k = len({world_hosts[w] for w in ranks}) if world_hosts else 1
            self._cranks = _engine.ranks_array(ranks)   # first: another thread may look
            c = self._csmall = (ranks, not (1 < k < len(ranks)), k <= 1)
        return c[1] and not isinstance(self, Intercomm) and _COLL_ENV[name] not in _environ_data

    def _no_compress(self, name, nbytes, dtype, op=None, arr=None):
        """Whether this call runs uncompressed (as _cplan decides: its cheap
        cases here, else on one host _cplan itself)."""
        if not self._chints:
            mode = _cz._config.mode
            if mode == "off" or (mode == "auto" and nbytes < _cz.AUTO_MIN_BYTES):
                return True
        if not self._csmall[2]:
            return False            # several hosts: the normal path plans
        addr = 0 if arr is None else arr.__array_interface__["data"][0]
        return self._cplan(name, None, dtype, nbytes, op=op, addr=addr) is None

    def _small_allreduce(self, sendbuf, recvbuf, op):
        """Allreduce in one engine call where it applies (see above): True
        when done."""
        if not (type(op) is Op and op._predefined and self._small_ok("allreduce")):
            return False
        c = self._arcache       # the last call's resolved buffers, if the same
        if (c is not None and op is c[2] and _spec_is(recvbuf, c[3], c[4])
                and (_spec_is(sendbuf, c[5], c[6]) or c[5] is None and sendbuf is IN_PLACE)
                and c[3].nbytes == c[7] and (c[5] is None or c[5].nbytes == c[7])
                and self._no_compress("allreduce", c[7], c[1], op, c[3])):
            f = c[3].flags
            if f.writeable and f.c_contiguous:
                if c[0] is _engine.coll_allreduce:
                    self._fast_remember_allreduce(sendbuf, recvbuf, c)
                try:
                    c[0](_rt.engine, c[8], c[9], c[10], c[11], c[12], self._cranks,
                         len(self._ranks), self._rank, self._coll_base(), self._ctx + 1)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                return True
        codes = _C_OPS.get(op._name)
        rtype = type(recvbuf)
        if codes is None or rtype is not _ndarray and rtype is not list and rtype is not tuple:
            return False
        rarr, rdt = _plain_with_type(recvbuf, False)
        if rarr is None or rdt.np_dtype is None:
            return False
        fn = _engine.coll_allreduce
        if rarr.nbytes > _SMALL_COLL_MAX:
            # two ranks of one host, mid sizes: the pair (erdma_coll_allreduce_pair)
            n = len(self._ranks)
            if not (n == 2 and self._csmall[2] and sendbuf is not IN_PLACE
                    and not is_in_place(sendbuf) and coll._default(
                        "allreduce", rarr.nbytes, n, rarr.size, True) == "sched_pair"):
                return False
            fn = _engine.coll_allreduce_pair
        npd = rdt.np_dtype
        if not self._no_compress("allreduce", rarr.nbytes, npd, op, rarr):
            return False
        sarr = sdt = None
        if sendbuf is IN_PLACE or is_in_place(sendbuf):
            saddr = None
        else:
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None or sdt is not rdt or sarr.nbytes != rarr.nbytes or (
                    fn is not _engine.coll_allreduce and np.may_share_memory(sarr, rarr)):
                return False
            saddr = _buffer_pointer(sarr)
        ctype = _c_dtype(rdt)
        if ctype is None or ctype[2] and op._name not in _LOGICAL_OPS:
            return False
        try:
            op._check(rdt)
        except Exception:
            return False            # the normal path reports it
        raddr = _buffer_pointer(rarr)
        count = rarr.nbytes // ctype[3]
        c = (fn, npd, op,
             rarr, None if type(recvbuf) is _ndarray else rdt,
             sarr, None if sarr is None or type(sendbuf) is _ndarray else sdt,
             rarr.nbytes, saddr, raddr, count, codes, ctype[1])
        # the cache keeps its arrays alive: not a large one
        self._arcache = c if rarr.nbytes <= _COLL_CACHE_MAX else None
        if fn is _engine.coll_allreduce:
            self._fast_remember_allreduce(sendbuf, recvbuf, c)
        try:
            fn(_rt.engine, saddr, raddr, count, codes, ctype[1], self._cranks,
               len(self._ranks), self._rank, self._coll_base(), self._ctx + 1)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return True

    def _fast_remember_allreduce(self, sendbuf, recvbuf, c):
        """Make the small Allreduce _small_allreduce just resolved (its cache
        entry ``c``) known to the C fast path, when it would take the same
        way again as long as the environment override, the compression mode
        and the hints stay as they are now (the C call checks them)."""
        if _engine.fast is None or self._chints or not self._csmall[2]:
            return
        mode = _cz._config.mode
        if not (mode == "off" or (mode == "auto" and c[7] < _cz.AUTO_MIN_BYTES)):
            return
        rarr, sarr = c[3], c[5]
        args = (IN_PLACE if sarr is None else sendbuf, sarr, c[6], recvbuf, rarr, c[4], c[2],
                c[10], c[11], c[12], 0 if sarr is None else sarr.flags.num, rarr.flags.num,
                _environ_data, _COLL_ENV["allreduce"], _cz._config, self._chints)
        f = self._fast
        if f is None or not _fast_remember_allreduce(f, *args):
            f = self._fast_state()
            if f is not None and _fast_remember_allreduce(f, *args):
                self._fast = f

    # -- block collectives in one engine call --------------------------------
    #
    # An Alltoall, Allgather or Reduce_scatter_block of plain host arrays runs
    # as one engine call where the default rule picks an algorithm the engine
    # has: the direct Alltoall and Allgather and the ring Reduce_scatter of
    # erdma_coll.c for small vectors, the bulk (CMA) Alltoall, Allgather and
    # two-rank Reduce_scatter of erdma_bulk.c for large ones.  Same messages as the Python algorithm, so
    # a rank on the normal path still matches.  The resolved call is kept per
    # collective while the caller passes the same buffers.

    def _blocks_fast(self, name, sendbuf, recvbuf, op=None):
        """Run this call in one engine call if it applies: True when done."""
        if not self._small_ok(name):
            return False
        c = self._bkcache.get(name) if self._bkcache is not None else None
        if (c is None or c[6] is not op or not _same_spec(recvbuf, c[0], c[1], c[4], True)
                or not _same_spec(sendbuf, c[2], c[3], c[5], False)):
            c = self._blocks_resolve(name, sendbuf, recvbuf, op)
            if c is None:
                return False
        return self._one_call(name, c)

    def _one_call(self, name, c):
        """Run the resolved one-call entry ``c`` of collective ``name`` (its
        last five fields: the dtype, bytes and array compression would be
        planned from, the engine call and its leading arguments): True when
        done, False when this call is to be compressed (the normal path)."""
        npd, nbytes, arr, fn, args = c[-5:]
        if npd is not None and not self._no_compress(name, nbytes, npd, arr=arr):
            return False
        try:
            fn(_rt.engine, *args, self._cranks, len(self._ranks), self._rank, self._coll_base(),
               self._ctx + 1)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return True

    def _one_store(self, name, c, nbytes):
        """Keep entry ``c`` for the next call of ``name``, unless its arrays
        (``nbytes`` together) are large: the cache keeps them alive; ``c``
        either way."""
        if self._bkcache is None:
            self._bkcache = {}
        if nbytes <= _COLL_CACHE_MAX:
            self._bkcache[name] = c
        else:
            self._bkcache.pop(name, None)
        return c

    def _blocks_resolve(self, name, sendbuf, recvbuf, op):
        """The cache entry of a block collective (see above), or None: the
        normal path (which also reports every error)."""
        n = len(self._ranks)
        rarr, rdt = _plain_with_type(recvbuf, False)
        if rarr is None or rdt.np_dtype is None or not rarr.flags.c_contiguous:
            return None
        sarr = sdt = saddr = None
        if not (sendbuf is IN_PLACE or is_in_place(sendbuf)):
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None or np.may_share_memory(sarr, rarr):
                return None
            saddr = _buffer_pointer(sarr)
        raddr = _buffer_pointer(rarr)
        whole = rarr.nbytes if sarr is None or name != "reduce_scatter" else sarr.nbytes
        # blocks of whole elements (the normal path reports a count that does not divide)
        if whole % (rdt.np_dtype.itemsize * n) or sarr is not None and sarr.nbytes != (
                rarr.nbytes // n if name == "allgather" else
                rarr.nbytes * n if name == "reduce_scatter" else rarr.nbytes):
            return None
        blk = whole // n
        npd = rdt.np_dtype           # compression is planned on the receive side
        if name == "reduce_scatter":
            npd = None               # never compressed
            ctype = _c_dtype(rdt)
            codes = _C_OPS.get(getattr(op, "_name", None))
            if (type(op) is not Op or not op._predefined or codes is None or ctype is None
                    or ctype[2] and op._name not in _LOGICAL_OPS
                    or sdt is not None and sdt is not rdt):
                return None
            try:
                op._check(rdt)
            except Exception:
                return None
            choice = coll._default(name, whole, n, whole // ctype[3], True)
            if choice == "ring":
                fn = _engine.coll_reduce_scatter
            elif choice == "sched_pair" and sarr is not None:
                fn = _engine.coll_reduce_scatter_pair
            else:
                return None
            call = (fn, (saddr, raddr, blk // ctype[3], codes, ctype[1]))
        elif name == "alltoall":
            choice = coll._default(name, 2 * whole, n, whole, True)
            if choice == "direct":
                call = (_engine.coll_alltoall, (saddr, raddr, blk))
            elif choice == "sched" and sarr is not None:
                call = (_engine.coll_alltoall_bulk, (saddr, raddr, blk, _collsched.BULK_PULL_PART))
            else:
                return None
        else:
            choice = coll._default("allgatherv", whole, n, whole, True)
            if choice == "direct":
                call = (_engine.coll_allgather, (saddr, raddr, blk))
            elif choice == "sched_ring" and n <= _sched_algos.BULK_PULL_MAX_RANKS:
                offs = _engine.ffi.new("uint64_t[]", [blk * i for i in range(n)])
                lens = _engine.ffi.new("uint64_t[]", [blk] * n)
                call = (_engine.coll_allgather_bulk, (saddr, raddr, offs, lens))
            else:
                return None
        return self._one_store(name, (
            rarr, None if type(recvbuf) is _ndarray else rdt,
            sendbuf if sarr is None else sarr,
            _UNUSED if sarr is None else None if type(sendbuf) is _ndarray else sdt,
            rarr.nbytes, 0 if sarr is None else sarr.nbytes, op, npd, rarr.nbytes, rarr) + call,
            rarr.nbytes + (0 if sarr is None else sarr.nbytes))

    # Gather, Scatter and Reduce with a root, the same way: linear Gather and
    # Scatter (where the default rule picks them) and the binomial Reduce.

    def _rooted_fast(self, name, sendbuf, recvbuf, root, op=None):
        """Run this rooted call in one engine call if it applies: True when done."""
        if type(root) is not int or not self._small_ok(name):
            return False
        c = self._bkcache.get(name) if self._bkcache is not None else None
        if (c is None or c[0] != root or c[1] is not op
                or not _same_spec(sendbuf, c[2], c[3], c[4], False)
                or not _same_spec(recvbuf, c[5], c[6], c[7], True)):
            c = self._rooted_resolve(name, sendbuf, recvbuf, root, op)
            if c is None:
                return False
        return self._one_call(name, c)

    def _rooted_resolve(self, name, sendbuf, recvbuf, root, op):
        """The cache entry of a rooted collective (see above), or None."""
        n = len(self._ranks)
        if not 0 <= root < n:
            return None
        isroot = self._rank == root
        sarr = rarr = sdt = rdt = None
        if (isroot or name != "scatter") and not (isroot and name != "scatter"
                                                  and is_in_place(sendbuf)):
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None:
                return None
        if (isroot or name == "scatter") and not (isroot and name == "scatter"
                                                  and is_in_place(recvbuf)):
            rarr, rdt = _plain_with_type(recvbuf, False)
            if rarr is None or not rarr.flags.c_contiguous:
                return None
        if sarr is None and rarr is None or (sarr is not None and rarr is not None
                                             and np.may_share_memory(sarr, rarr)):
            return None
        dt = rdt if rdt is not None else sdt
        if dt.np_dtype is None:
            return None
        saddr = None if sarr is None else _buffer_pointer(sarr)
        raddr = None if rarr is None else _buffer_pointer(rarr)
        npd = dt.np_dtype
        if name == "reduce":
            npd = None               # never compressed
            nb = (sarr if sarr is not None else rarr).nbytes
            ctype = _c_dtype(dt)
            codes = _C_OPS.get(getattr(op, "_name", None))
            if (type(op) is not Op or not op._predefined or codes is None or ctype is None
                    or ctype[2] and op._name not in _LOGICAL_OPS
                    or sarr is not None and rarr is not None and (sdt is not rdt
                                                                  or rarr.nbytes != nb)):
                return None
            try:
                op._check(dt)
            except Exception:
                return None
            whole = nb
            call = (_engine.coll_reduce, (saddr, raddr, nb // ctype[3], codes, ctype[1], root))
        else:
            # the per-rank block and the vector at the root (all blocks there)
            part, full = (sarr, rarr) if name == "gather" else (rarr, sarr)
            blk = part.nbytes if part is not None else full.nbytes // n
            if (full is not None and full.nbytes != blk * n
                    or blk % dt.np_dtype.itemsize):
                return None
            whole = blk * n
            if coll._default(name, whole, n, 0, True) != "linear":
                return None
            call = (_engine.coll_gather if name == "gather" else _engine.coll_scatter,
                    (saddr, raddr, blk, root))
        return self._one_store(name, (
            root, op,
            sendbuf if sarr is None else sarr,
            _UNUSED if sarr is None else None if type(sendbuf) is _ndarray else sdt,
            0 if sarr is None else sarr.nbytes,
            recvbuf if rarr is None else rarr,
            _UNUSED if rarr is None else None if type(recvbuf) is _ndarray else rdt,
            0 if rarr is None else rarr.nbytes,
            npd, whole, rarr if rarr is not None else sarr) + call,
            (0 if sarr is None else sarr.nbytes) + (0 if rarr is None else rarr.nbytes))

    def Reduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        if self._rooted_fast("reduce", sendbuf, recvbuf, root, op):
            return
        self._c_reduce(sendbuf, recvbuf, _op_arg(op), root)()

    def Allreduce(self, sendbuf, recvbuf, op=_SUM, *, compress=None):
        if compress is None:
            # the small Allreduce remembered last: one C call (_engine.fast)
            r = _fast_allreduce(self._fast, sendbuf, recvbuf, op)
            if not r:
                return
            if r != 1:
                return _fast_coll_raise(r, "allreduce")
            if self._small_allreduce(sendbuf, recvbuf, op):
                return
        self._c_allreduce(sendbuf, recvbuf, _op_arg(op), compress)()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        if self._blocks_fast("reduce_scatter", sendbuf, recvbuf, op):
            return
        self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op), True)()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op), False)()

    def Gather(self, sendbuf, recvbuf, root=0, *, compress=None):
        if compress is None and self._rooted_fast("gather", sendbuf, recvbuf, root):
            return
        self._c_gather(sendbuf, recvbuf, root, compress)()

    def Gatherv(self, sendbuf, recvbuf, root=0):
        self._c_gatherv(sendbuf, recvbuf, root)()

    def Scatter(self, sendbuf, recvbuf, root=0, *, compress=None):
        if compress is None and self._rooted_fast("scatter", sendbuf, recvbuf, root):
            return
        self._c_scatter(sendbuf, recvbuf, root, compress)()

    def Scatterv(self, sendbuf, recvbuf, root=0):
        self._c_scatterv(sendbuf, recvbuf, root)()

    def Allgather(self, sendbuf, recvbuf, *, compress=None):
        if compress is None and self._blocks_fast("allgather", sendbuf, recvbuf):
            return
        self._c_allgather(sendbuf, recvbuf, compress)()

    def Allgatherv(self, sendbuf, recvbuf):
        self._c_allgatherv(sendbuf, recvbuf)()

    def Alltoall(self, sendbuf, recvbuf, *, compress=None):
        if compress is None and self._blocks_fast("alltoall", sendbuf, recvbuf):
            return
        self._c_alltoall(sendbuf, recvbuf, compress)()

    def Alltoallv(self, sendbuf, recvbuf):
        self._c_alltoallv(sendbuf, recvbuf)()

    # Nonblocking collectives: the algorithm runs in a background thread.

    def Ibarrier(self):
        return _icoll(self._c_barrier())

    def Ibcast(self, buf, root=0, *, compress=None):
        return _icoll(self._c_bcast(buf, root, compress))

    def Ireduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        return _icoll(self._c_reduce(sendbuf, recvbuf, _op_arg(op), root))

    def Iallreduce(self, sendbuf, recvbuf, op=_SUM, *, compress=None):
        return _icoll(self._c_allreduce(sendbuf, recvbuf, _op_arg(op), compress))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op), True))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op), False))

    def Igather(self, sendbuf, recvbuf, root=0, *, compress=None):
        return _icoll(self._c_gather(sendbuf, recvbuf, root, compress))

    def Igatherv(self, sendbuf, recvbuf, root=0):
        return _icoll(self._c_gatherv(sendbuf, recvbuf, root))

    def Iscatter(self, sendbuf, recvbuf, root=0, *, compress=None):
        return _icoll(self._c_scatter(sendbuf, recvbuf, root, compress))

    def Iscatterv(self, sendbuf, recvbuf, root=0):
        return _icoll(self._c_scatterv(sendbuf, recvbuf, root))

    def Iallgather(self, sendbuf, recvbuf, *, compress=None):
        return _icoll(self._c_allgather(sendbuf, recvbuf, compress))

    def Iallgatherv(self, sendbuf, recvbuf):
        return _icoll(self._c_allgatherv(sendbuf, recvbuf))

    def Ialltoall(self, sendbuf, recvbuf, *, compress=None):
        return _icoll(self._c_alltoall(sendbuf, recvbuf, compress))

    def Ialltoallv(self, sendbuf, recvbuf):
        return _icoll(self._c_alltoallv(sendbuf, recvbuf))

    # -- Collectives: Python objects ----------------------------------------

    def _obj_transport(self):
        self._check()
        t = self._transport()
        t._pkl = self._pkl
        return t, self._pkl._encode, self._pkl._decode

    def barrier(self):
        """Barrier (object API)."""
        self.Barrier()

    def bcast(self, obj, root=0):
        """Broadcast a Python object from ``root``."""
        root = self._root(root)
        t, d, l = self._obj_transport()
        return coll.bcast_obj(t, obj, root, d, l)

    def gather(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        return coll.gather_obj(t, sendobj, root, d, l)

    def scatter(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        if self._rank == root and sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        return coll.scatter_obj(t, sendobj, root, d, l)

    def allgather(self, sendobj):
        t, d, l = self._obj_transport()
        return coll.allgather_obj(t, sendobj, d, l)

    def alltoall(self, sendobj):
        t, d, l = self._obj_transport()
        if sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        return coll.alltoall_obj(t, sendobj, d, l)

    def reduce(self, sendobj, op=None, root=0):
        root = self._root(root)
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.reduce_obj(t, sendobj, fn, root, d, l)

    def allreduce(self, sendobj, op=None):
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.allreduce_obj(t, sendobj, fn, d, l)


def _sum(op):
    """Lowercase (object) reductions: None means SUM, as in mpi4py."""
    if op is None:
        from .op import SUM
        return SUM
    return op


def _op_arg(op):
    """Uppercase (buffer) reductions: mpi4py's ``op`` must be an ``Op`` (default SUM)."""
    if not isinstance(op, Op):
        raise TypeError(f"Argument 'op' has incorrect type (expected MPI.Op, "
                        f"got {type(op).__name__})")
    return op


def _icoll(run):
    # The algorithm runs in a thread; the caller waits until it has posted its
    # first message or started its C schedule (erdmampi._collsched), so that a
    # schedule is running before the caller goes back to computing.
    started = threading.Event()

    def body():
        _collsched.icoll_state.started = started
        try:
            return run()
        finally:
            _collsched.icoll_state.started = None
            started.set()
    req = Request._new(_ThreadOp(body))
    started.wait()
    return req


def _pair_request(recv_req, send_req):
    """One request completing when both halves have (Isendrecv)."""
    rop, sop = recv_req._op, send_req._op

    class _PairOp:
        __slots__ = ("fields", "obj")
        persistent = False

        def __init__(self):
            self.fields = None
            self.obj = None

        def test(self):
            if self.fields is not None:
                return True
            if rop.test() and sop.test():
                self.fields = rop.fields
                self.obj = rop.obj
                return True
            return False

        def wait(self):
            rop.wait()
            sop.wait()
            self.test()

        def cancel(self):
            rop.cancel()
            sop.cancel()

        def free(self):
            rop.free()
            sop.free()

    return Request._new(_PairOp())


class Intracomm(Comm):
    """Intra-communicator, as ``MPI.Intracomm``."""

    # -- Constructors ---------------------------------------------------------

    def Split(self, color=0, key=0):
        """Split by ``color`` (UNDEFINED: COMM_NULL), ordering by ``key``."""
        self._check()
        size = len(self._ranks)
        color, key = int(color), int(key)
        t = self._transport()
        mine = np.array([color, key, _rt.next_ctx], dtype=np.int64)
        table = np.empty(3 * size, dtype=np.int64)
        coll.allgatherv(t, mine, table, [3] * size, None)
        table = table.reshape(size, 3)
        new = int(table[:, 2].max())
        with _rt.lock:
            _rt.next_ctx = max(_rt.next_ctx, new + 2)
        if color == UNDEFINED:
            return COMM_NULL
        members = sorted((int(table[r, 1]), r) for r in range(size) if int(table[r, 0]) == color)
        group = Group._from_ranks([self._ranks[r] for _, r in members])
        return Intracomm._from_group(group, new)

    def Split_type(self, split_type, key=0, info=None):
        """Split by type: COMM_TYPE_SHARED groups the processes of one host."""
        self._check()
        split_type = int(split_type)
        if split_type == UNDEFINED:
            return self.Split(UNDEFINED, key)
        if split_type not in (COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED):
            raise_error(ERR_ARG, f"invalid split type {split_type}")
        hosts = _rt.info.get("hosts") or [_rt.info.get("host")] * _rt.engine.size
        ordered = sorted(set(hosts))
        color = ordered.index(hosts[_rt.engine.rank])
        return self.Split(color, key)

    def Create(self, group):
        """Communicator for ``group`` (a subgroup); others get COMM_NULL."""
        self._check()
        group._check()
        members = set(self._ranks)
        if any(w not in members for w in group._ranks):
            raise_error(ERR_GROUP_, "group is not a subgroup of the communicator")
        ctx = self._agree_ctx()
        if group.Get_rank() == UNDEFINED:
            return COMM_NULL
        return Intracomm._from_group(Group._from_ranks(group._ranks), ctx)

    def Create_group(self, group, tag=0):
        """Like Create, but collective over ``group`` only."""
        self._check()
        group._check()
        if group.Get_rank() == UNDEFINED:
            return COMM_NULL
        members = set(self._ranks)
        if any(w not in members for w in group._ranks):
            raise_error(ERR_GROUP_, "group is not a subgroup of the communicator")
        tag = self._send_tag(tag)
        base = _GROUP_TAG_BASE + (tag % 65536) * _COLL_TAGS
        t = _CollTransport(self, self._ctx, base, ranks=group._ranks, rank=group.Get_rank())
        val = np.array([_rt.next_ctx], dtype=np.int64)
        coll.allreduce(t, None, val, lambda a, io: np.maximum(a, io, out=io))
        new = int(val[0])
        with _rt.lock:
            _rt.next_ctx = max(_rt.next_ctx, new + 2)
        return Intracomm._from_group(Group._from_ranks(group._ranks), new)

    # -- Prefix reductions ----------------------------------------------------

    def Scan(self, sendbuf, recvbuf, op=_SUM):
        self._c_scan(sendbuf, recvbuf, _op_arg(op), False)()

    def Exscan(self, sendbuf, recvbuf, op=_SUM):
        self._c_scan(sendbuf, recvbuf, _op_arg(op), True)()

    def Iscan(self, sendbuf, recvbuf, op=_SUM):
        return _icoll(self._c_scan(sendbuf, recvbuf, _op_arg(op), False))

    def Iexscan(self, sendbuf, recvbuf, op=_SUM):
        return _icoll(self._c_scan(sendbuf, recvbuf, _op_arg(op), True))

    def scan(self, sendobj, op=None):
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.scan_obj(t, sendobj, fn, d, l)

    def exscan(self, sendobj, op=None):
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.exscan_obj(t, sendobj, fn, d, l)


from .exceptions import ERR_GROUP as ERR_GROUP_  # noqa: E402


class Intercomm(Comm):
    """Inter-communicator type (not supported: no constructor creates one)."""


class Topocomm(Intracomm):
    """Topology communicator type (not supported)."""


class Cartcomm(Topocomm):
    pass


class Graphcomm(Topocomm):
    pass


class Distgraphcomm(Topocomm):
    pass


COMM_NULL = Comm()
COMM_NULL._predef = True
COMM_WORLD = Intracomm()
COMM_WORLD._name = "MPI_COMM_WORLD"
COMM_WORLD._handle = _WORLD_HANDLE
COMM_WORLD._predef = True
COMM_SELF = Intracomm()
COMM_SELF._name = "MPI_COMM_SELF"
COMM_SELF._handle = _SELF_HANDLE
COMM_SELF._predef = True
