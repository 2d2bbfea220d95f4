"""Parallel I/O (``MPI.File``) on the local filesystem."""

from . import errhandler as _eh
from .exceptions import ERR_FILE, ERR_UNSUPPORTED_OPERATION, raise_error
from .handleobj import HandleObject

# Access modes, seek whence, distributions (MPICH's values)
MODE_RDONLY = 2
MODE_RDWR = 8
MODE_WRONLY = 4
MODE_CREATE = 1
MODE_EXCL = 64
MODE_DELETE_ON_CLOSE = 16
MODE_UNIQUE_OPEN = 32
MODE_SEQUENTIAL = 256
MODE_APPEND = 128

SEEK_SET = 600
SEEK_CUR = 602
SEEK_END = 604

DISPLACEMENT_CURRENT = -54278278

DISTRIBUTE_BLOCK = 121
DISTRIBUTE_CYCLIC = 122
DISTRIBUTE_NONE = 123
DISTRIBUTE_DFLT_DARG = -49767


class File(HandleObject, _eh.HasErrhandler):
    """File I/O context."""

    _NULL = 0                   # MPICH's MPI_FILE_NULL
    _FIRST = 0x10000000
    _ERR = ERR_FILE
    _NULL_NAME = "FILE_NULL"
    _registry = {}
    _errh_kind = "File"

    def _check(self):
        return self._state()

    def free(self):
        """Call Close if not null."""
        if self:
            self.Close()

    def Get_errhandler(self):
        if self._h == self._NULL:       # FILE_NULL holds the default for Open
            return _eh._new_ref(self._errh)
        return super().Get_errhandler()

    def Set_errhandler(self, errhandler):
        if self._h == self._NULL:
            if not isinstance(errhandler, _eh.Errhandler):
                raise TypeError(f"expected Errhandler, got {type(errhandler).__name__}")
            _eh._ref(errhandler._h)
            old, self._errh = self._errh, errhandler._h
            _eh._unref(old)
            return
        super().Set_errhandler(errhandler)

    @classmethod
    def Open(cls, comm, filename, amode=MODE_RDONLY, info=None):
        raise_error(ERR_UNSUPPORTED_OPERATION, "MPI-IO is not supported by erdmampi")

    def Close(self):
        self._check()
        self._release()


FILE_NULL = File()
File._null_object = FILE_NULL
File.__module__ = "erdmampi.MPI"
