"""``MPI.buffer``: a byte buffer over memory MPI hands out (Alloc_mem,
window memory).

A NumPy ``uint8`` array subclass, so it exports the buffer protocol on every
Python version and supports ``m[:] = 0``, slicing and ``len``; ``address`` is
the first byte's address (0 for the empty buffer MPI gives for no memory).
"""

import ctypes

import numpy as np


class buffer(np.ndarray):
    """Memory buffer (format "B")."""

    def __new__(cls, obj=None):
        if obj is None:
            return cls._empty()
        return cls.frombuffer(obj)

    def __array_finalize__(self, obj):
        self._obj = getattr(obj, "_obj", None)
        self._null = False

    @classmethod
    def _wrap(cls, arr, owner):
        b = arr.view(cls)
        b._obj = owner
        b._null = False
        return b

    @classmethod
    def _empty(cls):
        b = np.empty(0, np.uint8).view(cls)
        b._obj = None
        b._null = True
        return b

    @classmethod
    def allocate(cls, nbytes, clear=False):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError("expecting non-negative size")
        arr = np.zeros(max(nbytes, 1), np.uint8)[:nbytes] if clear else \
            np.empty(max(nbytes, 1), np.uint8)[:nbytes]
        return cls._wrap(arr, None)

    @classmethod
    def frombuffer(cls, obj, readonly=False):
        mv = memoryview(obj).cast("B") if not isinstance(obj, np.ndarray) else obj
        arr = np.frombuffer(mv, np.uint8) if not isinstance(obj, np.ndarray) else \
            obj.reshape(-1).view(np.uint8)
        if readonly:
            arr = arr.view()
            arr.flags.writeable = False
        return cls._wrap(arr, obj)

    @classmethod
    def fromaddress(cls, address, nbytes, readonly=False):
        address, nbytes = int(address), int(nbytes)
        if nbytes == 0 or address == 0:
            if nbytes:
                raise ValueError("cannot create a buffer at address 0")
            return cls._empty()
        c = (ctypes.c_ubyte * nbytes).from_address(address)
        arr = np.frombuffer(c, np.uint8)
        if readonly:
            arr.flags.writeable = False
        return cls._wrap(arr, None)

    @property
    def address(self):
        if self.size == 0 and getattr(self, "_null", False):
            return 0
        return self.ctypes.data

    @property
    def obj(self):
        return self._obj

    @property
    def format(self):
        return "B"

    @property
    def readonly(self):
        return not self.flags.writeable

    def release(self):
        pass

    def toreadonly(self):
        b = self.view(type(self))
        b.flags.writeable = False
        return b
