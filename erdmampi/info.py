"""Info objects (``MPI.Info``): string key/value hints; erdmampi reads none.

An ``Info`` Python object refers to a handle, as in mpi4py: ``Info(other)``
shares the handle, ``Free()`` releases it and makes this object
``INFO_NULL``, and objects compare by handle.  ``INFO_ENV`` describes how
the process was started (MPI 4.0 section 11.2.3).
"""

import itertools
import os
import sys
import threading

from . import exceptions as _exc
from ._objmodel import IntHandle

__all__ = ["Info", "INFO_NULL", "INFO_ENV"]

_NULL_HANDLE = 0x1C000000       # MPICH's MPI_INFO_NULL
_ENV_HANDLE = 0x5C000001        # MPICH's MPI_INFO_ENV
_handles = itertools.count(0x9C000000)
_tables = {}                    # handle -> dict (insertion-ordered keys)
_lock = threading.Lock()

MAX_INFO_KEY = 255
MAX_INFO_VAL = 1024


def _new(cls, table):
    with _lock:
        h = next(_handles)
        _tables[h] = table
    info = object.__new__(cls)
    info._h = h
    return info


def _key(key):
    if not isinstance(key, str):
        raise TypeError(f"expected str, got {type(key).__name__}")
    if not key or len(key) > MAX_INFO_KEY:
        _exc.raise_error(_exc.ERR_INFO_KEY, "invalid info key")
    return key


def _value(value):
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    if len(value) > MAX_INFO_VAL:
        _exc.raise_error(_exc.ERR_INFO_VALUE, "info value too long")
    return value


