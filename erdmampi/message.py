"""Message: a message taken off the queue by a matched probe (Mprobe/Improbe)."""

from ._objmodel import HandleBase
from .exceptions import ERR_REQUEST, raise_error
from .request import Request, _DoneOp

import weakref

PROC_NULL = -1
_NULL_HANDLE = 0x2C000000
_NO_PROC_HANDLE = 0x6C000000
_by_handle = weakref.WeakValueDictionary()
ANY_TAG = -1
ANY_SOURCE = -2


class Message(HandleBase):
    """Matched message, as ``MPI.Message``.

    ``_comm`` is the communicator it was probed on, ``_emsg`` the engine's
    handle; ``_noproc`` marks ``MESSAGE_NO_PROC`` (a probe of PROC_NULL).
    The MPI handle is made on demand (``handle``), which stores it in the
    object's C memory (``_h``, see ``HandleBase``; the null handle or 0
    until then).  A null
    object into which a message handle was written (``MPI._addressof``)
    takes that message when first used (``_adopt``).
    """

    __slots__ = ("_comm", "_emsg", "_noproc", "_predef", "__weakref__")

    def __init__(self, message=None):
        self._comm = None
        self._emsg = None
        self._noproc = False
        self._predef = False
        self._h = _NULL_HANDLE
        if message is not None:
            if not isinstance(message, Message):
                raise TypeError(f"expected Message, got {type(message).__name__}")
            self._comm, self._emsg, self._noproc = message._comm, message._emsg, message._noproc

    @classmethod
    def _new(cls, comm, emsg):
        m = cls()
        m._comm = comm
        m._emsg = emsg
        return m

    def _adopt(self):
        """Take the message named by a handle written into this object.

        The handle was written into this null object's memory; False when
        it names no matched message.
        """
        h = self._h
        if h == 0 or h == _NULL_HANDLE or self._emsg is not None or self._noproc:
            return False
        if h == _NO_PROC_HANDLE:
            self._noproc = True
            return True
        orig = _by_handle.get(h)
        if orig is None or orig is self or orig._emsg is None:
            return False
        self._comm, self._emsg = orig._comm, orig._emsg
        return True

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        if self._h:
            self._adopt()
        if other._h:
            other._adopt()
        if self._noproc or other._noproc:
            return self._noproc == other._noproc
        if self._emsg is None or other._emsg is None:
            return self._emsg is None and other._emsg is None
        return self._emsg is other._emsg

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # unhashable, as mpi4py's

    def __bool__(self):
        return self._emsg is not None or self._noproc or self._adopt()

    def __repr__(self):
        if self._h:
            self._adopt()
        if self._noproc:
            return "<Message MESSAGE_NO_PROC>"
        return f"<Message {'null' if self._emsg is None else 'matched'}>"

    # -- handles (MPICH's values for the two predefined messages) -------------

    @property
    def handle(self):
        """MPI handle (also stored in the object's memory, ``_h``)."""
        if not self:
            h = _NULL_HANDLE
        elif self._noproc:
            h = _NO_PROC_HANDLE
        else:
            h = id(self._emsg) & 0x0FFFFFFF | 0xAC000000
            _by_handle[h] = self
        self._h = h
        return h

    _sync_handle = handle.fget

    @classmethod
    def fromhandle(cls, handle):
        """The message of an integer handle."""
        handle = int(handle)
        if handle == _NULL_HANDLE:
            return cls()
        if handle == _NO_PROC_HANDLE:
            return cls(MESSAGE_NO_PROC)
        orig = _by_handle.get(handle)
        if orig is None or orig._emsg is None:
            raise_error(ERR_REQUEST, f"invalid message handle {handle:#x}")
        return cls(orig)

    def toint(self):
        """The integer handle of the message."""
        return self.handle

    def py2f(self):
        """The Fortran integer handle of the message."""
        return self.handle

    fromint = fromhandle
    f2py = fromhandle

    def __reduce__(self):
        if self._predef:
            return "MESSAGE_NO_PROC" if self._noproc else "MESSAGE_NULL"
        if self._noproc:
            return (type(self), (MESSAGE_NO_PROC,))
        if self._emsg is None:
            return (type(self), ())
        raise ValueError(f"cannot serialize {self!r}")

    # Private

    def _take(self):
        """The (comm, engine message) of this message, which becomes null.

        None for NO_PROC.
        """
        if self._noproc:
            if not self._predef:
                self._noproc = False    # a copy of MESSAGE_NO_PROC becomes null
                self._h = _NULL_HANDLE
            return None, None
        if self._emsg is None:
            raise_error(ERR_REQUEST, "invalid message (MESSAGE_NULL)")
        comm, emsg = self._comm, self._emsg
        if not self._predef:
            self._emsg = None
            self._comm = None
            self._h = _NULL_HANDLE
        return comm, emsg

    # Probes

    @classmethod
    def Probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking matched probe on ``comm``: the `Message` to receive (as `Comm.Mprobe`)."""
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe on ``comm``: a `Message`, or None if none is there."""
        return comm.Improbe(source, tag, status)

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking matched probe on ``comm`` (as `Comm.mprobe`)."""
        return comm.mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe on ``comm``: a `Message`, or None (as `Comm.improbe`)."""
        return comm.improbe(source, tag, status)

    # Receives

    def Recv(self, buf, status=None):
        """Receive the matched message into ``buf``."""
        self.Irecv(buf).Wait(status)

    def Irecv(self, buf):
        """Start receiving the matched message into ``buf``."""
        if self._h:
            self._adopt()
        noproc = self._noproc
        comm, emsg = self._take()
        if noproc:
            return Request._new(_DoneOp())
        return Request._new(comm._mrecv_buf(emsg, buf))

    def recv(self, status=None):
        """Receive the matched message and return the object."""
        return self.irecv().wait(status)

    def irecv(self):
        """Start receiving the matched message as an object."""
        if self._h:
            self._adopt()
        noproc = self._noproc
        comm, emsg = self._take()
        if noproc:
            return Request._new(_DoneOp())
        return Request._new(comm._mrecv_obj(emsg))

    def free(self):
        """Reset the message to null (predefined constants stay as they are)."""
        if not self._predef:
            self._emsg = None
            self._comm = None
            self._noproc = False
            self._h = _NULL_HANDLE


MESSAGE_NULL = Message()
MESSAGE_NULL._predef = True
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._noproc = True
MESSAGE_NO_PROC._predef = True
