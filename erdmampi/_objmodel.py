"""Pickling of MPI handle objects, as mpi4py's object model defines it.

A predefined object pickles by name (and unpickles as that very object), an
equal copy of one pickles as ``Type(CONSTANT)``, any other object refuses
with ValueError.  Classes using this set ``__module__ = "erdmampi.MPI"`` so
that names resolve in the module that exports them.

Every MPI handle class derives from :class:`HandleBase` (``_membuf.handle``,
a C type): the object's MPI handle lives in C memory, in one unsigned 64-bit
field read and written through the member descriptor ``_h``.  Classes that
name their handle otherwise alias the descriptor (``_handle = HandleBase._h``),
so a handle read is a plain slot read.  ``MPI._addressof(obj)`` is the
field's address: C code (ctypes, cffi) may read the handle there, or write a
handle into an object, which then designates that MPI object.
"""

from ._membuf import HANDLE_SIZE, addressof as handle_address, handle as HandleBase

__all__ = ["reduce_predefined", "IntHandle", "HandleBase", "HANDLE_SIZE", "handle_address"]


def reduce_predefined(obj, constants):
    """``__reduce__`` result for ``obj``; ``constants`` is ``[(name, object)]``."""
    for name, const in constants:
        if obj is const:
            return name
    for name, const in constants:
        if obj == const:
            return (type(obj), (const,))
    raise ValueError(f"cannot serialize '{type(obj).__module__}."
                     f"{type(obj).__name__}' instance")


class IntHandle(HandleBase):
    """mpi4py's handle calls for a class keeping its handle in ``_h``, whose
    predefined objects are listed by ``_predefined_objects()``."""

    __slots__ = ()

    @property
    def handle(self):
        return self._h

    @classmethod
    def fromhandle(cls, handle):
        handle = int(handle)
        for pre in cls._predefined_objects():
            if pre._h == handle:
                return pre
        obj = object.__new__(cls)
        obj._h = handle & 0xffffffffffffffff
        return obj

    def toint(self):
        return self._h

    py2f = toint

    @classmethod
    def fromint(cls, arg):
        return cls.fromhandle(arg)

    f2py = fromint
