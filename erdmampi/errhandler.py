"""Error handlers (``MPI.Errhandler``) and the per-object errhandler calls.

As in mpi4py, an ``Errhandler`` Python object refers to a handle: objects
compare by handle, ``Free()`` drops this reference and makes the object
``ERRHANDLER_NULL``.  User error handlers (``Comm.Create_errhandler(fn)``
and the Win/File/Session equivalents) are reference counted: each
``Get_errhandler`` result and each object the handler is set on holds one
reference.  mpi4py keeps at most 32 live user handlers per object class and
raises RuntimeError beyond that; so does erdmampi.

erdmampi reports errors by raising :class:`MPI.Exception` whatever handler is
set (mpi4py's behaviour under ERRORS_RETURN, its default); the handler set on
an object is what ``Get_errhandler`` returns and what ``Call_errhandler``
invokes.
"""

import itertools
import threading

from . import exceptions as _exc
from ._objmodel import IntHandle

__all__ = ["Errhandler", "ERRHANDLER_NULL", "ERRORS_RETURN", "ERRORS_ARE_FATAL",
           "ERRORS_ABORT", "HasErrhandler"]

# MPICH's handle values
_NULL = 0x14000000
_FATAL = 0x54000000
_RETURN = 0x54000001
_ABORT = 0x54000003
_PREDEFINED = {_NULL: "ERRHANDLER_NULL", _FATAL: "ERRORS_ARE_FATAL",
               _RETURN: "ERRORS_RETURN", _ABORT: "ERRORS_ABORT"}
MAX_USER = 32

_lock = threading.Lock()
_handles = itertools.count(0x94000000)
_user = {}          # handle -> [kind, fn, refs]


class Errhandler(IntHandle):
    """Error handler."""

    __slots__ = ("__weakref__",)

    def __init__(self, errhandler=None):
        if errhandler is None:
            self._h = _NULL
        elif isinstance(errhandler, Errhandler):
            self._h = errhandler._h
        else:
            raise TypeError(f"expected Errhandler, got {type(errhandler).__name__}")

    def __eq__(self, other):
        if not isinstance(other, Errhandler):
            return NotImplemented
        return self._h == other._h

    def __ne__(self, other):
        if not isinstance(other, Errhandler):
            return NotImplemented
        return self._h != other._h

    __hash__ = None

    def __bool__(self):
        return self._h != _NULL

    def __repr__(self):
        name = _PREDEFINED.get(self._h)
        return f"<Errhandler {name}>" if name else f"<Errhandler {self._h:#x}>"

    def __reduce__(self):
        name = _PREDEFINED.get(self._h)
        if name is not None and not any(self is c for c in _CONSTANTS):
            return (type(self), (getattr(_this_module(), name),))
        if name is None:
            raise ValueError(f"cannot serialize '{type(self).__module__}."
                             f"{type(self).__name__}' instance")
        return name

    @staticmethod
    def _predefined_objects():
        return (ERRHANDLER_NULL, ERRORS_ARE_FATAL, ERRORS_RETURN, ERRORS_ABORT)

    def Free(self):
        """Drop this reference (MPI_Errhandler_free)."""
        if self._h == _NULL:
            _exc.raise_error(_exc.ERR_ARG, "invalid error handler")
        if any(self is c for c in _CONSTANTS):
            _exc.raise_error(_exc.ERR_ARG, "cannot free a predefined error handler")
        _unref(self._h)
        self._h = _NULL

    def free(self):
        """Free the error handler if it is not null and not a predefined constant."""
        if self._h != _NULL and not any(self is c for c in _CONSTANTS):
            self.Free()


def _this_module():
    import sys
    return sys.modules[__name__]


def _ref(h):
    with _lock:
        entry = _user.get(h)
        if entry is not None:
            entry[2] += 1


def _unref(h):
    with _lock:
        entry = _user.get(h)
        if entry is not None:
            entry[2] -= 1
            if entry[2] <= 0:
                del _user[h]


def _new_ref(h):
    """A new Errhandler object holding a reference to handle ``h``."""
    _ref(h)
    eh = object.__new__(Errhandler)
    eh._h = h
    return eh


def create(kind, fn):
    """A user error handler for objects of ``kind`` ("Comm", "Win", ...)."""
    if not callable(fn):
        raise TypeError("expected a callable error handler function")
    with _lock:
        if sum(1 for e in _user.values() if e[0] == kind) >= MAX_USER:
            raise RuntimeError(f"cannot create too many user-level error handlers "
                               f"(max {MAX_USER})")
        h = next(_handles)
        _user[h] = [kind, fn, 1]
    eh = object.__new__(Errhandler)
    eh._h = h
    return eh


class HasErrhandler:
    """Errhandler calls of an MPI object kept in ``self._errh`` (a handle)."""

    _errh_kind = "Comm"

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        return create(cls._errh_kind, errhandler_fn)

    def _errh_handle(self):
        return getattr(self, "_errh", _RETURN)

    def Get_errhandler(self):
        self._check()
        return _new_ref(self._errh_handle())

    def Set_errhandler(self, errhandler):
        self._check()
        if not isinstance(errhandler, Errhandler):
            raise TypeError(f"expected Errhandler, got {type(errhandler).__name__}")
        h = errhandler._h
        if h == _NULL or (h not in _PREDEFINED and h not in _user):
            _exc.raise_error(_exc.ERR_ARG, "invalid error handler")
        entry = _user.get(h)
        if entry is not None and entry[0] != self._errh_kind:
            _exc.raise_error(_exc.ERR_ARG, "error handler of another object kind")
        _ref(h)
        old = self._errh_handle()
        self._errh = h
        _unref(old)

    def Call_errhandler(self, errorcode):
        self._check()
        errorcode = int(errorcode)
        h = self._errh_handle()
        entry = _user.get(h)
        if entry is not None:
            if errorcode != _exc.SUCCESS:
                entry[1](self, errorcode)
        elif h in (_FATAL, _ABORT) and errorcode != _exc.SUCCESS:
            raise _exc.Exception(errorcode)


def _predefined(h):
    eh = object.__new__(Errhandler)
    eh._h = h
    return eh


ERRHANDLER_NULL = _predefined(_NULL)
ERRORS_ARE_FATAL = _predefined(_FATAL)
ERRORS_RETURN = _predefined(_RETURN)
ERRORS_ABORT = _predefined(_ABORT)
_CONSTANTS = (ERRHANDLER_NULL, ERRORS_ARE_FATAL, ERRORS_RETURN, ERRORS_ABORT)
Errhandler.__module__ = "erdmampi.MPI"
