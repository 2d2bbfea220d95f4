"""Reduction operations: ``MPI.Op`` and its vectorised kernels.

Two forms, as in mpi4py:

* ``op(x, y)`` / ``op._py(x, y)``: the Python-object form used by the
  lowercase ``reduce``/``allreduce``/``scan`` (same rules as mpi4py's
  ``Op.__call__``; MAXLOC/MINLOC take ``(value, index)`` pairs).
* ``op._apply(inarr, inoutarr, datatype)``: ``inoutarr[:] = inarr OP inoutarr``
  in place over NumPy arrays with ufuncs (no element loop), the MPI argument
  order, so results come out in rank order for non-commutative user ops.

Which predefined op is valid for which datatype follows MPICH (checked
against ``tests/data/mpi4py_reference.json``); invalid pairs raise
``MPI.Exception(ERR_OP)``.
"""

import itertools
import threading
import weakref

import numpy as np

from . import bf16 as _bf16

from . import exceptions as _exc
from ._membuf import buffer as _buffer
from ._objmodel import HandleBase
from .datatype import DATATYPE_NULL, PREDEFINED, Datatype

__all__ = [
    "Op", "OP_NULL", "MAX", "MIN", "SUM", "PROD", "LAND", "BAND", "LOR",
    "BOR", "LXOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP",
    "PREDEFINED_OPS",
]

_OP_NULL_HANDLE = 0x18000000
_handles = itertools.count(0x98000000)
_lock = threading.Lock()


def _op_error(msg=None):
    return _exc.Exception(_exc.ERR_OP, msg)


# -----------------------------------------------------------------------------
# Datatype classes (MPI-4.0 section 6.9.2, as MPICH accepts them)

def _classify():
    cls = {}
    names = {
        "int": "CHAR CHARACTER SIGNED_CHAR UNSIGNED_CHAR SHORT UNSIGNED_SHORT "
               "INT UNSIGNED LONG UNSIGNED_LONG LONG_LONG UNSIGNED_LONG_LONG "
               "INT8_T INT16_T INT32_T INT64_T UINT8_T UINT16_T UINT32_T "
               "UINT64_T AINT OFFSET COUNT INTEGER INTEGER1 INTEGER2 INTEGER4 "
               "INTEGER8",
        "float": "FLOAT DOUBLE LONG_DOUBLE FLOAT16_T REAL DOUBLE_PRECISION "
                 "REAL4 REAL8 REAL16",
        "complex": "C_COMPLEX C_DOUBLE_COMPLEX C_LONG_DOUBLE_COMPLEX "
                   "CXX_FLOAT_COMPLEX CXX_DOUBLE_COMPLEX CXX_LONG_DOUBLE_COMPLEX "
                   "COMPLEX DOUBLE_COMPLEX COMPLEX8 COMPLEX16",
        # MPICH 4.0 defines no reduction on COMPLEX32 (ERR_OP)
        "none": "COMPLEX32",
        "logical": "C_BOOL CXX_BOOL LOGICAL",
        "byte": "BYTE",
        "pair": "SHORT_INT INT_INT LONG_INT FLOAT_INT DOUBLE_INT LONG_DOUBLE_INT",
    }
    for kind, text in names.items():
        for name in text.split():
            cls[PREDEFINED[name].handle] = kind
    return cls


_KIND = _classify()

_VALID = {
    "MAX": {"int", "float", "bf16"},
    "MIN": {"int", "float", "bf16"},
    "SUM": {"int", "float", "complex", "bf16"},
    "PROD": {"int", "float", "complex", "bf16"},
    "LAND": {"int", "float", "logical"},
    "LOR": {"int", "float", "logical"},
    "LXOR": {"int", "float", "logical"},
    "BAND": {"int", "byte"},
    "BOR": {"int", "byte"},
    "BXOR": {"int", "byte"},
    "MAXLOC": {"pair"},
    "MINLOC": {"pair"},
}


def _kind_of(datatype):
    if not isinstance(datatype, Datatype):
        raise TypeError(f"expecting Datatype, got {type(datatype).__name__}")
    if datatype == DATATYPE_NULL:
        raise _exc.Exception(_exc.ERR_TYPE, "null datatype")
    if datatype._base._reduce_dtype is _bf16.DTYPE:
        return "bf16"
    return _KIND.get(datatype._base.handle)


# -----------------------------------------------------------------------------
# Python-object forms (mpi4py's opimpl.pxi rules)

def _py_max(x, y):
    return y if y > x else x


def _py_min(x, y):
    return y if y < x else x


def _py_maxloc(x, y):
    u, i = x
    v, j = y
    if u > v:
        return u, i
    if v > u:
        return v, j
    if j < i:
        return v, j
    return u, i


