"""Communicators: Comm and Intracomm over the engine and the collectives.

Point-to-point calls resolve their buffer spec with :mod:`erdmampi.buffers`
and hand address/length to the engine, which speaks COMM_WORLD ranks and byte
counts; this module translates ranks through the communicator's
:class:`~erdmampi.group.Group` and bytes to counts through
:class:`~erdmampi.status.Status`.  Collective calls build one
:class:`_CollTransport` per call over the communicator's collective context id
(``ctx + 1``), with engine tags unique per call.
"""

import pickle as _pickle
import weakref
import zlib

from . import attributes as _attributes

from ._commrt import (  # noqa: F401
    ANY_SOURCE, ANY_TAG, APPNUM, _blocks, bootstrap, BOTTOM, _buffer_pointer, _buffers,
    _c_dtype, _C_DTYPES, _C_OPS, _check_op, coll, _COLL_CACHE_MAX, _COLL_ENV,
    _COLL_TAGS, _collsched, _CollTransport, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED,
    COMM_TYPE_RESOURCE_GUIDED, COMM_TYPE_SHARED, _committed, CONGRUENT, _cz, _czcoll,
    _default_pickle, _deferred, _dev, _dev_addr, _dev_dtype_datatype, _dev_msg, _DoneOp,
    _engine, engine_exception, _engine_or_raise, _EngineOp, _environ_data, ERR_ARG,
    ERR_BUFFER, ERR_COMM, ERR_COUNT, ERR_KEYVAL, ERR_LASTCODE, ERR_OP, ERR_OTHER,
    ERR_RANK, ERR_ROOT, ERR_TAG, ERR_TRUNCATE, ERR_TYPE, error_class, error_text,
    _extent, _fast_allreduce, _fast_coll_raise, _fast_miss4, _fast_raise, _fast_recv,
    _fast_recv_bytes, _fast_recv_status, _fast_remember, _fast_remember_allreduce,
    _fast_send, _fast_send_bytes, Group, _GROUP_TAG_BASE, _hints_of, _icoll, IDENT,
    IN_PLACE, IO, is_in_place, itertools, KEYVAL_INVALID, LASTUSEDCODE, _LOGICAL_OPS,
    Message, message_cco, MESSAGE_NO_PROC, message_p2p, message_vector,
    _message_vector_bytes, _mismatch, MPIException, _mult, _ndarray, _new_handle, np,
    _NULL_HANDLE, Op, _op_arg, os, _p2p_buffer, _P2P_CACHE_MAX, _pair_request,
    _plain_array, _plain_datatype, _plain_spec, _plain_with_type, Prequest, PROC_NULL,
    _py_op, raise_error, raise_status_code, _reap_deferred, _recv_bytes_fast,
    _reduce_fn, Request, ROOT, _rt, _run_allgatherv, _run_blocks, _run_compressed,
    _run_gatherv, _run_scatterv, _Runtime, _same_spec, _sched_algos, _SELF_HANDLE,
    _send_fields, _SEQ_MOD, _set_world_rank, SIMILAR, _SKIP, _SMALL_COLL_MAX, socket,
    _spec_is, _spec_np_dtype, Status, _SUM, _sum, sys, TAG_UB, TAG_UB_VALUE, threading,
    _ThreadOp, _u8, _u8_of, UNDEFINED, UNEQUAL, UNIVERSE_SIZE, _UNUSED, _WORLD_HANDLE,
    WTIME_IS_GLOBAL)
from .comm_p2p import CommP2P
from .comm_coll import CommColl
from .comm_objcoll import CommObjColl
from .comm_ulfm import CommULFM
from ._objmodel import HandleBase
from . import _membuf
from . import msgpickle as _msgpickle
from .intracomm_inter import IntracommInter
from .intracomm_topo import IntracommTopo


# -----------------------------------------------------------------------------
# Init / Finalize (COMM_WORLD and COMM_SELF are set up here)


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
# Errhandler: erdmampi/errhandler.py

