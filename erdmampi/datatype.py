"""Datatype objects: the predefined MPI datatypes and contiguous derived ones.

Each predefined datatype carries the same size, extent, print name, typechar,
typestr and ``tocode()`` as mpi4py built against MPICH 4.0 on x86-64 Linux
(checked by ``tests/test_datatype.py`` against ``tests/data``).  Names that
MPICH 4.0 leaves undefined (``BFLOAT16_T``, ``LOGICAL1`` ...) are
``DATATYPE_NULL``, exactly as mpi4py exposes them.

Internal API used by the buffer parser and the reductions:

* ``Datatype.np_dtype``: NumPy dtype of one element (a structured dtype for
  the value/index pair types, ``None`` when the type has no array form);
  for ``Create_contiguous(n)`` it is the base element dtype and
  ``Datatype._mult == n``, so a message of ``count`` items is an array of
  ``count * _mult`` elements.
* ``from_numpy(dtype)`` and ``from_format(fmt)``: the datatype mpi4py picks
  for an array or a buffer format string.
"""

import itertools
import threading

import numpy as np

from . import exceptions as _exc

__all__ = [
    "Datatype",
    "DATATYPE_NULL",
    "PREDEFINED",
    "TYPEDICT",
    "TYPEDICT_C",
    "TYPEDICT_F",
    "from_numpy",
    "from_format",
    "lookup",
]

# MPICH values (as mpi4py exposes them)
COMBINER_NAMED = 1
COMBINER_DUP = 2
COMBINER_CONTIGUOUS = 3

_handles = itertools.count(0x4C000000)
_lock = threading.Lock()


def _new_handle():
    with _lock:
        return next(_handles)


def _type_error(msg):
    return _exc.Exception(_exc.ERR_TYPE, msg)


# handles of derived datatypes not committed yet (communication with them: ERR_TYPE)
_UNCOMMITTED = set()


