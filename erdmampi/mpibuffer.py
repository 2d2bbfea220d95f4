"""``MPI.buffer`` (alias ``MPI.memory``): mpi4py's byte buffer object.

The type itself is C (``_membuf``, built from ext/python/membuf.c) since it
must export the buffer protocol; this module holds what MPI builds on it:
memory from ``Alloc_mem`` and the buffer attached for buffered sends.
"""

import threading

from ._membuf import asbuffer, buffer
from .buffers import BUFFER_AUTOMATIC, is_buffer_automatic
from .exceptions import ERR_ARG, ERR_BUFFER, raise_error

__all__ = ["buffer", "asbuffer", "alloc_mem", "free_mem", "attach", "detach"]

# MPICH refuses an attached buffer smaller than its per-message overhead
BSEND_OVERHEAD = 96

_lock = threading.Lock()
# Alloc_mem hands out a buffer whose obj is None (as MPI memory has no Python
# exporter); the owning allocation is kept here until Free_mem
_allocated = {}
# the buffer attached per scope (None: the process, else a comm/session key)
_attached = {}


def alloc_mem(size):
    """A fresh writable buffer of ``size`` bytes (``MPI.Alloc_mem``)."""
    if not hasattr(type(size), "__index__"):
        raise TypeError("an integer is required")
    nbytes = size.__index__()
    if nbytes < 0:
        raise_error(ERR_ARG, f"Invalid value for size, must be non-negative but is {nbytes}")
    owner = buffer.allocate(nbytes)
    mem = buffer.fromaddress(owner.address, nbytes)
    with _lock:
        _allocated[mem.address] = owner
    return mem


def free_mem(mem):
    """Free memory from ``alloc_mem`` and empty the buffer (``MPI.Free_mem``)."""
    buf = asbuffer(mem, True)
    with _lock:
        owner = _allocated.pop(buf.address, None)
    buf.release()
    if owner is not None:
        owner.release()


def _exported(obj):
    """A buffer over a DLPack or CUDA-array-interface exporter, which mpi4py's
    Attach_buffer takes too (the exporter is kept alive by the buffer's owner
    table until detach)."""
    from .buffers import getbuffer
    raw = getbuffer(obj, False).raw
    mem = buffer.fromaddress(raw.ctypes.data, raw.nbytes)
    _exporters[id(mem)] = (obj, raw)
    return mem


_exporters = {}


def attach(key, buf):
    """Attach ``buf`` (or BUFFER_AUTOMATIC/None) for buffered sends."""
    if buf is None or is_buffer_automatic(buf):
        buf = BUFFER_AUTOMATIC
    else:
        try:
            buf = asbuffer(buf, False)
        except TypeError:
            buf = _exported(buf)
        if buf.nbytes < BSEND_OVERHEAD:
            raise_error(ERR_BUFFER, f"Buffer size of {buf.nbytes} is smaller than "
                        f"MPI_BSEND_OVERHEAD ({BSEND_OVERHEAD})")
    with _lock:
        _attached[key] = buf
    return buf


def detach(key):
    """Detach and return what ``attach`` got.

    The user's object when it had one, else a buffer over the same memory;
    BUFFER_AUTOMATIC by default.
    """
    with _lock:
        buf = _attached.pop(key, None)
        _exporters.pop(id(buf), None)
    if buf is None or buf is BUFFER_AUTOMATIC:
        return BUFFER_AUTOMATIC
    if buf.obj is not None:
        return buf.obj
    return buffer.fromaddress(buf.address, buf.nbytes)