from .errhandler import (ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL,  # noqa: E402,F401
                         ERRORS_RETURN, Errhandler, HasErrhandler)
from .errhandler import _RETURN as _ERRH_RETURN  # noqa: E402



# -----------------------------------------------------------------------------
# Communicators


# live communicators by handle (fromhandle/f2py find them again)
_by_handle = weakref.WeakValueDictionary()


class Comm(CommP2P, CommColl, CommObjColl, HasErrhandler, CommULFM, HandleBase):
    """Communication context, as ``MPI.Comm``.

    ``_ranks`` is the tuple of COMM_WORLD ranks (None: null or freed),
    ``_ctx`` the point-to-point context id (collectives use ``_ctx + 1``).
    ``_fast``: the state of the one-call Send/Recv path (see ``_p2p_plain``).
    ``_handle`` is the MPI handle, in C memory (``HandleBase``): a null
    object into which a live handle was written (``MPI._addressof``) takes
    the state of that communicator when first checked (``_adopt``).
    """

    _p2p_misses = 0             # fast-path misses of Isend/Irecv/Sendrecv in a row
    _p2p_hits = 0               # _fast_hits when _p2p_misses was last counted
    _handle = HandleBase._h
    _csmall = _cranks = _arcache = _bccache = _bkcache = _lastlay = None

    def __new__(cls, comm=None, *args, **kwargs):
        # mpi4py's types build the object in __new__ (a subclass overriding
        # __new__ passes the communicator it made); __init__ does nothing
        self = super().__new__(cls)
        self._construct(comm)
        return self

    def __init__(self, *args, **kwargs):
        pass

    def _construct(self, comm=None):
        self._fast = None
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
        self._errh = _ERRH_RETURN
        self._pkl = _default_pickle
        self._chints = {}           # Info hints erdmampi reads (erdma_compress)
        if comm is not None:
            if not isinstance(comm, Comm):
                raise TypeError(f"expected Comm, got {type(comm).__name__}")
            self._share(comm)

    def _share(self, comm):
        for k in ("_ranks", "_group", "_rank", "_ctx", "_name", "_attrs", "_handle",
                  "_errh", "_predef", "_chints"):
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
        _by_handle[self._handle] = self
        self._tell_members(group._ranks)

    def _tell_members(self, ranks):
        """Tell the engine which world ranks are members of this communicator.

        A receive from ANY_SOURCE on it could match them (its failure
        notification, comm_ulfm).
        """
        eng = _rt.engine
        if eng is not None and self._ctx >= 0:
            eng.ctx_group(self._ctx, ranks)

    @classmethod
    def _from_group(cls, group, ctx):
        c = cls()
        c._setup(group, ctx)
        return c

    # Private helpers

    def _check(self):
        if self._ranks is None and not self._adopt():
            raise_error(ERR_COMM, "invalid communicator (COMM_NULL or freed)")
        if _rt.engine is None:
            _engine_or_raise()
        return self._ranks

    def _adopt(self):
        """Share the state of the communicator whose handle was written here.

        The handle was written into this null object's memory; False when
        it names no live communicator.
        """
        h = self._handle
        if h == _NULL_HANDLE:
            return False
        orig = _by_handle.get(h)
        if orig is None or orig is self or orig._ranks is None:
            return False
        self._share(orig)
        self._fast = None
        return True

    def _next_seq(self):
        # an itertools.count: atomic under the GIL, and shared with the C
        # fast path (_engine.fast), which counts the calls it runs itself
        return next(self._seqc)

    def _fast_state(self):
        """A new state of this communicator for _engine.fast, or None."""
        eng = _rt.engine
        if eng is None or self._ranks is None or self._revoked:
            return None             # a revoked one: every call through the checks
        return eng.fast_state(self._ctx, self._ranks, self._rank, TAG_UB_VALUE, self._seqc)

    def _transport(self):
        return _CollTransport(self, self._ctx + 1, self._coll_base())

    def _coll_base(self):
        """Tag base of the next collective call (one per call, every rank)."""
        if self._revoked:
            self._check_revoked()
        return (self._next_seq() % _SEQ_MOD) * _COLL_TAGS


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

    def Compare(self, comm):
        """IDENT, CONGRUENT, SIMILAR or UNEQUAL (``Comm.Compare(c1, c2)`` too)."""
        comm1, comm2 = self, comm
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
            a = self._ranks is None and not self._adopt()
            b = other._ranks is None and not other._adopt()
            if a or b:
                return a and b
        return self._handle == other._handle

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # unhashable, as mpi4py's

    def __bool__(self):
        return self._ranks is not None or self._adopt()

    def __repr__(self):
        if not self:
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
        c._attrs = _attributes.copy_all(self, self._attrs)
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

    def Idup_with_info(self, info):
        """Nonblocking duplicate of the communicator; the hints of ``info`` go to the new one."""
        return self.Idup(info)

    def Free(self):
        """Free the communicator; it becomes COMM_NULL."""
        self._check()
        if self._predef:
            raise_error(ERR_COMM, "cannot free a predefined communicator")
        try:
            _attributes.delete_all(self, self._attrs)
        finally:
            if _rt.engine is not None and self._ctx >= 0:
                try:
                    _rt.engine.ctx_group(self._ctx, ())
                except Exception:
                    pass
            self._ranks = None
            self._group = None
            self._rank = UNDEFINED
            self._fast = None
            self._handle = _NULL_HANDLE

    def free(self):
        """Free the communicator if it is not null or predefined."""
        if self and not self._predef:
            self.Free()

    Disconnect = Free

    # -- Names and attributes -----------------------------------------------

    def Get_name(self):
        """The name of the communicator (``MPI_COMM_NULL`` for a null one)."""
        if not self:
            return "MPI_COMM_NULL"    # MPICH names the null handle
        return self._name

    def Set_name(self, name):
        """Give the communicator a name (a string)."""
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
            from .errorcode import last_used_code
            return last_used_code()
        if keyval == APPNUM:
            return int(_rt.info.get("appnum", 0))
        if keyval == UNIVERSE_SIZE:
            from . import config
            if config.get("ERDMA_UNIVERSE_SIZE") is not None:
                return int(_rt.info.get("universe_size", len(self._ranks)))
            return None
        return _attributes.get("Comm", self._attrs, keyval)

    def Set_attr(self, keyval, attrval):
        """Store an attribute value on the communicator under ``keyval``."""
        self._check()
        _attributes.set("Comm", self, self._attrs, keyval, attrval)

    def Delete_attr(self, keyval):
        """Delete the attribute stored under ``keyval`` (its delete function runs)."""
        self._check()
        _attributes.delete("Comm", self, self._attrs, keyval)

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        """Create a new attribute key for communicators (optional copy and delete functions)."""
        return _attributes.create_keyval("Comm", copy_fn, delete_fn, nopython)

    @classmethod
    def Free_keyval(cls, keyval):
        """Free an attribute key for communicators; returns `KEYVAL_INVALID`."""
        return _attributes.free_keyval("Comm", keyval)

    def Get_info(self):
        """A new Info object with the hints in use (``erdma_compress``)."""
        self._check()
        from .MPI import Info
        return Info.Create(self._chints)

    def Set_info(self, info):
        """Take the hints erdmampi knows from ``info``.

        ``erdma_compress``: see :mod:`erdmampi.compression`; other keys are
        ignored, as MPI allows.
        """
        self._check()
        for k, v in _hints_of(info).items():
            if v is None:
                self._chints.pop(k, None)
            else:
                self._chints[k] = v

    info = property(Get_info, Set_info)

    @classmethod
    def Join(cls, fd):
        """Inter-communicator with the rank at the other end of socket ``fd``."""
        from .dpm import join
        return join(fd)

    def Is_inter(self):
        """Whether this is an inter-communicator (False)."""
        self._check()
        return False

    def Is_intra(self):
        """Whether this is an intra-communicator (True)."""
        self._check()
        return True

    @property
    def is_inter(self):
        return self.Is_inter()

    @property
    def is_intra(self):
        return self.Is_intra()

    def Get_topology(self):
        """The type of topology attached (`UNDEFINED`: none)."""
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
        # no process is spawned: a null inter-communicator, as mpi4py returns
        """The parent inter-communicator (no process is spawned: a null one)."""
        return Intercomm()

    def __reduce__(self):
        from ._objmodel import reduce_predefined
        return reduce_predefined(self, [("COMM_NULL", COMM_NULL), ("COMM_SELF", COMM_SELF),
                                        ("COMM_WORLD", COMM_WORLD)])

    def py2f(self):
        """The Fortran integer handle of the communicator."""
        return self._handle if self else _NULL_HANDLE

    toint = py2f

    @property
    def handle(self):
        return self.py2f()

    @classmethod
    def f2py(cls, arg):
        """The communicator of a Fortran integer handle."""
        arg = int(arg)
        for c in (COMM_WORLD, COMM_SELF):
            if c._handle == arg:
                return c
        if arg == _NULL_HANDLE:
            return COMM_NULL
        orig = _by_handle.get(arg)
        if orig is None or orig._ranks is None:
            raise_error(ERR_COMM, f"unknown communicator handle {arg:#x}")
        kind = type(orig) if issubclass(type(orig), cls) else cls
        return kind(orig)

    fromint = f2py
    fromhandle = f2py

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