class Datatype:
    """Datatype object (``MPI.Datatype``)."""

    __slots__ = (
        "_handle", "_name", "_size", "_lb", "_extent", "_tlb", "_textent",
        "_typechar", "_typestr", "_code", "np_dtype", "_reduce_dtype",
        "_predefined", "_combiner", "_mult", "_base", "__weakref__",
    )

    def __init__(self, datatype=None):
        src = DATATYPE_NULL if datatype is None else datatype
        if not isinstance(src, Datatype):
            raise TypeError(f"expecting Datatype, got {type(datatype).__name__}")
        for slot in Datatype.__slots__[:-1]:
            object.__setattr__(self, slot, getattr(src, slot))

    @classmethod
    def _make(cls, **kw):
        self = object.__new__(cls)
        defaults = dict(
            _handle=None, _name="", _size=0, _lb=0, _extent=0, _tlb=0,
            _textent=0, _typechar="", _typestr="", _code=None, np_dtype=None,
            _reduce_dtype=None, _predefined=False, _combiner=COMBINER_NAMED,
            _mult=1, _base=None,
        )
        defaults.update(kw)
        for k, v in defaults.items():
            object.__setattr__(self, k, v)
        if self._handle is None:
            self._handle = _new_handle()
        if self._base is None:
            self._base = self
        return self

    # -- comparison, hashing, pickling --------------------------------------

    def __eq__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._handle == other._handle

    def __ne__(self, other):
        if not isinstance(other, Datatype):
            return NotImplemented
        return self._handle != other._handle

    __hash__ = None  # unhashable, like mpi4py's Datatype

    def __bool__(self):
        return self._handle != _NULL_HANDLE

    def __reduce__(self):
        if self._predefined:
            for name, dt in PREDEFINED.items():
                if dt is self:
                    return name
        raise ValueError("cannot serialize a derived datatype")

    def __repr__(self):
        if self._predefined:
            return f"<erdmampi.MPI.Datatype {self._name or '(null)'}>"
        return f"<erdmampi.MPI.Datatype derived size={self._size}>"

    # -- handle ----------------------------------------------------------

    @property
    def handle(self):
        """MPI handle."""
        return self._handle

    def tohandle(self):
        """Return MPI handle."""
        return self._handle

    def _check(self):
        if self._handle == _NULL_HANDLE:
            raise _type_error("Datatype for argument datatype is a null datatype")

    # -- accessors -------------------------------------------------------

    def Get_size(self):
        """Return the number of bytes occupied by entries in the datatype."""
        self._check()
        return self._size

    @property
    def size(self):
        """Size (in bytes)."""
        return self.Get_size()

    def Get_extent(self):
        """Return lower bound and extent of the datatype."""
        self._check()
        return (self._lb, self._extent)

    @property
    def extent(self):
        """Extent."""
        return self.Get_extent()[1]

    @property
    def lb(self):
        """Lower bound."""
        return self.Get_extent()[0]

    @property
    def ub(self):
        """Upper bound."""
        lb, extent = self.Get_extent()
        return lb + extent

    def Get_true_extent(self):
        """Return the true lower bound and extent of the datatype."""
        self._check()
        return (self._tlb, self._textent)

    @property
    def true_extent(self):
        """True extent."""
        return self.Get_true_extent()[1]

    @property
    def true_lb(self):
        """True lower bound."""
        return self.Get_true_extent()[0]

    @property
    def true_ub(self):
        """True upper bound."""
        lb, extent = self.Get_true_extent()
        return lb + extent

    def Get_envelope(self):
        """Return (num_integers, num_addresses, num_counts, num_datatypes, combiner)."""
        self._check()
        if self._combiner == COMBINER_CONTIGUOUS:
            return (0, 0, 1, 1, COMBINER_CONTIGUOUS)   # the count is a large count
        if self._combiner == COMBINER_DUP:
            return (0, 0, 0, 1, COMBINER_DUP)
        return (0, 0, 0, 0, COMBINER_NAMED)

    @property
    def envelope(self):
        """Envelope."""
        return self.Get_envelope()

    @property
    def combiner(self):
        """Combiner."""
        return self.Get_envelope()[-1]

    @property
    def is_named(self):
        """Is a named datatype."""
        return self.combiner == COMBINER_NAMED

    @property
    def is_predefined(self):
        """Is a predefined datatype."""
        if self._handle == _NULL_HANDLE:
            return True
        return self._combiner == COMBINER_NAMED

    # -- constructors ----------------------------------------------------

    def _derived(self, combiner, mult, name=""):
        base = self._base
        size = self._size * mult
        extent = self._extent * mult
        new = Datatype._make(
            _name=name, _size=size, _lb=self._lb, _extent=extent,
            _tlb=self._tlb, _textent=(extent - self._extent + self._textent) if mult else 0,
            _typechar="" if combiner != COMBINER_DUP else self._typechar,
            _typestr="" if combiner != COMBINER_DUP else self._typestr,
            _code=self._code if combiner == COMBINER_DUP else None,
            np_dtype=self.np_dtype, _reduce_dtype=self._reduce_dtype,
            _predefined=False, _combiner=combiner, _mult=self._mult * mult,
            _base=base,
        )
        if combiner != COMBINER_DUP or not self._is_committed():
            _UNCOMMITTED.add(new._handle)   # MPI_Type_dup keeps the committed state
        return new

    def _is_committed(self):
        return self._handle not in _UNCOMMITTED

    def Dup(self):
        """Duplicate a datatype."""
        self._check()
        return self._derived(COMBINER_DUP, 1)

    def Create_contiguous(self, count):
        """Create a contiguous datatype."""
        self._check()
        count = int(_index(count))
        if count < 0:
            raise _exc.Exception(_exc.ERR_COUNT, f"Negative count, value is {count}")
        return self._derived(COMBINER_CONTIGUOUS, count)

    def Commit(self):
        """Commit the datatype."""
        self._check()
        _UNCOMMITTED.discard(self._handle)
        return self

    def Free(self):
        """Free the datatype."""
        self._check()
        if self._predefined:
            raise _type_error("Cannot free permanent data type")
        self._handle = _NULL_HANDLE

    def free(self):
        """Call `Free` if not null or predefined."""
        if self._handle != _NULL_HANDLE and not self._predefined:
            self.Free()

    # -- naming ----------------------------------------------------------

    def Get_name(self):
        """Get the print name for this datatype."""
        if self._handle == _NULL_HANDLE:
            return "MPI_DATATYPE_NULL"
        return self._name

    def Set_name(self, name):
        """Set the print name for this datatype."""
        self._check()
        self._name = str(name)

    @property
    def name(self):
        """Print name."""
        return self.Get_name()

    @name.setter
    def name(self, value):
        self.Set_name(value)

    # -- Python/NumPy interoperability ------------------------------------

    def tocode(self):
        """Get character code or type string from predefined MPI datatype."""
        if self._code is None or self._handle == _NULL_HANDLE:
            raise ValueError("cannot map to character code or type string")
        return self._code

    @classmethod
    def fromcode(cls, code):
        """Get predefined MPI datatype from character code or type string."""
        try:
            return TYPEDICT[code]
        except (KeyError, TypeError):
            raise ValueError(f"cannot map code {code!r} to MPI datatype") from None

    @property
    def typestr(self):
        """Type string."""
        if self._handle == _NULL_HANDLE:
            return ""
        return self._typestr or f"V{self._extent}"

    @property
    def typechar(self):
        """Character code."""
        if self._handle == _NULL_HANDLE:
            return ""
        return self._typechar or "V"

    # -- internal --------------------------------------------------------

    def _element_size(self):
        """Size of the basic element this type is built from (Status.Get_elements)."""
        return self._base._size

    def _elements(self, count):
        """Number of ``np_dtype`` elements in ``count`` items of this type."""
        return count * self._mult


