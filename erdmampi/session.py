"""Sessions (``MPI.Session``): the process sets mpi://WORLD and mpi://SELF.

A session is a view of the already running engine: Init needs no
communication, and its groups are COMM_WORLD's and COMM_SELF's.
"""

from . import errhandler as _eh
from .exceptions import ERR_ARG, ERR_SESSION, raise_error
from .handleobj import HandleObject

_PSETS = ("mpi://WORLD", "mpi://SELF")


def _rt():
    from .comm import _rt as rt
    return rt


class _SessionState:
    __slots__ = ("thread_level", "errh")

    def __init__(self):
        self.thread_level = "MPI_THREAD_MULTIPLE"


class Session(HandleObject, _eh.HasErrhandler):
    """Session context."""

    _NULL = 0x38000000          # MPICH's MPI_SESSION_NULL
    _FIRST = 0xffffffffb8000000 - 1
    _ERR = ERR_SESSION
    _NULL_NAME = "SESSION_NULL"
    _registry = {}
    _errh_kind = "Session"

    def _check(self):
        return self._state()

    def free(self):
        """Call Finalize if not null."""
        if self:
            self.Finalize()

    @classmethod
    def Init(cls, info=None, errhandler=None):
        """Create a new session (the engine is already up)."""
        from .comm import _engine_or_raise
        _engine_or_raise()
        s = cls._register(_SessionState())
        if errhandler is not None:
            s.Set_errhandler(errhandler)
        return s

    def Finalize(self):
        """Finalize the session; the object becomes null."""
        self._check()
        self._release()

    def Get_num_psets(self, info=None):
        """The number of process sets the session knows."""
        self._check()
        return len(_PSETS)

    def Get_nth_pset(self, n, info=None):
        """The name of the ``n``-th process set."""
        self._check()
        n = int(n)
        if n < 0 or n >= len(_PSETS):
            raise_error(ERR_ARG, f"invalid process set index {n}")
        return _PSETS[n]

    def Get_info(self):
        """An `Info` with the session's hints (``thread_level``)."""
        st = self._check()
        from .info import Info
        return Info.Create({"thread_level": st.thread_level})

    def _pset_ranks(self, name):
        self._check()
        if not isinstance(name, str):
            raise TypeError(f"expected str, got {type(name).__name__}")
        rt = _rt()
        eng = rt.engine
        if name == "mpi://WORLD":
            return list(range(eng.size))
        if name == "mpi://SELF":
            return [eng.rank]
        raise_error(ERR_ARG, f"invalid process set name {name!r}")

    def Get_pset_info(self, pset_name):
        """An `Info` about a process set (``mpi_size``)."""
        ranks = self._pset_ranks(pset_name)
        from .info import Info
        return Info.Create({"mpi_size": str(len(ranks))})

    def Create_group(self, pset_name):
        """The `Group` of the processes of a process set."""
        ranks = self._pset_ranks(pset_name)
        from .group import Group
        return Group._from_ranks(ranks)

    # Session buffers are MPI 4.1; erdmampi implements MPI 4.0 (as MPICH 4.0)

    def Attach_buffer(self, buf):
        """Attach a buffer for buffered sends (an MPI 4.1 call: NotImplementedError)."""
        raise NotImplementedError("MPI_Session_attach_buffer (MPI 4.1)")

    def Detach_buffer(self):
        """Detach the buffer for buffered sends (an MPI 4.1 call: NotImplementedError)."""
        raise NotImplementedError("MPI_Session_detach_buffer (MPI 4.1)")

    def Flush_buffer(self):
        """Flush the buffered sends (an MPI 4.1 call: NotImplementedError)."""
        raise NotImplementedError("MPI_Session_flush_buffer (MPI 4.1)")

    def Iflush_buffer(self):
        """Nonblocking flush of the buffered sends (an MPI 4.1 call: NotImplementedError)."""
        raise NotImplementedError("MPI_Session_iflush_buffer (MPI 4.1)")


SESSION_NULL = Session()
Session._null_object = SESSION_NULL
Session.__module__ = "erdmampi.MPI"
