"""Attribute caching (keyvals) with mpi4py's callback rules (MPI 4.0 7.7).

``copy_fn(obj, keyval, value)`` runs when an object is duplicated: None or
False means "not copied", True "copied as is", a callable returns the new
value or ``NotImplemented`` ("not copied").  ``delete_fn(obj, keyval,
value)`` runs when the attribute is deleted, replaced, or its object freed.
A callback that raises has its traceback printed and turns into an MPI error
(its class for ``MPI.Exception``, else ``ERR_OTHER``), as in mpi4py.  Once a
keyval is freed its callbacks no longer run; attributes already set keep
their values until deleted.
"""

import sys
import threading
import traceback

from .exceptions import ERR_KEYVAL, ERR_OTHER, Exception as MPIException, raise_error

__all__ = ["create_keyval", "free_keyval", "get", "set", "delete", "copy_all",
           "delete_all", "KEYVAL_INVALID"]

KEYVAL_INVALID = 603979776        # MPICH's MPI_KEYVAL_INVALID
_lock = threading.Lock()
_next = [0xA4400000]         # clear of the predefined keyvals (0x644000xx)
_keyvals = {}                     # keyval -> (kind, copy_fn, delete_fn, nopython)


def create_keyval(kind, copy_fn=None, delete_fn=None, nopython=False):
    for name, fn in (("copy_fn", copy_fn), ("delete_fn", delete_fn)):
        if fn is not None and fn is not True and fn is not False and not callable(fn):
            raise TypeError(f"{name} must be callable, True, False or None")
    with _lock:
        k = _next[0]
        _next[0] += 1
        _keyvals[k] = (kind, copy_fn, delete_fn, bool(nopython))
    return k


def free_keyval(kind, keyval):
    keyval = int(keyval)
    with _lock:
        entry = _keyvals.get(keyval)
        if entry is None or entry[0] != kind:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        del _keyvals[keyval]
    return KEYVAL_INVALID


def _entry(kind, keyval):
    entry = _keyvals.get(int(keyval))
    if entry is None or entry[0] != kind:
        raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
    return entry


def _run(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001  (user callback: any error is an MPI error)
        traceback.print_exc(file=sys.stderr)
        cls = exc.Get_error_class() if isinstance(exc, MPIException) else ERR_OTHER
        raise MPIException(cls) from None


def get(kind, attrs, keyval):
    _entry(kind, keyval)
    return attrs.get(int(keyval))


def set(kind, obj, attrs, keyval, value):  # noqa: A001  (MPI's name)
    _entry(kind, keyval)
    keyval = int(keyval)
    if keyval in attrs:
        _delete_one(obj, attrs, keyval)
    attrs[keyval] = value


def delete(kind, obj, attrs, keyval):
    _entry(kind, keyval)
    keyval = int(keyval)
    if keyval not in attrs:
        raise_error(ERR_KEYVAL, f"no attribute for keyval {keyval}")
    _delete_one(obj, attrs, keyval)


def _delete_one(obj, attrs, keyval):
    value = attrs.pop(keyval)
    entry = _keyvals.get(keyval)
    if entry is not None and callable(entry[2]) and entry[2] is not True:
        _run(entry[2], obj, keyval, value)


def copy_all(obj, attrs):
    """The attributes a duplicate of ``obj`` starts with."""
    new = {}
    for keyval, value in list(attrs.items()):
        entry = _keyvals.get(keyval)
        if entry is None:
            continue
        copy_fn = entry[1]
        if copy_fn is None or copy_fn is False:
            continue
        if copy_fn is True:
            new[keyval] = value
            continue
        result = _run(copy_fn, obj, keyval, value)
        if result is not NotImplemented:
            new[keyval] = result
    return new


def delete_all(obj, attrs):
    """Delete every attribute (the object is being freed)."""
    for keyval in list(attrs):
        _delete_one(obj, attrs, keyval)