def _index(value):
    import operator

    return operator.index(value)


# -----------------------------------------------------------------------------
# Predefined datatypes

_NULL_HANDLE = 0x0C000000

DATATYPE_NULL = Datatype._make(_handle=_NULL_HANDLE, _name="MPI_DATATYPE_NULL",
                               _predefined=True)

PREDEFINED = {"DATATYPE_NULL": DATATYPE_NULL}


def _pair(vfmt, ifmt, offset, itemsize):
    return np.dtype({"names": ["value", "index"], "formats": [vfmt, ifmt],
                     "offsets": [0, offset], "itemsize": itemsize})


# name, MPI print name, size, extent, true extent, typechar, typestr,
# tocode, element dtype, reduction dtype (None: same as element dtype)
_TABLE = [
    ("PACKED", "MPI_PACKED", 1, 1, 1, "B", "u1", "B", None, None),
    ("BYTE", "MPI_BYTE", 1, 1, 1, "B", "u1", "B", "u1", None),
    ("AINT", "MPI_AINT", 8, 8, 8, "p", "i8", "p", "i8", None),
    ("OFFSET", "MPI_OFFSET", 8, 8, 8, "p", "i8", "p", "i8", None),
    ("COUNT", "MPI_COUNT", 8, 8, 8, "p", "i8", "p", "i8", None),
    ("CHAR", "MPI_CHAR", 1, 1, 1, "c", "S1", "c", "S1", "i1"),
    ("WCHAR", "MPI_WCHAR", 4, 4, 4, "U", "U1", "U", "U1", False),
    ("SIGNED_CHAR", "MPI_SIGNED_CHAR", 1, 1, 1, "b", "i1", "b", "i1", None),
    ("SHORT", "MPI_SHORT", 2, 2, 2, "h", "i2", "h", "i2", None),
    ("INT", "MPI_INT", 4, 4, 4, "i", "i4", "i", "i4", None),
    ("LONG", "MPI_LONG", 8, 8, 8, "l", "i8", "l", "i8", None),
    ("LONG_LONG", "MPI_LONG_LONG_INT", 8, 8, 8, "q", "i8", "q", "i8", None),
    ("UNSIGNED_CHAR", "MPI_UNSIGNED_CHAR", 1, 1, 1, "B", "u1", "B", "u1", None),
    ("UNSIGNED_SHORT", "MPI_UNSIGNED_SHORT", 2, 2, 2, "H", "u2", "H", "u2", None),
    ("UNSIGNED", "MPI_UNSIGNED", 4, 4, 4, "I", "u4", "I", "u4", None),
    ("UNSIGNED_LONG", "MPI_UNSIGNED_LONG", 8, 8, 8, "L", "u8", "L", "u8", None),
    ("UNSIGNED_LONG_LONG", "MPI_UNSIGNED_LONG_LONG", 8, 8, 8, "Q", "u8", "Q", "u8", None),
    ("FLOAT", "MPI_FLOAT", 4, 4, 4, "f", "f4", "f", "f4", None),
    ("DOUBLE", "MPI_DOUBLE", 8, 8, 8, "d", "f8", "d", "f8", None),
    ("LONG_DOUBLE", "MPI_LONG_DOUBLE", 16, 16, 16, "g", "f16", "g", "g", None),
    ("C_BOOL", "MPI_C_BOOL", 1, 1, 1, "?", "b1", "b1", "?", None),
    ("INT8_T", "MPI_INT8_T", 1, 1, 1, "b", "i1", "i1", "i1", None),
    ("INT16_T", "MPI_INT16_T", 2, 2, 2, "h", "i2", "i2", "i2", None),
    ("INT32_T", "MPI_INT32_T", 4, 4, 4, "i", "i4", "i4", "i4", None),
    ("INT64_T", "MPI_INT64_T", 8, 8, 8, "l", "i8", "i8", "i8", None),
    ("UINT8_T", "MPI_UINT8_T", 1, 1, 1, "B", "u1", "u1", "u1", None),
    ("UINT16_T", "MPI_UINT16_T", 2, 2, 2, "H", "u2", "u2", "u2", None),
    ("UINT32_T", "MPI_UINT32_T", 4, 4, 4, "I", "u4", "u4", "u4", None),
    ("UINT64_T", "MPI_UINT64_T", 8, 8, 8, "L", "u8", "u8", "u8", None),
    ("FLOAT16_T", "", 2, 2, 2, "e", "f2", "e", "f2", None),
    ("C_COMPLEX", "MPI_C_COMPLEX", 8, 8, 8, "F", "c8", "F", "c8", None),
    ("C_DOUBLE_COMPLEX", "MPI_C_DOUBLE_COMPLEX", 16, 16, 16, "D", "c16", "D", "c16", None),
    ("C_LONG_DOUBLE_COMPLEX", "MPI_C_LONG_DOUBLE_COMPLEX", 32, 32, 32, "G", "c32", "G", "G", None),
    ("CXX_BOOL", "MPI_CXX_BOOL", 1, 1, 1, "?", "b1", "?", "?", None),
    ("CXX_FLOAT_COMPLEX", "MPI_CXX_FLOAT_COMPLEX", 8, 8, 8, "F", "c8", "F", "c8", None),
    ("CXX_DOUBLE_COMPLEX", "MPI_CXX_DOUBLE_COMPLEX", 16, 16, 16, "D", "c16", "D", "c16", None),
    ("CXX_LONG_DOUBLE_COMPLEX", "MPI_CXX_LONG_DOUBLE_COMPLEX", 32, 32, 32, "G", "c32", "G", "G", None),
    ("SHORT_INT", "MPI_SHORT_INT", 6, 8, 8, "", "", None, _pair("i2", "i4", 4, 8), None),
    ("INT_INT", "MPI_2INT", 8, 8, 8, "", "", None, _pair("i4", "i4", 4, 8), None),
    ("LONG_INT", "MPI_LONG_INT", 12, 16, 12, "", "", None, _pair("i8", "i4", 8, 16), None),
    ("FLOAT_INT", "MPI_FLOAT_INT", 8, 8, 8, "", "", None, _pair("f4", "i4", 4, 8), None),
    ("DOUBLE_INT", "MPI_DOUBLE_INT", 12, 16, 12, "", "", None, _pair("f8", "i4", 8, 16), None),
    ("LONG_DOUBLE_INT", "MPI_LONG_DOUBLE_INT", 20, 32, 20, "", "", None, _pair("g", "i4", 16, 32), None),
    ("CHARACTER", "MPI_CHARACTER", 1, 1, 1, "c", "S1", "c", "S1", "i1"),
    ("LOGICAL", "MPI_LOGICAL", 4, 4, 4, "i", "i4", "i", "i4", None),
    ("INTEGER", "MPI_INTEGER", 4, 4, 4, "i", "i4", "i", "i4", None),
    ("REAL", "MPI_REAL", 4, 4, 4, "f", "f4", "f", "f4", None),
    ("DOUBLE_PRECISION", "MPI_DOUBLE_PRECISION", 8, 8, 8, "d", "f8", "d", "f8", None),
    ("COMPLEX", "MPI_COMPLEX", 8, 8, 8, "F", "c8", "F", "c8", None),
    ("DOUBLE_COMPLEX", "MPI_DOUBLE_COMPLEX", 16, 16, 16, "D", "c16", "D", "c16", None),
    ("INTEGER1", "MPI_INTEGER1", 1, 1, 1, "b", "i1", "i1", "i1", None),
    ("INTEGER2", "MPI_INTEGER2", 2, 2, 2, "h", "i2", "i2", "i2", None),
    ("INTEGER4", "MPI_INTEGER4", 4, 4, 4, "i", "i4", "i4", "i4", None),
    ("INTEGER8", "MPI_INTEGER8", 8, 8, 8, "l", "i8", "i8", "i8", None),
    ("REAL4", "MPI_REAL4", 4, 4, 4, "f", "f4", "f4", "f4", None),
    ("REAL8", "MPI_REAL8", 8, 8, 8, "d", "f8", "f8", "f8", None),
    ("REAL16", "MPI_REAL16", 16, 16, 16, "g", "f16", "f16", "g", None),
    ("COMPLEX8", "MPI_COMPLEX8", 8, 8, 8, "F", "c8", "c8", "c8", None),
    ("COMPLEX16", "MPI_COMPLEX16", 16, 16, 16, "D", "c16", "c16", "c16", None),
    ("COMPLEX32", "MPI_COMPLEX32", 32, 32, 32, "G", "c32", "c32", "G", None),
]

