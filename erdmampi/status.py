"""Status: the envelope of a received (or probed) message."""

from array import array as _array

UNDEFINED = -32766
ANY_SOURCE = -2
ANY_TAG = -1
SUCCESS = 0
# count 0, not cancelled, ANY_SOURCE, ANY_TAG, SUCCESS
_INIT = (0, 0, ANY_SOURCE, ANY_TAG, SUCCESS)


def _byte():
    from .datatype import BYTE
    return BYTE


def _dtsize(datatype):
    if datatype is None:
        return 1
    size = datatype.Get_size()
    return size


class Status:
    """Status object, as ``MPI.Status``: source, tag, error and the byte count.

    Counts are kept in bytes; :meth:`Get_count` divides by the datatype size.
    """

    # The fields live in MPICH's MPI_Status layout (five C ints: count low
    # word, count high word << 1 | cancelled, source, tag, error) so that
    # ``tomemory()`` can expose them writable, as mpi4py does; an
    # array.array, whose items cost a fraction of a numpy array's.
    __slots__ = ("_mem", "__weakref__")

    def _get(i):
        return property(lambda self: self._mem[i],
                        lambda self, v: self._mem.__setitem__(i, v))

    _source = _get(2)
    _tag = _get(3)
    _error = _get(4)
    del _get

    @property
    def _nbytes(self):
        return (int(self._mem[0]) & 0xFFFFFFFF) | ((int(self._mem[1]) & 0x7FFFFFFF) >> 1 << 32)

    @_nbytes.setter
    def _nbytes(self, n):
        n = int(n)
        lo = n & 0xFFFFFFFF
        self._mem[0] = lo - (1 << 32) if lo >= 1 << 31 else lo
        self._mem[1] = ((n >> 32) << 1) | (int(self._mem[1]) & 1)

    @property
    def _cancelled(self):
        return bool(int(self._mem[1]) & 1)

    @_cancelled.setter
    def _cancelled(self, flag):
        self._mem[1] = (int(self._mem[1]) & ~1) | (1 if flag else 0)

    def __init__(self, status=None):
        self._mem = _array("i", _INIT)
        if status is not None:
            if not isinstance(status, Status):
                raise TypeError(f"expected Status, got {type(status).__name__}")
            self._copy_from(status)

    # Private

    def _copy_from(self, other):
        self._source = other._source
        self._tag = other._tag
        self._error = other._error
        self._nbytes = other._nbytes
        self._cancelled = other._cancelled

    def _fill(self, source, tag, error, nbytes, cancelled=False):
        """Fill in the envelope; ``error`` None leaves MPI_ERROR as it is.

        MPICH's MPI_Recv and MPI_Wait leave it so."""
        m = self._mem
        m[2] = source
        m[3] = tag
        if error is not None:
            m[4] = error
        if 0 <= nbytes < 1 << 31:
            m[0] = nbytes
            m[1] = 1 if cancelled else 0
        else:
            self._nbytes = nbytes
            self._cancelled = cancelled

    # Public API

    def __eq__(self, other):
        if not isinstance(other, Status):
            return NotImplemented
        return (self._source, self._tag, self._error, self._nbytes, self._cancelled) == \
            (other._source, other._tag, other._error, other._nbytes, other._cancelled)

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __repr__(self):
        return (f"<Status source={self._source} tag={self._tag} error={self._error} "
                f"count={self._nbytes}>")

    def __reduce__(self):
        return (_rebuild_status, (type(self), [int(v) for v in self._mem]))

    def Get_source(self):
        """Return the message source."""
        return self._source

    def Set_source(self, source):
        """Set the source rank."""
        self._source = int(source)

    def Get_tag(self):
        """Return the message tag."""
        return self._tag

    def Set_tag(self, tag):
        """Set the tag."""
        self._tag = int(tag)

    def Get_error(self):
        """Return the error code."""
        return self._error

    def Set_error(self, error):
        """Set the error code."""
        self._error = int(error)

    def Get_count(self, datatype=None):
        """Return the number of received entries of ``datatype`` (UNDEFINED if partial)."""
        size = _dtsize(datatype if datatype is not None else _byte())
        if size == 0:
            return 0 if self._nbytes == 0 else UNDEFINED
        if self._nbytes % size:
            return UNDEFINED
        return self._nbytes // size

    Get_count_c = Get_count

    def Get_elements(self, datatype):
        """Return the number of basic elements of ``datatype`` received."""
        size = _dtsize(datatype)
        if size == 0:
            return 0
        # Predefined types: elements == count; derived types may have a base size.
        base = getattr(datatype, "_element_size", None)
        if callable(base):
            base = base()
        if base:
            return UNDEFINED if self._nbytes % base else self._nbytes // base
        return UNDEFINED if self._nbytes % size else self._nbytes // size

    Get_elements_c = Get_elements

    def Set_elements(self, datatype, count):
        """Set the number of elements (as bytes of ``datatype``)."""
        self._nbytes = int(count) * _dtsize(datatype)

    Set_elements_c = Set_elements

    def Is_cancelled(self):
        """Return whether the request was cancelled."""
        return self._cancelled

    def Set_cancelled(self, flag):
        """Set whether the request was cancelled."""
        self._cancelled = bool(flag)

    def py2f(self):
        """The Fortran status: MPICH's MPI_Status as F_STATUS_SIZE integers."""
        return [int(v) for v in self._mem]

    @classmethod
    def f2py(cls, arg):
        """A status from a sequence of Fortran integers."""
        st = cls()
        values = [int(v) for v in arg]
        if len(values) != len(st._mem):
            raise ValueError(f"expecting {len(st._mem)} integers, got {len(values)}")
        st._mem[:] = _array("i", values)
        return st

    source = property(Get_source, Set_source, doc="source")
    tag = property(Get_tag, Set_tag, doc="tag")
    error = property(Get_error, Set_error, doc="error")
    cancelled = property(Is_cancelled, Set_cancelled, doc="cancelled state")

    def tomemory(self):
        """The status fields as a writable memoryview of C ints."""
        return memoryview(self._mem).cast("B").cast("i")

    @property
    def count(self):
        """Byte count."""
        return self.Get_count()

    @count.setter
    def count(self, value):
        self._nbytes = int(value)


def _rebuild_status(cls, mem):
    return cls.f2py(mem)
