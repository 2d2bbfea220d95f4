"""Pickle-based communication using protocol 5 (``mpi4py.util.pkl5`` API).

mpi4py needs this module to move pickles larger than 2 GiB and to send
out-of-band buffers without copies.  The erdmampi engine has 64-bit lengths
and the lowercase methods already use protocol 5 with out-of-band buffers, so
these classes delegate to the normal paths while keeping pkl5's API:
``Comm``/``Intracomm``/``Intercomm`` wrappers built from a communicator (and
sharing it), their own ``pickle`` (a :class:`MPI.Pickle`), and ``Request`` and
``Message`` types.  Only the public ``MPI`` API is used.
"""

from .. import MPI
from ..MPI import ANY_SOURCE, ANY_TAG, PROC_NULL, ROOT, Pickle, Status  # noqa: F401

__all__ = ["pickle", "Request", "Message", "Comm", "Intracomm", "Intercomm",
           "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "ROOT", "Pickle", "Status", "MPI"]

pickle = Pickle()


class Request(MPI.Request):
    """Request for pickle-based communication (``wait()`` returns the object)."""

    def __init__(self, request=None):
        super().__init__(request)

    @classmethod
    def _wrap(cls, req):
        return cls(req)

    @classmethod
    def get_status_all(cls, requests, statuses=None):
        return MPI.Request.Get_status_all(requests, statuses)


class Message(MPI.Message):
    """Matched message for pickle-based communication."""

    def __init__(self, message=None):
        super().__init__(message)

    def irecv(self):
        return Request(super().irecv())

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.improbe(source, tag, status)


def _message(msg):
    if msg is None:
        return None
    return Message(msg)


class Comm(MPI.Comm):
    """Communicator wrapper for pickle-based communication (shares ``comm``)."""

    def __init__(self, comm=None):
        super().__init__(comm if comm is not None else MPI.COMM_NULL)
        self._pkl = pickle

    def isend(self, obj, dest, tag=0):
        return Request(super().isend(obj, dest, tag))

    def ibsend(self, obj, dest, tag=0):
        return Request(super().ibsend(obj, dest, tag))

    def issend(self, obj, dest, tag=0):
        return Request(super().issend(obj, dest, tag))

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        return Request(super().irecv(buf, source, tag))

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return Message(super().mprobe(source, tag, status))

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return _message(super().improbe(source, tag, status))

    def Dup(self, info=None):
        return type(self)(super().Dup())


class Intracomm(Comm, MPI.Intracomm):
    """Intracommunicator wrapper for pickle-based communication."""


class Intercomm(Comm, MPI.Intercomm):
    """Intercommunicator wrapper for pickle-based communication."""