class Info(IntHandle):
    """Info object."""

    __slots__ = ("__weakref__",)

    def __new__(cls, *args, **kwargs):
        # subclasses may override __new__ and pass the object to copy, as
        # with mpi4py's types; __init__ takes it
        return super().__new__(cls)

    def __init__(self, info=None):
        if info is None:
            self._h = _NULL_HANDLE
        elif isinstance(info, Info):
            self._h = info._h
        else:
            raise TypeError(f"expected Info, got {type(info).__name__}")

    # -- handle model --------------------------------------------------------

    def _table(self):
        table = _tables.get(self._h)
        if table is None:
            _exc.raise_error(_exc.ERR_INFO, "invalid info object")
        return table

    def __bool__(self):
        return self._h != _NULL_HANDLE

    def __eq__(self, other):
        if not isinstance(other, Info):
            return NotImplemented
        return self._h == other._h

    def __ne__(self, other):
        if not isinstance(other, Info):
            return NotImplemented
        return self._h != other._h

    __hash__ = None

    def __reduce__(self):
        if self is INFO_NULL:
            return "INFO_NULL"
        if self is INFO_ENV:
            return "INFO_ENV"
        if self._h == _NULL_HANDLE:
            return (type(self), ())
        if self._h == _ENV_HANDLE:
            return (type(self), (INFO_ENV,))
        return (type(self).Create, (self.items(),))

    @staticmethod
    def _predefined_objects():
        return (INFO_NULL, INFO_ENV)

    def free(self):
        """Free the info object if it is not null.

        An object naming INFO_ENV (not the constant itself) just becomes
        null, as in mpi4py.
        """
        if not self or self is INFO_ENV:
            return
        if self._h == _ENV_HANDLE:
            self._h = _NULL_HANDLE
            return
        self.Free()

    # -- MPI calls -----------------------------------------------------------

    @classmethod
    def Create(cls, items=None):
        """A new info object, with ``items`` (mapping or key/value pairs)."""
        if items is not None:
            if hasattr(items, "keys"):
                pairs = [(k, items[k]) for k in items.keys()]
            else:
                try:
                    pairs = list(items)
                except TypeError:
                    raise TypeError(f"expected mapping or sequence of pairs, got "
                                    f"{type(items).__name__}") from None
        else:
            pairs = []
        info = _new(cls, {})
        try:
            for k, v in pairs:
                info.Set(k, v)
        except BaseException:
            info.Free()
            raise
        return info

    @classmethod
    def Create_env(cls, args=None):
        """An info object describing the start of this process (as INFO_ENV)."""
        info = _new(cls, dict(_env_items(args)))
        return info

    def Free(self):
        """Free the info object (a predefined one cannot be freed)."""
        if self._h in (_NULL_HANDLE, _ENV_HANDLE) and (self is INFO_NULL or
                                                       self is INFO_ENV or
                                                       self._h == _NULL_HANDLE):
            _exc.raise_error(_exc.ERR_INFO, "cannot free a predefined info object")
        self._table()
        with _lock:
            _tables.pop(self._h, None)
        self._h = _NULL_HANDLE

    def Dup(self):
        """A new info object with the same key/value pairs."""
        return _new(type(self), dict(self._table()))

    def Get(self, key):
        """The value stored under ``key`` (None if not set)."""
        value = self._table().get(_key(key))
        return value

    def Set(self, key, value):
        """Store ``value`` under ``key`` (both strings)."""
        self._table()[_key(key)] = _value(value)

    def Delete(self, key):
        """Delete ``key`` (an error if it is not set)."""
        table = self._table()
        key = _key(key)
        if key not in table:
            _exc.raise_error(_exc.ERR_INFO_NOKEY, "key not found")
        del table[key]

    def Get_nkeys(self):
        """The number of keys set."""
        return len(self._table())

    def Get_nthkey(self, n):
        """The ``n``-th key, in the order of insertion."""
        keys = list(self._table())
        n = int(n)
        if not 0 <= n < len(keys):
            _exc.raise_error(_exc.ERR_ARG, f"invalid key index {n}")
        return keys[n]

    # -- Python mapping protocol (mpi4py's) ------------------------------------

    def __len__(self):
        return len(self._table()) if self else 0

    def __contains__(self, key):
        return bool(self) and key in self._table()

    def __iter__(self):
        return iter(self.keys())

    def __getitem__(self, key):
        if not self:
            raise KeyError(key)
        value = self.Get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value):
        if not self:
            raise KeyError(key)
        self.Set(key, value)

    def __delitem__(self, key):
        if not self or key not in self:
            raise KeyError(key)
        self.Delete(key)

    def get(self, key, default=None):
        """The value of ``key``, or ``default`` if it is not set."""
        if not self:
            return default
        value = self.Get(key)
        return default if value is None else value

    def keys(self):
        """A list of the keys."""
        return list(self._table()) if self else []

    def values(self):
        """A list of the values."""
        return list(self._table().values()) if self else []

    def items(self):
        """A list of the (key, value) pairs."""
        return list(self._table().items()) if self else []

    def update(self, items=(), **kwds):
        """Set the pairs of a mapping or iterable of pairs and of keyword arguments."""
        if not self:
            raise KeyError
        pairs = items.items() if hasattr(items, "items") else items
        for k, v in pairs:
            self.Set(k, v)
        for k, v in kwds.items():
            self.Set(k, v)

    def pop(self, key, *default):
        """Remove ``key`` and return its value (or ``default``; KeyError without one)."""
        if self and key in self:
            value = self.Get(key)
            self.Delete(key)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self):
        """Remove the last key set and return its (key, value) pair."""
        if not self or not len(self):
            raise KeyError
        key = list(self._table())[-1]
        return key, self.pop(key)

    def copy(self):
        """A copy of the info object (as `Dup`; a null one gives a new null one)."""
        if not self:
            return type(self)()
        return self.Dup()

    def clear(self):
        """Remove all the keys."""
        if self:
            self._table().clear()


def _env_items(args=None):
    """INFO_ENV's keys: how this process was started."""
    if isinstance(args, str):
        args = [args]
    argv = list(args) if args is not None else list(sys.argv)
    items = {}
    if argv:
        items["command"] = argv[0]
        if len(argv) > 1:
            items["argv"] = " ".join(argv[1:])
    from . import config
    items["maxprocs"] = str(config.get("ERDMA_SIZE", default=1))
    items["wdir"] = os.getcwd()
    items["thread_level"] = "MPI_THREAD_MULTIPLE"
    return items.items()


Info.__module__ = "erdmampi.MPI"
INFO_NULL = Info()
INFO_ENV = object.__new__(Info)
INFO_ENV._h = _ENV_HANDLE
_tables[_ENV_HANDLE] = dict(_env_items())