from .dpm import IntracommDPM  # noqa: E402


# Comm's calls that are one fast call when it hits, as C method descriptors
# (erdma_pyfast.c, "methods"): name -> (fast call; its arguments after the
# state: the method's by index, the constants below by -1 - k; the
# constants; the method that finishes any other answer; a mask of the
# arguments that must be None; the extra argument: 1 the Pickle's wire, 2
# its loads if pickle.loads; 1 if the call answers the method's result).
# The Python method stays as _py_<name>: the C one calls it for keywords
# it does not know (keyword-only ones) and whatever else it does not take.
_C_METHODS = {
    "Send": ("send", (0, 1, 2), (), "_send_more", 0, 0, 0),
    "Recv": ("recv_st", (0, 1, 2, 3), (), "_recv_fast_more", 0, 0, 0),
    "Sendrecv": ("sendrecv_st", (0, 1, 2, 3, 4, 5, 6), (), "_sendrecv_more", 0, 0, 0),
    "Sendrecv_replace": ("sendrecv_replace_st", (0, 1, 2, 3, 4, 5), (), "_sendrecv_replace_more",
                         0, 0, 0),
    "Barrier": ("barrier", (), (), "_barrier_more", 0, 0, 0),
    "Bcast": ("bcast", (0, 1), (), "_bcast_more", 0, 0, 0),
    "Allreduce": ("allreduce", (0, 1, 2), (), "_allreduce_more", 0, 0, 0),
    "Reduce_scatter_block": ("reduce_scatter", (0, 1, 2), (), "_reduce_scatter_more", 0, 0, 0),
    "Alltoall": ("alltoall", (0, 1), (), "_alltoall_more", 0, 0, 0),
    "Allgather": ("allgather", (0, 1), (), "_allgather_more", 0, 0, 0),
    "Reduce": ("rooted", (-1, 0, 1, 3, 2), (2,), "_reduce_more", 0, 0, 0),
    "Gather": ("rooted", (-1, 0, 1, 2, -2), (0, None), "_gather_more", 0, 0, 0),
    "Scatter": ("rooted", (-1, 0, 1, 2, -2), (1, None), "_scatter_more", 0, 0, 0),
    "send": ("send_obj", (0, 1, 2), (), "_send_obj_more", 0, 1, 0),
    "recv": ("recv_obj", (1, 2), (), "_recv_obj_more", 0b1001, 2, 1),
    "Isend": ("isend", (0, 1, 2), (), "_isend_more", 0, 0, 2),
    "Irecv": ("irecv", (0, 1, 2), (), "_irecv_more", 0, 4, 2),
    "sendrecv": ("sendrecv_obj", (0, 1, 2, 4, 5), (), "_sendrecv_obj_more", 0b1001000, 3, 1),
}