# alias -> name of the datatype it is (same handle in MPICH/mpi4py)
_ALIASES = {
    "BOOL": "C_BOOL",
    "C_FLOAT_COMPLEX": "C_COMPLEX",
    "FLOAT32_T": "FLOAT",
    "FLOAT64_T": "DOUBLE",
    "TWOINT": "INT_INT",
    "SIGNED_SHORT": "SHORT",
    "SIGNED_INT": "INT",
    "SIGNED_LONG": "LONG",
    "SIGNED_LONG_LONG": "LONG_LONG",
    "UNSIGNED_INT": "UNSIGNED",
    "SINT8_T": "INT8_T",
    "SINT16_T": "INT16_T",
    "SINT32_T": "INT32_T",
    "SINT64_T": "INT64_T",
    "F_BOOL": "LOGICAL",
    "F_INT": "INTEGER",
    "F_FLOAT": "REAL",
    "F_DOUBLE": "DOUBLE_PRECISION",
    "F_COMPLEX": "COMPLEX",
    "F_FLOAT_COMPLEX": "COMPLEX",
    "F_DOUBLE_COMPLEX": "DOUBLE_COMPLEX",
}

# names mpi4py defines that MPICH 4.0 does not provide: DATATYPE_NULL
_UNSUPPORTED = [
    "BFLOAT16_T", "COMPLEX4", "INTEGER16", "LOGICAL1", "LOGICAL2",
    "LOGICAL4", "LOGICAL8", "LOGICAL16", "REAL2",
]


