"""Handle objects as mpi4py models them (Win, File, Session).

An object holds only its integer handle ``_h`` (in C memory, see
``_objmodel.HandleBase``); the state behind a live handle
sits in the class's registry, so every copy (``Win(win)``, ``fromhandle``)
sees the same state and a freed handle is stale in all of them.  Null objects
compare equal to each other, are false, unhashable and unorderable; the
predefined null object pickles by name, other objects cannot be pickled.
"""

import copyreg

from ._objmodel import HandleBase
from .exceptions import raise_error


class HandleObject(HandleBase):
    """Base of one handle kind; subclasses set ``_NULL``, ``_ERR``, ``_NULL_NAME``."""

    _NULL = 0
    _ERR = 0
    _NULL_NAME = ""
    _registry = None            # handle -> state, one dict per kind
    _next = 0

    def __new__(cls, obj=None):
        kind = cls._kind()
        self = object.__new__(cls)
        if obj is None:
            self._h = kind._NULL
        elif isinstance(obj, kind):
            self._h = obj._h
        else:
            raise TypeError(f"expected {kind.__name__} or None, got {type(obj).__name__}")
        return self

    def __init__(self, obj=None):
        pass

    @classmethod
    def _kind(cls):
        for k in cls.__mro__:
            if HandleObject in k.__bases__:
                return k
        return cls

    @classmethod
    def _register(cls, state):
        kind = cls._kind()
        kind._next += 1
        h = kind._FIRST + kind._next
        kind._registry[h] = state
        obj = object.__new__(cls)
        obj._h = h
        return obj

    def _state(self):
        """The live state, or raise the kind's error class (null or freed)."""
        st = self._kind()._registry.get(self._h)
        if st is None:
            raise_error(self._ERR, f"invalid {self._kind().__name__.lower()} handle")
        return st

    @property
    def _errh(self):
        """Errhandler handle (HasErrhandler): kept in the shared state."""
        from .errhandler import _RETURN
        st = self._kind()._registry.get(self._h)
        if st is None:
            return getattr(self._kind(), "_null_errh", _RETURN)
        return getattr(st, "errh", _RETURN)

    @_errh.setter
    def _errh(self, h):
        st = self._kind()._registry.get(self._h)
        if st is None:
            self._kind()._null_errh = h
        else:
            st.errh = h

    def _release(self):
        self._kind()._registry.pop(self._h, None)
        self._h = self._NULL

    def __eq__(self, other):
        if not isinstance(other, self._kind()):
            return NotImplemented
        return self._h == other._h

    def __ne__(self, other):
        if not isinstance(other, self._kind()):
            return NotImplemented
        return self._h != other._h

    def _unorderable(self, other):
        raise TypeError(f"unorderable type '{type(self).__module__}.{type(self).__name__}'")

    __lt__ = __le__ = __gt__ = __ge__ = _unorderable
    __hash__ = None

    def __bool__(self):
        return self._h != self._NULL

    def __reduce__(self):
        kind = self._kind()
        null = kind._null_object
        if self is null:
            return kind._NULL_NAME
        if self._h == kind._NULL:
            return (copyreg.__newobj__, (type(self), null))
        raise ValueError(f"cannot serialize '{type(self).__module__}."
                         f"{type(self).__name__}' instance")

    @property
    def handle(self):
        return self._h

    @classmethod
    def fromhandle(cls, handle):
        obj = object.__new__(cls._kind())
        obj._h = int(handle) & 0xffffffffffffffff   # a C int handle, sign-extended
        return obj

    def py2f(self):
        """The handle as a C/Fortran int (MPICH: its low 32 bits, signed)."""
        h = self._h & 0xffffffff
        return h - (1 << 32) if h >> 31 else h

    toint = py2f

    @classmethod
    def f2py(cls, arg):
        arg = int(arg)
        return cls.fromhandle(arg & 0xffffffffffffffff if arg < 0 else arg)

    fromint = f2py