def c_methods():
    """Put the C methods of _C_METHODS on Comm, with the docstrings of the
    Python ones (MPI signs those first); without the C module, nothing."""
    fast = _engine.fast
    if fast is None or not hasattr(fast, "method") or "_py_Send" in vars(Comm):
        return
    try:
        fast.setup(HandleBase, _membuf.FAST_OFFSET, _engine._deferred, _engine._reap_deferred,
                   _pickle.loads, Request, Status)
    except ValueError:      # done by an earlier import of this module (reloaded)
        return
    _msgpickle._pickle_changed = fast.pickle_changed
    for slot, (name, spec) in enumerate(_C_METHODS.items()):
        call, order, consts, more, none_mask, extra, result = spec
        py = getattr(Comm, name)
        dflt = py.__defaults__ or ()
        nmax = py.__code__.co_argcount - 1
        setattr(Comm, "_py_" + name, py)
        setattr(Comm, name, fast.method(
            Comm, slot, call, nmax - len(dflt), nmax, none_mask, dflt + consts, order,
            more, "_py_" + name, name, py.__doc__, extra, result,
            py.__code__.co_varnames[1:nmax + 1]))


class Intracomm(IntracommInter, IntracommTopo, IntracommDPM, Comm):
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
        if split_type == COMM_TYPE_HW_UNGUIDED:
            return COMM_NULL    # no finer hardware level than the host is known
        if split_type == COMM_TYPE_HW_GUIDED:
            # only the shared-memory level is known (MPICH: COMM_NULL otherwise)
            restype = info.Get("mpi_hw_resource_type") if info else None  # INFO_NULL: none
            if restype != "mpi_shared_memory":
                return COMM_NULL
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

    @classmethod
    def Create_from_group(cls, group, stringtag="org.mpi4py", info=None, errhandler=None):
        """Communicator for ``group``, collective over its members only (MPI-4)."""
        tag = zlib.crc32(str(stringtag).encode()) % 65536
        return COMM_WORLD.Create_group(group, tag)

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
        """Inclusive prefix reduction: rank i receives the reduction over ranks 0..i."""
        self._c_scan(sendbuf, recvbuf, _op_arg(op), False)()

    def Exscan(self, sendbuf, recvbuf, op=_SUM):
        """Exclusive prefix reduction: rank i receives the reduction over ranks 0..i-1."""
        self._c_scan(sendbuf, recvbuf, _op_arg(op), True)()

    def Iscan(self, sendbuf, recvbuf, op=_SUM):
        """Nonblocking inclusive prefix reduction; returns a `Request`."""
        return _icoll(self._c_scan(sendbuf, recvbuf, _op_arg(op), False))

    def Iexscan(self, sendbuf, recvbuf, op=_SUM):
        """Nonblocking exclusive prefix reduction; returns a `Request`."""
        return _icoll(self._c_scan(sendbuf, recvbuf, _op_arg(op), True))

    def Scan_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        """Persistent inclusive prefix reduction; returns a `Prequest`."""
        return self._coll_init("Iscan", sendbuf, recvbuf, _op_arg(op))

    def Exscan_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        """Persistent exclusive prefix reduction; returns a `Prequest`."""
        return self._coll_init("Iexscan", sendbuf, recvbuf, _op_arg(op))

    def scan(self, sendobj, op=None):
        """Inclusive prefix reduction of Python objects (default op: sum)."""
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.scan_obj(t, sendobj, fn, d, l)

    def exscan(self, sendobj, op=None):
        """Exclusive prefix reduction of Python objects (None on rank 0)."""
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.exscan_obj(t, sendobj, fn, d, l)


from .exceptions import ERR_GROUP as ERR_GROUP_  # noqa: E402


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

# the communicator classes built on Intracomm, in modules of their own
from .topo import Cartcomm, Distgraphcomm, Graphcomm, Topocomm  # noqa: E402,F401
from .intercomm import Intercomm  # noqa: E402,F401