def _build():
    for (name, mpiname, size, extent, textent, tchar, tstr, code,
         dtype, rdtype) in _TABLE:
        npd = None if dtype is None else np.dtype(dtype)
        if rdtype is None:
            red = npd
        elif rdtype is False:
            red = None
        else:
            red = np.dtype(rdtype)
        PREDEFINED[name] = Datatype._make(
            _name=mpiname, _size=size, _lb=0, _extent=extent, _tlb=0,
            _textent=textent, _typechar=tchar, _typestr=tstr, _code=code,
            np_dtype=npd, _reduce_dtype=red, _predefined=True,
        )
    for alias, name in _ALIASES.items():
        PREDEFINED[alias] = PREDEFINED[name]
    for name in _UNSUPPORTED:
        PREDEFINED[name] = DATATYPE_NULL


_build()
globals().update(PREDEFINED)


# -----------------------------------------------------------------------------
# Typecode maps (mpi4py's MPI._typedict, _typedict_c, _typedict_f)

def _td(pairs):
    return {c: PREDEFINED[n] for c, n in (p.split("=") for p in pairs.split())}


TYPEDICT = _td(
    "?=C_BOOL b=SIGNED_CHAR h=SHORT i=INT l=LONG q=LONG_LONG "
    "B=UNSIGNED_CHAR H=UNSIGNED_SHORT I=UNSIGNED L=UNSIGNED_LONG "
    "Q=UNSIGNED_LONG_LONG e=FLOAT16_T f=FLOAT d=DOUBLE g=LONG_DOUBLE "
    "Zf=C_COMPLEX Zd=C_DOUBLE_COMPLEX Zg=C_LONG_DOUBLE_COMPLEX "
    "F=C_COMPLEX D=C_DOUBLE_COMPLEX G=C_LONG_DOUBLE_COMPLEX "
    "i1=INT8_T i2=INT16_T i4=INT32_T i8=INT64_T "
    "u1=UINT8_T u2=UINT16_T u4=UINT32_T u8=UINT64_T "
    "f2=FLOAT16_T f4=FLOAT f8=DOUBLE f16=LONG_DOUBLE "
    "c8=C_COMPLEX c16=C_DOUBLE_COMPLEX c32=C_LONG_DOUBLE_COMPLEX b1=C_BOOL "
    "n=COUNT N=UNSIGNED_LONG p=AINT P=UNSIGNED_LONG "
    "c=CHAR a=CHAR S=CHAR S1=CHAR s=CHAR 1s=CHAR U=WCHAR U1=WCHAR "
    "u=UINT16_T 1u=UINT16_T w=WCHAR 1w=WCHAR "
    "M=INT64_T M8=INT64_T m=INT64_T m8=INT64_T"
)