def _py_minloc(x, y):
    u, i = x
    v, j = y
    if u < v:
        return u, i
    if v < u:
        return v, j
    if j < i:
        return v, j
    return u, i


_PY = {
    "MAX": _py_max,
    "MIN": _py_min,
    "SUM": lambda x, y: x + y,
    "PROD": lambda x, y: x * y,
    "BAND": lambda x, y: x & y,
    "BOR": lambda x, y: x | y,
    "BXOR": lambda x, y: x ^ y,
    "LAND": lambda x, y: bool(x) & bool(y),
    "LOR": lambda x, y: bool(x) | bool(y),
    "LXOR": lambda x, y: bool(x) ^ bool(y),
    "MAXLOC": _py_maxloc,
    "MINLOC": _py_minloc,
    "REPLACE": lambda x, y: y,
    "NO_OP": lambda x, y: x,
}


# -----------------------------------------------------------------------------
# Array kernels: io[:] = a OP io

def _k_max(a, io):
    # MPICH: io = (io > a) ? io : a  (NaN in ``a`` wins, as in MPICH)
    np.copyto(io, a, where=~(io > a))


def _k_min(a, io):
    np.copyto(io, a, where=~(io < a))


def _k_logical(ufunc):
    def kernel(a, io):
        io[...] = ufunc(a != 0, io != 0)
    return kernel


def _k_loc(greater):
    def kernel(a, io):
        va, ia = a["value"], a["index"]
        vb, ib = io["value"], io["index"]
        better = greater(va, vb)
        take = better | ((va == vb) & (ia < ib))
        np.copyto(vb, va, where=take)
        np.copyto(ib, ia, where=take)
    return kernel


def _k_replace(a, io):
    io[...] = a


def _k_no_op(a, io):
    pass


_KERNEL = {
    "MAX": _k_max,
    "MIN": _k_min,
    "SUM": lambda a, io: np.add(a, io, out=io),
    "PROD": lambda a, io: np.multiply(a, io, out=io),
    "LAND": _k_logical(np.logical_and),
    "LOR": _k_logical(np.logical_or),
    "LXOR": _k_logical(np.logical_xor),
    "BAND": lambda a, io: np.bitwise_and(a, io, out=io),
    "BOR": lambda a, io: np.bitwise_or(a, io, out=io),
    "BXOR": lambda a, io: np.bitwise_xor(a, io, out=io),
    "MAXLOC": _k_loc(np.greater),
    "MINLOC": _k_loc(np.less),
    "REPLACE": _k_replace,
    "NO_OP": _k_no_op,
}


def _as_typed(arr, dtype):
    """View ``arr`` (any dtype, contiguous) as a 1-D array of ``dtype``."""
    arr = np.asarray(arr)
    if arr.dtype == dtype and arr.ndim == 1:
        return arr
    if arr.dtype == dtype:
        return arr.reshape(-1)
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise ValueError("reduction buffers must be contiguous")
    return arr.reshape(-1, order="A").view(np.uint8).view(dtype)


# -----------------------------------------------------------------------------

# mpi4py keeps at most 32 user-defined operations alive (RuntimeError beyond)
MAX_USER_OP = 32
_user_ops = {}      # handle -> weakref to an Op holding it


