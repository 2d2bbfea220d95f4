"""Pinned (page-locked) host areas for staging device buffers without CuPy.

A copy between the GPU and pageable memory goes through the driver's own
bounce buffer and faults the pages in on every fresh array; from pinned
memory it is one DMA.  Pinning itself is slow (the driver locks and maps
every page), so areas are kept by size class and handed out again, as
CuPy's pinned pool does.  An area goes back to the pool when the last
array viewing it is gone; at most ``keep`` idle bytes stay pinned.

Allocators: the CUDA runtime (``cudaHostAlloc``, portable across
contexts) when ``libcudart`` loads, else Numba's driver binding.  Any
failure (no driver, pinning refused, out of locked memory) makes the
caller fall back to a plain array.
"""
import ctypes
import threading
import weakref

import numpy as np

__all__ = ["PinnedPool", "size_class", "default_pool"]

_KEEP = 256 << 20     # idle pinned bytes kept at most (the rest is freed)


def size_class(nbytes):
    """``nbytes`` rounded up to a quarter step of its power of two (at most
    25 % of an area unused, and few classes for the pool to keep)."""
    step = 1 << max(nbytes.bit_length() - 3, 12)
    return -(-nbytes // step) * step


class _Area:
    """The owner of one pinned area while arrays view it."""
    __slots__ = ("__array_interface__", "__weakref__")


class PinnedPool:
    """Pinned areas by size class.  ``alloc(size) -> (address, handle)``
    pins; ``free(handle)`` unpins.  Thread-safe."""

    def __init__(self, alloc, free, keep=_KEEP):
        self._alloc, self._free, self._keep = alloc, free, keep
        self._idle = {}            # size class -> [(address, handle)]
        self._idle_bytes = 0
        # re-entrant: a collection inside the lock may finalize another area
        # and give it back on this thread
        self._lock = threading.RLock()
        self.pinned = 0            # areas pinned so far (for tests)

    def take(self, nbytes):
        """A ``uint8`` array of ``nbytes`` in pinned memory."""
        size = size_class(nbytes)
        with self._lock:
            free = self._idle.get(size)
            got = free.pop() if free else None
            if got is not None:
                self._idle_bytes -= size
        if got is None:
            got = self._alloc(size)
            with self._lock:
                self.pinned += 1
        area = _Area()
        area.__array_interface__ = {"shape": (size,), "typestr": "|u1",
                                    "data": (got[0], False), "version": 3}
        done = weakref.finalize(area, self._give_back, size, got)
        done.atexit = False    # the driver may be gone at exit: leave it to the OS
        return np.asarray(area)[:nbytes]

    def _give_back(self, size, got):
        with self._lock:
            if self._idle_bytes + size <= self._keep:
                self._idle.setdefault(size, []).append(got)
                self._idle_bytes += size
                return
        self._free(got[1])

    def idle_bytes(self):
        return self._idle_bytes


def _runtime_allocator(lib):
    lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                  ctypes.c_uint]
    lib.cudaHostAlloc.restype = ctypes.c_int
    lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
    lib.cudaFreeHost.restype = ctypes.c_int

    def alloc(size):
        ptr = ctypes.c_void_p()
        rc = lib.cudaHostAlloc(ctypes.byref(ptr), size, 1)   # cudaHostAllocPortable
        if rc != 0 or not ptr.value:
            lib.cudaGetLastError()
            raise MemoryError(f"cudaHostAlloc({size}) failed with error {rc}")
        return ptr.value, ptr.value

    def free(ptr):
        lib.cudaFreeHost(ptr)

    return alloc, free


def _numba_allocator(cuda):
    def alloc(size):
        mem = cuda.current_context().memhostalloc(size, portable=True)
        return mem.host_pointer.value, mem   # freed when the handle is dropped

    return alloc, lambda mem: None


_POOL = None            # None: not made yet; False: no allocator here
_POOL_LOCK = threading.Lock()


def default_pool(runtime, numba_cuda):
    """The process's pool, made on first use from ``runtime()`` (libcudart
    through ctypes, or None) or ``numba_cuda()`` (numba.cuda, or None);
    None where neither can pin."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            lib = runtime()
            if lib is not None:
                _POOL = PinnedPool(*_runtime_allocator(lib))
            else:
                cuda = numba_cuda()
                _POOL = PinnedPool(*_numba_allocator(cuda)) if cuda is not None else False
    return _POOL or None