TYPEDICT_C = _td(
    "?=C_BOOL b=SIGNED_CHAR h=SHORT i=INT l=LONG q=LONG_LONG "
    "B=UNSIGNED_CHAR H=UNSIGNED_SHORT I=UNSIGNED L=UNSIGNED_LONG "
    "Q=UNSIGNED_LONG_LONG f=FLOAT d=DOUBLE g=LONG_DOUBLE "
    "F=C_COMPLEX D=C_DOUBLE_COMPLEX G=C_LONG_DOUBLE_COMPLEX b1=C_BOOL "
    "i1=INT8_T i2=INT16_T i4=INT32_T i8=INT64_T "
    "u1=UINT8_T u2=UINT16_T u4=UINT32_T u8=UINT64_T "
    "f2=FLOAT16_T f4=FLOAT f8=DOUBLE f16=LONG_DOUBLE "
    "c8=C_COMPLEX c16=C_DOUBLE_COMPLEX c32=C_LONG_DOUBLE_COMPLEX"
)

TYPEDICT_F = _td(
    "l=LOGICAL i=INTEGER r=REAL s=REAL d=DOUBLE_PRECISION c=COMPLEX "
    "z=DOUBLE_COMPLEX i1=INTEGER1 i2=INTEGER2 i4=INTEGER4 i8=INTEGER8 "
    "r4=REAL4 r8=REAL8 r16=REAL16 c8=COMPLEX8 c16=COMPLEX16 c32=COMPLEX32"
)


def lookup(key):
    """Datatype for a typecode key; ``KeyError`` like mpi4py otherwise."""
    try:
        return TYPEDICT[key]
    except (KeyError, TypeError):
        raise KeyError(f"cannot map {key!r} to MPI datatype") from None


def asdatatype(obj):
    """A Datatype, or the datatype of a typecode string (mpi4py rules)."""
    if isinstance(obj, Datatype):
        return obj
    return lookup(obj)


def from_format(fmt):
    """Datatype for a buffer format string (PEP 3118), as mpi4py maps it.

    Native (``@``) and little-endian (``<``) prefixes are stripped;
    big-endian data raises ``BufferError``.
    """
    if fmt is None:
        fmt = "B"
    if fmt[:1] in ("@", "<"):
        fmt = fmt[1:]
    elif fmt[:1] in (">", "!"):
        raise BufferError(f"format string {fmt!r} with non-native byte order")
    return lookup(fmt)


def from_numpy(dtype):
    """Datatype for a NumPy dtype: the one mpi4py picks for such an array.

    Uses the buffer format NumPy exports for the dtype, so the mapping is the
    one mpi4py applies to the same array; the value/index pair dtypes of this
    module map to their pair datatypes.
    """
    dtype = np.dtype(dtype)
    if dtype.fields is not None:
        for dt in PREDEFINED.values():
            if dt.np_dtype is not None and dt.np_dtype.fields and dt.np_dtype == dtype:
                return dt
    try:
        fmt = memoryview(np.empty(0, dtype)).format
    except (ValueError, TypeError, BufferError):
        raise KeyError(f"cannot map {dtype.str!r} to MPI datatype") from None
    return from_format(fmt)