class Op(HandleBase):
    """Reduction operation (``MPI.Op``).

    ``_handle`` is the MPI handle (in C memory: ``HandleBase``); the other
    slots describe the operation it designates.  A null object has
    ``OP_NULL``'s (``_name == "OP_NULL"``); one whose memory then received
    a live handle (``MPI._addressof``) takes that operation's state where an
    operation is checked before use (``_adopt``: ``_check``, ``_py``, the
    methods), so reads of live operations stay plain slot reads.
    """

    # _uid: the user function's registration; 0 for an op rebuilt from a
    # handle, which (as in mpi4py) cannot be pickled
    __slots__ = ("_name", "_fn", "_commute", "_predefined", "_uid", "__weakref__")
    _STATE = __slots__[:-1]
    _handle = HandleBase._h

    def __init__(self, op=None):
        src = OP_NULL if op is None else op
        if not isinstance(src, Op):
            raise TypeError(f"expecting Op, got {type(op).__name__}")
        self._handle = src._handle
        for slot in Op._STATE:
            object.__setattr__(self, slot, getattr(src, slot))

    def _adopt(self):
        """Take the state of the operation named by a handle written here.

        The handle was written into this null object's memory; False when
        the object holds OP_NULL or already has its state.
        """
        h = self._handle
        if h == _OP_NULL_HANDLE or self._name != "OP_NULL":
            return False
        src = _PREDEFINED_BY_HANDLE.get(h)
        if src is None:
            with _lock:
                live = _user_ops.get(h)
            src = live() if live is not None else None
            if src is None:
                raise _op_error(f"unknown operation handle {h:#x}")
        for slot in Op._STATE:
            object.__setattr__(self, slot, getattr(src, slot))
        return True

    def _set_null(self):
        self._handle = _OP_NULL_HANDLE
        for slot in Op._STATE:
            object.__setattr__(self, slot, getattr(OP_NULL, slot))

    @classmethod
    def _make(cls, handle, name, fn, commute, predefined):
        self = object.__new__(cls)
        self._handle = handle
        self._name = name
        self._fn = fn
        self._commute = commute
        self._predefined = predefined
        self._uid = handle
        return self

    def __eq__(self, other):
        if not isinstance(other, Op):
            return NotImplemented
        return self._handle == other._handle

    def __ne__(self, other):
        if not isinstance(other, Op):
            return NotImplemented
        return self._handle != other._handle

    __hash__ = None  # unhashable, like mpi4py's Op

    def __bool__(self):
        return self._handle != _OP_NULL_HANDLE

    def __reduce__(self):
        self._adopt()
        if self._predefined or self._handle == _OP_NULL_HANDLE:
            const = PREDEFINED_OPS.get(self._name or "OP_NULL")
            if self is const:
                return self._name or "OP_NULL"
            return (type(self), (const,))
        if not self._uid or self._fn is None:
            raise ValueError("cannot pickle user-defined reduction operation")
        return (type(self).Create, (self._fn, self._commute))

    def __repr__(self):
        self._adopt()
        name = self._name if self._predefined else "user-defined"
        return f"<erdmampi.MPI.Op {name}>"

    def __call__(self, x, y):
        return self._py(x, y)

    @property
    def handle(self):
        """MPI handle."""
        return self._handle

    def tohandle(self):
        """Return MPI handle."""
        return self._handle

    @classmethod
    def fromhandle(cls, handle):
        """The Op of a handle (a predefined object, or a user op still alive)."""
        handle = int(handle)
        for op in PREDEFINED_OPS.values():
            if op._handle == handle:
                return op
        with _lock:
            live = _user_ops.get(handle)
        src = live() if live is not None else None
        op = cls._make(handle, "", src and src._fn, bool(src and src._commute), False)
        op._uid = 0
        return op

    def toint(self):
        """The integer handle of the operation."""
        return self._handle

    @classmethod
    def fromint(cls, arg):
        """The operation of an integer handle."""
        return cls.fromhandle(arg)

    def py2f(self):
        """The Fortran integer handle of the operation."""
        return self._handle

    @classmethod
    def f2py(cls, arg):
        """The operation of a Fortran integer handle."""
        return cls.fromhandle(arg)

    # -- user-defined operations ---------------------------------------

    @classmethod
    def Create(cls, function, commute=False):
        """Create a user-defined reduction operation.

        ``function(inbuf, inoutbuf, datatype)`` must store
        ``inbuf OP inoutbuf`` into ``inoutbuf``; the buffers are writable
        byte ``MPI.buffer`` objects, as mpi4py passes them.
        """
        function.__call__  # noqa: B018 - raises AttributeError like mpi4py
        with _lock:
            if len(_user_ops) >= MAX_USER_OP:
                raise RuntimeError(f"cannot create too many user-defined reduction "
                                   f"operations (max {MAX_USER_OP})")
            handle = next(_handles)
            op = cls._make(handle, "", function, bool(commute), False)
            _user_ops[handle] = weakref.ref(op)
        return op

    def Free(self):
        """Free a user-defined reduction operation."""
        if self._handle == _OP_NULL_HANDLE:
            raise _op_error("Null MPI_Op")
        self._adopt()
        if self._predefined:
            raise _op_error("Cannot free permanent MPI_Op")
        with _lock:
            _user_ops.pop(self._handle, None)
        self._set_null()

    def free(self):
        """Free the operation if it is not null.

        An object naming a predefined op (not the constant itself) just
        becomes null, as in mpi4py.
        """
        if self._handle == _OP_NULL_HANDLE:
            return
        self._adopt()
        if self._predefined:
            if PREDEFINED_OPS.get(self._name) is not self:
                self._set_null()
            return
        self.Free()

    def Is_commutative(self):
        """Query reduction operations for their commutativity."""
        if self._handle == _OP_NULL_HANDLE:
            raise _op_error("Null MPI_Op")
        self._adopt()
        return self._commute

    @property
    def is_commutative(self):
        """Is a commutative operation."""
        return self.Is_commutative()

    @property
    def is_predefined(self):
        """Is a predefined operation."""
        self._adopt()
        return self._predefined or self._handle == _OP_NULL_HANDLE

    def Reduce_local(self, inbuf, inoutbuf):
        """Apply a reduction operation to local data (buffer specs)."""
        from . import buffers

        rmsg = buffers.message_p2p(inoutbuf, readonly=False)
        smsg = buffers.message_p2p(inbuf, readonly=True)
        if smsg.datatype != rmsg.datatype:
            raise buffers.type_mismatch(smsg, rmsg)
        if smsg.count != rmsg.count:
            raise ValueError(
                f"mismatch in send count {smsg.count} "
                f"and receive count {rmsg.count}")
        self._adopt()
        if self._name in ("REPLACE", "NO_OP") or self._handle == _OP_NULL_HANDLE:
            raise _op_error("operation not valid for local reductions")
        if rmsg.count == 0:
            return
        self._apply(smsg.array, rmsg.array, rmsg.datatype)
        rmsg.finish()

    # -- internal API ------------------------------------------------------

    def _py(self, x, y):
        """Python-object form: ``x OP y`` (mpi4py's ``Op.__call__``)."""
        if self._predefined and self._handle != _OP_NULL_HANDLE:
            fn = _PY.get(self._name)
            if fn is None and self._adopt():
                return self._py(x, y)
            return fn(x, y)
        if self._fn is not None:
            return self._fn(x, y, None)
        raise ValueError("cannot call user-defined operation")

    def _check(self, datatype):
        """Raise ERR_OP/ERR_TYPE unless this op can reduce ``datatype``."""
        if self._handle == _OP_NULL_HANDLE:
            raise _op_error("Null MPI_Op")
        kind = _kind_of(datatype)
        if not self._predefined or self._name in ("REPLACE", "NO_OP"):
            return
        valid = _VALID.get(self._name)
        if valid is None and self._adopt():
            return self._check(datatype)
        if kind not in valid:
            raise _op_error(
                f"{self._name} is not defined for {datatype.Get_name() or 'datatype'}")

    def _apply(self, inarr, inoutarr, datatype):
        """Compute ``inoutarr[:] = inarr OP inoutarr`` in place (MPI argument order).

        Arrays are contiguous; any dtype is reinterpreted as the element type
        of ``datatype``.  Returns ``inoutarr``.
        """
        self._check(datatype)
        if not self._predefined:
            self._apply_user(inarr, inoutarr, datatype)
            return inoutarr
        rdt = datatype._base._reduce_dtype
        if rdt is _bf16.DTYPE and _bf16.reduce(self._name, inarr, inoutarr):
            return inoutarr
        if rdt is None:
            rdt = datatype.np_dtype
        if rdt is None:
            if self._name in ("REPLACE", "NO_OP"):
                rdt = np.dtype(np.uint8)
            else:
                raise _op_error(f"{self._name} is not defined for this datatype")
        a = _as_typed(inarr, rdt)
        io = _as_typed(inoutarr, rdt)
        if a.shape != io.shape:
            raise ValueError(
                f"mismatch in reduction lengths {a.size} and {io.size}")
        if not io.flags.writeable:
            raise BufferError("reduction output buffer is not writable")
        with np.errstate(all="ignore"):  # overflow/NaN follow C semantics
            _KERNEL[self._name](a, io)
        return inoutarr

    def _apply_user(self, inarr, inoutarr, datatype):
        a = np.ascontiguousarray(inarr)
        io = np.asarray(inoutarr)
        work = io if io.flags.c_contiguous else np.ascontiguousarray(io)
        if a.nbytes != work.nbytes:
            raise ValueError(
                f"mismatch in reduction lengths {a.nbytes} and {work.nbytes} bytes")
        # MPI.buffer objects over the raw bytes, as mpi4py passes them (so
        # `b[:] = array(...)` copies bytes whatever the item format)
        abuf = _buffer.fromaddress(a.ctypes.data, a.nbytes)
        bbuf = _buffer.fromaddress(work.ctypes.data, work.nbytes)
        self._fn(abuf, bbuf, datatype)
        if work is not io:
            io[...] = work


def _define():
    table = {}
    table["OP_NULL"] = Op._make(_OP_NULL_HANDLE, "OP_NULL", None, False, True)
    for i, name in enumerate(
        ["MAX", "MIN", "SUM", "PROD", "LAND", "BAND", "LOR", "BOR", "LXOR",
         "BXOR", "MINLOC", "MAXLOC", "REPLACE", "NO_OP"]
    ):
        commute = name not in ("REPLACE", "NO_OP")
        table[name] = Op._make(0x58000001 + i, name, None, commute, True)
    return table


#: predefined operations by MPI name (for the facade)
Op.__module__ = "erdmampi.MPI"
PREDEFINED_OPS = _define()
_PREDEFINED_BY_HANDLE = {op._handle: op for op in PREDEFINED_OPS.values()}
globals().update(PREDEFINED_OPS)
