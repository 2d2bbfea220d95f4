"""Datatype objects: the predefined MPI datatypes and derived ones.

Each predefined datatype carries the same size, extent, print name, typechar,
typestr and ``tocode()`` as mpi4py built against MPICH 4.0 on x86-64 Linux
(checked by ``tests/test_datatype.py`` against ``tests/data``).  Names that
MPICH 4.0 leaves undefined (``BFLOAT16_T``, ``LOGICAL1`` ...) are
``DATATYPE_NULL``, exactly as mpi4py exposes them.

Derived datatypes keep their constructor arguments (``Get_contents``, in
MPICH's large-count layout), their bounds (computed from the arguments as
MPICH does) and, built on first use, their type map as byte runs
(:mod:`erdmampi.typemap`) for Pack/Unpack and for communication.

Internal API used by the buffer parser and the reductions:

* ``Datatype.np_dtype``: NumPy dtype of one element (a structured dtype for
  the value/index pair types, ``None`` when the type has no array form);
  a derived type built from one elementary type has that type's dtype and
  ``Datatype._mult`` elements per item (``_base`` is the elementary type).
* ``Datatype._dense()``: items lie in memory exactly as packed (no gaps,
  lower bound 0): the buffer can be used as is; otherwise the parser packs
  through ``Datatype._wire()``, the contiguous type of the packed bytes.
* ``from_numpy(dtype)`` and ``from_format(fmt)``: the datatype mpi4py picks
  for an array or a buffer format string.
"""

import functools
import itertools
import operator
import weakref

import numpy as np

from . import attributes as _attributes
from . import exceptions as _exc
from . import typemap as _tm
from ._objmodel import HandleBase

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
COMBINER_VECTOR = 4
COMBINER_HVECTOR = 6
COMBINER_INDEXED = 7
COMBINER_HINDEXED = 9
COMBINER_INDEXED_BLOCK = 10
COMBINER_STRUCT = 12
COMBINER_SUBARRAY = 13
COMBINER_DARRAY = 14
COMBINER_F90_REAL = 15
COMBINER_F90_COMPLEX = 16
COMBINER_F90_INTEGER = 17
COMBINER_RESIZED = 18
COMBINER_HINDEXED_BLOCK = 19
COMBINER_VALUE_INDEX = 1      # MPICH 4.x: the pair types are named

COMBINER_NAMES = {
    COMBINER_NAMED: "NAMED", COMBINER_DUP: "DUP", COMBINER_CONTIGUOUS: "CONTIGUOUS",
    COMBINER_VECTOR: "VECTOR", COMBINER_HVECTOR: "HVECTOR", COMBINER_INDEXED: "INDEXED",
    COMBINER_HINDEXED: "HINDEXED", COMBINER_INDEXED_BLOCK: "INDEXED_BLOCK",
    COMBINER_HINDEXED_BLOCK: "HINDEXED_BLOCK", COMBINER_STRUCT: "STRUCT",
    COMBINER_SUBARRAY: "SUBARRAY", COMBINER_DARRAY: "DARRAY", COMBINER_RESIZED: "RESIZED",
    COMBINER_F90_INTEGER: "F90_INTEGER", COMBINER_F90_REAL: "F90_REAL",
    COMBINER_F90_COMPLEX: "F90_COMPLEX",
}
_F90 = (COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_F90_COMPLEX)

ORDER_C = 56
ORDER_FORTRAN = 57
DISTRIBUTE_BLOCK = 121
DISTRIBUTE_CYCLIC = 122
DISTRIBUTE_NONE = 123
DISTRIBUTE_DFLT_DARG = -49767
TYPECLASS_REAL = 1
TYPECLASS_INTEGER = 2
TYPECLASS_COMPLEX = 3
TYPECLASS_LOGICAL = 4

_handles = itertools.count(0x4C000000)


def _new_handle():
    return next(_handles)       # itertools.count: atomic under the GIL


def _type_error(msg):
    return _exc.Exception(_exc.ERR_TYPE, msg)


def _arg_error(msg):
    return _exc.Exception(_exc.ERR_ARG, msg)


# handles of derived datatypes not committed yet (communication with them: ERR_TYPE)
_UNCOMMITTED = set()
# live handles -> their records (fromhandle/f2py find derived types again)
_records = {}
# names set with Set_name, per handle (the type itself may be shared)
_NAMES = {}


def _count(value, what="count"):
    value = operator.index(value)
    if value < 0:
        raise _exc.Exception(_exc.ERR_COUNT, f"Negative {what}, value is {value}")
    return value


def _ints(seq):
    return [operator.index(x) for x in seq]


def _getarray(seq):
    if isinstance(seq, (int, np.integer)):
        return [operator.index(seq)]
    return _ints(seq)


def _chkarray(seq, n):
    values = _getarray(seq)
    if len(values) != n:
        raise ValueError(f"expecting {n} items, got {len(values)}")
    return values


class _Record:
    """What a datatype handle designates (shared by every Datatype object
    holding that handle, as MPI objects are): class attributes are defaults."""

    _name = ""
    _size = 0
    _lb = 0
    _extent = 0
    _tlb = 0
    _textent = 0
    _typechar = ""
    _typestr = ""
    _code = None
    np_dtype = None
    _reduce_dtype = None
    _predefined = False
    _combiner = COMBINER_NAMED
    _mult = 1
    _base = None
    _contents = ((), (), (), ())
    _build = None
    _layout = None
    _wiretype = None
    _align = None


_FIELDS = [k for k in vars(_Record) if not k.startswith("__")]


class _ByHandle:
    """The ``_r`` of a Datatype object holding the null handle: stands for
    the record of whatever handle the object holds, looked up on each use,
    so that a handle written into the object's memory (``MPI._addressof``)
    makes it that datatype; once the handle is not null, the object keeps
    that record in place of this one.  (A stand-in rather than a
    ``Datatype.__getattr__``: that would slow every attribute read of every
    datatype.)"""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        object.__setattr__(self, "_owner", weakref.ref(owner))

    def _record(self):
        owner = self._owner()
        h = _NULL_HANDLE if owner is None else owner._handle
        rec = _records.get(h)
        if rec is None:
            raise _type_error(f"unknown datatype handle {h:#x}")
        if h != _NULL_HANDLE:
            owner._r = rec
        return rec

    def __getattr__(self, name):
        return getattr(self._record(), name)

    def __setattr__(self, name, value):
        setattr(self._record(), name, value)


class Datatype(HandleBase):
    """Datatype object (``MPI.Datatype``).

    ``_handle`` is the MPI handle (in C memory: ``HandleBase``), ``_r`` the
    record it designates (for an object holding the null handle, a
    ``_ByHandle`` that looks the record up by handle).
    """

    __slots__ = ("_r", "__weakref__")
    _handle = HandleBase._h

    def __init__(self, datatype=None):
        src = DATATYPE_NULL if datatype is None else datatype
        if not isinstance(src, Datatype):
            raise TypeError(f"expecting Datatype, got {type(datatype).__name__}")
        self._handle = h = src._handle
        self._r = src._r if h != _NULL_HANDLE else _ByHandle(self)

    def _set_null(self):
        self._handle = _NULL_HANDLE
        self._r = _ByHandle(self)

    @classmethod
    def _make(cls, **kw):
        self = object.__new__(cls)
        rec = _Record()
        handle = kw.pop("_handle", None)
        rec.__dict__.update(kw)
        # in the record's own dict: _check reads it on every call
        rec._isnull = handle == _NULL_HANDLE
        self._handle = _new_handle() if handle is None else handle
        self._r = rec
        _records[self._handle] = rec
        if rec._base is None:
            # a private reference: the user freeing ``self`` leaves it alone
            rec._base = self if rec._predefined else Datatype(self)
        return self

    def _clone(self):
        """A new handle to the same type (committed as this one is)."""
        new = object.__new__(Datatype)
        new._handle = _new_handle()
        new._r = self._r
        _records[new._handle] = new._r
        if not self._is_committed():
            _UNCOMMITTED.add(new._handle)
        return new

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
        if self._handle == _NULL_HANDLE or self._combiner == COMBINER_NAMED:
            name = _NAME_OF.get(self._handle)
            if name is not None:
                if PREDEFINED[name] is self:
                    return name
                return (type(self), (PREDEFINED[name],))
        basetype, combiner, params = self.decode()
        if type(self) is not Datatype:
            return (type(self), (_datatype_create(basetype, combiner, params, True),))
        return (_datatype_create, (basetype, combiner, params, True))

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

    @classmethod
    def fromhandle(cls, handle):
        """The datatype of a handle (predefined, or derived and not freed)."""
        handle = int(handle)
        name = _NAME_OF.get(handle)
        if name is not None and cls is Datatype:
            return PREDEFINED[name]
        rec = _records.get(handle)
        if rec is None:
            raise _type_error(f"unknown datatype handle {handle:#x}")
        new = object.__new__(cls)
        new._handle, new._r = handle, rec
        return new

    def toint(self):
        """The integer handle of the datatype."""
        return self._handle

    py2f = toint

    @classmethod
    def fromint(cls, arg):
        """The datatype of an integer handle."""
        return cls.fromhandle(arg)

    f2py = fromint

    def _check(self):
        # the record of the null handle (a null object's _ByHandle finds it)
        if self._r._isnull:
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

    # -- decoding --------------------------------------------------------

    def Get_envelope(self):
        """Return (num_integers, num_addresses, num_counts, num_datatypes, combiner)."""
        self._check()
        i, a, c, d = self._contents
        return (len(i), len(a), len(c), len(d), self._combiner)

    @property
    def envelope(self):
        """Envelope."""
        return self.Get_envelope()

    def Get_contents(self):
        """Return the input arguments used to create a datatype."""
        self._check()
        if self._combiner == COMBINER_NAMED:
            raise _type_error("Invalid datatype: contents of a named datatype")
        i, a, c, d = self._contents
        return (list(i), list(a), list(c), [_ref(t) for t in d])

    @property
    def contents(self):
        """Contents."""
        return self.Get_contents()

    def decode(self):
        """Convenience method for decoding a datatype."""
        self._check()
        combiner = self._combiner
        if combiner == COMBINER_NAMED:
            return (self, "NAMED", {})
        i, a, c, d = self.Get_contents()
        oldtype = d[0] if len(d) == 1 else DATATYPE_NULL
        if combiner == COMBINER_DUP:
            params = {}
        elif combiner == COMBINER_CONTIGUOUS:
            params = {"count": c[0]}
        elif combiner in (COMBINER_VECTOR, COMBINER_HVECTOR):
            params = {"count": c[0], "blocklength": c[1], "stride": c[2]}
        elif combiner in (COMBINER_INDEXED, COMBINER_HINDEXED):
            n = c[0]
            params = {"blocklengths": c[1:n + 1], "displacements": c[n + 1:2 * n + 1]}
        elif combiner in (COMBINER_INDEXED_BLOCK, COMBINER_HINDEXED_BLOCK):
            n = c[0]
            params = {"blocklength": c[1], "displacements": c[2:n + 2]}
        elif combiner == COMBINER_STRUCT:
            n = c[0]
            params = {"blocklengths": c[1:n + 1], "displacements": c[n + 1:2 * n + 1],
                      "datatypes": d}
        elif combiner == COMBINER_SUBARRAY:
            n = i[0]
            params = {"sizes": c[:n], "subsizes": c[n:2 * n], "starts": c[2 * n:3 * n],
                      "order": i[1]}
        elif combiner == COMBINER_DARRAY:
            n = i[2]
            params = {"size": i[0], "rank": i[1], "gsizes": c[:n],
                      "distribs": i[3:3 + n], "dargs": i[3 + n:3 + 2 * n],
                      "psizes": i[3 + 2 * n:3 + 3 * n], "order": i[3 + 3 * n]}
        elif combiner == COMBINER_RESIZED:
            params = {"lb": c[0], "extent": c[1]}
        elif combiner == COMBINER_F90_INTEGER:
            params = {"r": i[0]}
        else:  # F90 real/complex
            params = {"p": i[0], "r": i[1]}
        return (oldtype, COMBINER_NAMES[combiner], params)

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
        return self._combiner == COMBINER_NAMED or self._combiner in _F90

    # -- constructors ----------------------------------------------------

    def _derived(self, combiner, contents, blocks, build, types=None):
        """A new datatype made of ``blocks``: [(oldtype, byte displacement, blocklength)].

        Bounds are as MPICH computes them; zero-length blocks count for
        nothing; ``build()`` makes its layout on demand.
        """
        types = types or (self,)
        lb = ub = tlb = tub = None
        size = 0
        for t, d, b in blocks:
            if b <= 0:
                continue
            span = (b - 1) * t._extent
            lo, hi = min(0, span), max(0, span)
            size += b * t._size
            blb, bub = d + t._lb + lo, d + t._lb + t._extent + hi
            btl, btu = d + t._tlb + lo, d + t._tlb + t._textent + hi
            if lb is None:
                lb, ub, tlb, tub = blb, bub, btl, btu
            else:
                lb, ub, tlb, tub = min(lb, blb), max(ub, bub), min(tlb, btl), max(tub, btu)
        if lb is None:
            lb = ub = tlb = tub = 0
        return _new_derived(combiner, contents, types, size, lb, ub, tlb, tub, build)

    def _is_committed(self):
        return self._handle not in _UNCOMMITTED

    def Dup(self):
        """Duplicate a datatype."""
        self._check()
        new = Datatype._make(
            _name="", _size=self._size, _lb=self._lb, _extent=self._extent,
            _tlb=self._tlb, _textent=self._textent, _typechar=self._typechar,
            _typestr=self._typestr, _code=self._code, np_dtype=self.np_dtype,
            _reduce_dtype=self._reduce_dtype, _combiner=COMBINER_DUP,
            _mult=self._mult, _base=self._base, _contents=((), (), (), (_ref(self),)),
            _build=functools.partial(_lay, self._r), _layout=self._layout,
        )
        attrs = self._r.__dict__.get("_attrs")
        if attrs:
            try:
                new._r._attrs = _attributes.copy_all(self, attrs)
            except BaseException:
                new.Free()
                raise
        return new      # MPICH: a duplicate is usable without Commit

    Create_dup = Dup

    # -- attributes (erdmampi/attributes.py: mpi4py's callback rules) --------

    def _attr_table(self):
        table = self._r.__dict__.get("_attrs")
        if table is None:
            table = self._r._attrs = {}
        return table

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        """Create a new attribute key for datatypes, with optional copy and delete functions."""
        return _attributes.create_keyval("Datatype", copy_fn, delete_fn, nopython)

    @classmethod
    def Free_keyval(cls, keyval):
        """Free an attribute key for datatypes; returns `KEYVAL_INVALID`."""
        return _attributes.free_keyval("Datatype", keyval)

    def Get_attr(self, keyval):
        """The attribute value stored under ``keyval`` (None if not set)."""
        self._check()
        return _attributes.get("Datatype", self._attr_table(), keyval)

    def Set_attr(self, keyval, attrval):
        """Store an attribute value on the datatype under ``keyval``."""
        self._check()
        _attributes.set("Datatype", self, self._attr_table(), keyval, attrval)

    def Delete_attr(self, keyval):
        """Delete the attribute stored under ``keyval`` (its delete function runs)."""
        self._check()
        _attributes.delete("Datatype", self, self._attr_table(), keyval)

    def Create_contiguous(self, count):
        """Create a contiguous datatype."""
        self._check()
        count = _count(count)
        ext = self._extent
        return self._derived(COMBINER_CONTIGUOUS, ((), (), (count,), (self,)),
                             [(self, 0, count)],
                             lambda r=self._r: _lay(r).repeat([0], [count], ext))

    def _vector(self, combiner, count, blocklength, stride, step):
        self._check()
        count = _count(count)
        blocklength = _count(blocklength, "blocklength")
        stride = operator.index(stride)
        contents = ((), (), (count, blocklength, stride), (self,))
        ext = self._extent
        s = stride * step
        if count == 0:
            return _new_derived(combiner, contents, (self,), 0, 0, 0, 0, 0,
                                lambda: _tm.Layout([], [], []))
        # MPICH: the bounds of a vector follow from its first and last block,
        # even when the blocks are empty
        first, last = 0, (count - 1) * s
        lo, hi = min(first, last), max(first, last)
        span = (blocklength - 1) * ext
        lb = lo + self._lb + min(0, span)
        ub = hi + self._lb + ext + max(0, span)
        tlb = lo + self._tlb + min(0, span)
        tub = hi + self._tlb + self._textent + max(0, span)
        if blocklength == 0 or self._size == 0:
            tlb = tub = 0
        return _new_derived(
            combiner, contents, (self,), count * blocklength * self._size, lb, ub, tlb, tub,
            lambda r=self._r: _lay(r).repeat(
                np.arange(count, dtype=np.int64) * s, np.full(count, blocklength), ext))

    def Create_vector(self, count, blocklength, stride):
        """Create a vector (strided) datatype."""
        return self._vector(COMBINER_VECTOR, count, blocklength, stride, self._extent)

    def Create_hvector(self, count, blocklength, stride):
        """Create a vector (strided) datatype with stride in bytes."""
        return self._vector(COMBINER_HVECTOR, count, blocklength, stride, 1)

    def _indexed(self, combiner, blocklengths, displacements, step, single):
        self._check()
        if single is not None:
            disps = _getarray(displacements)
            n = len(disps)
            bl = _count(single, "blocklength")
            bls = [bl] * n
            counts = (n, bl, *disps)
        else:
            bls = _getarray(blocklengths)
            n = len(bls)
            disps = _chkarray(displacements, n)
            for b in bls:
                _count(b, "blocklength")
            counts = (n, *bls, *disps)
        ext = self._extent
        return self._derived(
            combiner, ((), (), counts, (self,)),
            [(self, d * step, b) for d, b in zip(disps, bls)],
            lambda r=self._r: _lay(r).repeat(np.asarray(disps, np.int64) * step, bls, ext))

    def Create_indexed(self, blocklengths, displacements):
        """Create an indexed datatype."""
        return self._indexed(COMBINER_INDEXED, blocklengths, displacements, self._extent, None)

    def Create_hindexed(self, blocklengths, displacements):
        """Create an indexed datatype (displacements in bytes)."""
        return self._indexed(COMBINER_HINDEXED, blocklengths, displacements, 1, None)

    def Create_indexed_block(self, blocklength, displacements):
        """Create an indexed datatype with constant-sized blocks."""
        return self._indexed(COMBINER_INDEXED_BLOCK, None, displacements, self._extent,
                             blocklength)

    def Create_hindexed_block(self, blocklength, displacements):
        """Create an indexed datatype with constant-sized blocks (bytes)."""
        return self._indexed(COMBINER_HINDEXED_BLOCK, None, displacements, 1, blocklength)

    @classmethod
    def Create_struct(cls, blocklengths, displacements, datatypes):
        """Create a general composite (struct) datatype."""
        bls = _getarray(blocklengths)
        n = len(bls)
        disps = _chkarray(displacements, n)
        types = list(datatypes)
        if len(types) != n:
            raise ValueError(f"expecting {n} items, got {len(types)}")
        for t in types:
            if not isinstance(t, Datatype):
                raise TypeError(f"expecting Datatype, got {type(t).__name__}")
            t._check()
        for b in bls:
            _count(b, "blocklength")
        types = tuple(types)
        recs = [t._r for t in types]

        def build():
            return _tm.Layout.concat([
                _lay(r).repeat([d], [b], r._extent)
                for r, d, b in zip(recs, disps, bls)])

        if not n:
            return _new_derived(COMBINER_STRUCT, ((), (), (0,), ()), (), 0, 0, 0, 0, 0,
                                lambda: _tm.Layout([], [], []))
        blocks = list(zip(types, disps, bls))
        new = types[0]._derived(COMBINER_STRUCT, ((), (), (n, *bls, *disps), types),
                                blocks, build, types)
        # MPICH pads the extent to the strictest alignment inside, unless the
        # upper bound comes from a resized type
        ub = new._lb + new._extent
        align, sticky = 1, False
        for t, d, b in blocks:
            if b <= 0:
                continue
            align = max(align, _alignment(t))
            if d + t._lb + t._extent + max(0, (b - 1) * t._extent) == ub and _sticky(t):
                sticky = True
        if not sticky and new._extent % align:
            new._extent += align - new._extent % align
        return new

    def _grid(self, combiner, contents, dims, total, size):
        """A datatype of the elements at sum(idx_d * stride_d) over ``dims``.

        ``dims``: the index sets [(indices, byte stride)], slowest first; the
        result is resized to (0, total).
        """
        t = Datatype(self)   # unaffected by a later Free of self
        if any(not idx for idx, _ in dims) or self._size == 0:
            tlb = tub = 0
            size = 0
        else:
            tlb = t._tlb + sum(min(i) * s for i, s in dims)
            tub = t._tlb + t._textent + sum(max(i) * s for i, s in dims)

        def build():
            lay = _lay(t._r)
            for idx, s in reversed(dims):
                lay = lay.repeat(np.asarray(idx, np.int64) * s, np.ones(len(idx), np.int64),
                                 t._extent)
            return lay

        return _new_derived(combiner, contents, (self,), size, 0, total, tlb, tub, build)

    def Create_subarray(self, sizes, subsizes, starts, order=ORDER_C):
        """Create a datatype for a subarray of a multidimensional array."""
        self._check()
        sizes = _getarray(sizes)
        ndims = len(sizes)
        subsizes = _chkarray(subsizes, ndims)
        starts = _chkarray(starts, ndims)
        order = operator.index(order)
        if order not in (ORDER_C, ORDER_FORTRAN):
            raise _arg_error(f"Invalid argument: order {order}")
        for n, m, s in zip(sizes, subsizes, starts):
            if n < 1 or m < 1 or m > n or s < 0 or s > n - m:
                raise _arg_error(
                    f"Invalid argument: size {n}, subsize {m}, start {s}")
        ext = self._extent
        strides = _strides(sizes, order, ext)
        dims = [(list(range(s, s + m)), st) for s, m, st in zip(starts, subsizes, strides)]
        if order == ORDER_FORTRAN:
            dims.reverse()
        total = ext
        for n in sizes:
            total *= n
        size = self._size
        for m in subsizes:
            size *= m
        contents = ((ndims, order), (), (*sizes, *subsizes, *starts), (self,))
        return self._grid(COMBINER_SUBARRAY, contents, dims, total, size)

    def Create_darray(self, size, rank, gsizes, distribs, dargs, psizes, order=ORDER_C):
        """Create a datatype for a distributed array on Cartesian process grids."""
        self._check()
        size, rank = operator.index(size), operator.index(rank)
        gsizes = _getarray(gsizes)
        ndims = len(gsizes)
        distribs = _chkarray(distribs, ndims)
        dargs = _chkarray(dargs, ndims)
        psizes = _chkarray(psizes, ndims)
        order = operator.index(order)
        if order not in (ORDER_C, ORDER_FORTRAN):
            raise _arg_error(f"Invalid argument: order {order}")
        nprocs = 1
        for p in psizes:
            nprocs *= p
        if size < 1 or nprocs != size or not 0 <= rank < size:
            raise _arg_error(f"Invalid argument: size {size}, rank {rank}, psizes {psizes}")
        # process grid coordinates are row-major whatever the array order
        coords, r = [], rank
        for p in reversed(psizes):
            coords.append(r % p)
            r //= p
        coords.reverse()
        idxs = []
        for g, dist, darg, p, c in zip(gsizes, distribs, dargs, psizes, coords):
            if dist == DISTRIBUTE_NONE or p == 1 and dist != DISTRIBUTE_CYCLIC:
                idxs.append(list(range(g)) if dist == DISTRIBUTE_NONE or c == 0 else [])
                if dist == DISTRIBUTE_NONE:
                    continue
            if dist == DISTRIBUTE_BLOCK:
                blk = -(-g // p) if darg == DISTRIBUTE_DFLT_DARG else darg
                if blk < 1 or blk * p < g:
                    raise _arg_error(f"Invalid argument: darg {darg}")
                if p != 1:
                    idxs.append(list(range(c * blk, min(g, (c + 1) * blk))))
                else:
                    idxs[-1] = list(range(min(g, blk)))
            elif dist == DISTRIBUTE_CYCLIC:
                blk = 1 if darg == DISTRIBUTE_DFLT_DARG else darg
                if blk < 1:
                    raise _arg_error(f"Invalid argument: darg {darg}")
                idxs.append([j for j in range(g) if (j // blk) % p == c])
            elif dist != DISTRIBUTE_NONE:
                raise _arg_error(f"Invalid argument: distrib {dist}")
        ext = self._extent
        strides = _strides(gsizes, order, ext)
        dims = list(zip(idxs, strides))
        if order == ORDER_FORTRAN:
            dims.reverse()
        total = ext
        for g in gsizes:
            total *= g
        nelem = 1
        for idx in idxs:
            nelem *= len(idx)
        contents = ((size, rank, ndims, *distribs, *dargs, *psizes, order), (),
                    tuple(gsizes), (self,))
        return self._grid(COMBINER_DARRAY, contents, dims, total, nelem * self._size)

    def Create_resized(self, lb, extent):
        """Create a datatype with a new lower bound and extent."""
        self._check()
        lb, extent = operator.index(lb), operator.index(extent)
        return _new_derived(COMBINER_RESIZED, ((), (), (lb, extent), (self,)), (self,),
                            self._size, lb, lb + extent, self._tlb,
                            self._tlb + self._textent, functools.partial(_lay, self._r))

    Resized = Create_resized

    @classmethod
    def Get_value_index(cls, value, index):
        """Return a predefined pair datatype."""
        value._check()
        index._check()
        pair = _VALUE_INDEX.get((value._handle, index._handle))
        return Datatype(DATATYPE_NULL if pair is None else PREDEFINED[pair])

    @classmethod
    def Create_f90_integer(cls, r):
        """Return a bounded integer datatype."""
        r = operator.index(r)
        for limit, size in ((2, 1), (4, 2), (9, 4), (18, 8)):
            if r <= limit:
                return _f90(COMBINER_F90_INTEGER, (r,), "i", size)
        raise _exc.Exception(_exc.ERR_OTHER,
                             f"No integer type with {r} digits of range is available")

    @classmethod
    def Create_f90_real(cls, p, r):
        """Return a bounded real datatype."""
        return _f90_float(COMBINER_F90_REAL, operator.index(p), operator.index(r), "real")

    @classmethod
    def Create_f90_complex(cls, p, r):
        """Return a bounded complex datatype."""
        return _f90_float(COMBINER_F90_COMPLEX, operator.index(p), operator.index(r),
                          "complex")

    @classmethod
    def Match_size(cls, typeclass, size):
        """Find a datatype matching a specified size in bytes."""
        typeclass, size = operator.index(typeclass), operator.index(size)
        if typeclass not in _MATCH:
            raise _arg_error("The value of typeclass is not one of MPI_TYPECLASS_REAL, "
                             "MPI_TYPECLASS_INTEGER, or MPI_TYPECLASS_COMPLEX")
        name = _MATCH[typeclass].get(size)
        if name is None:
            raise _arg_error(f"No MPI datatype available for typeclass {typeclass} "
                             f"and size {size}")
        return Datatype(PREDEFINED[name])

    # -- commit and free -------------------------------------------------

    def Commit(self):
        """Commit the datatype."""
        self._check()
        _UNCOMMITTED.discard(self._handle)
        return self

    def Free(self):
        """Free the datatype."""
        self._check()
        if self._combiner == COMBINER_NAMED:
            raise _type_error("Cannot free permanent data type")
        attrs = self._r.__dict__.get("_attrs")
        if attrs:
            _attributes.delete_all(self, attrs)
        _records.pop(self._handle, None)
        self._set_null()

    def free(self):
        """Free the datatype if it is not null.

        An object naming a predefined type (not the constant itself) just
        becomes null, as in mpi4py.
        """
        if self._handle == _NULL_HANDLE:
            return
        if self._predefined:
            if PREDEFINED.get(_NAME_OF.get(self._handle)) is not self:
                self._set_null()
            return
        self.Free()

    # -- naming ----------------------------------------------------------

    def Get_name(self):
        """Get the print name for this datatype."""
        if self._handle == _NULL_HANDLE:
            return "MPI_DATATYPE_NULL"
        return _NAMES.get(self._handle, self._name)

    def Set_name(self, name):
        """Set the print name for this datatype."""
        self._check()
        _NAMES[self._handle] = str(name)

    @property
    def name(self):
        """Print name."""
        return self.Get_name()

    @name.setter
    def name(self, value):
        self.Set_name(value)

    # -- pack and unpack ---------------------------------------------------

    def Pack(self, inbuf, outbuf, position, comm):
        """Pack into contiguous memory according to datatype."""
        from .packing import pack_native
        return pack_native(self, inbuf, outbuf, position, comm)

    def Unpack(self, inbuf, position, outbuf, comm):
        """Unpack from contiguous memory according to datatype."""
        from .packing import unpack_native
        return unpack_native(self, inbuf, position, outbuf, comm)

    def Pack_size(self, count, comm):
        """Determine the amount of space needed to pack a message."""
        from .packing import pack_size
        return pack_size(self, count, comm)

    def Pack_external(self, datarep, inbuf, outbuf, position):
        """Pack into contiguous memory (portable **external32** representation)."""
        from .packing import pack_external
        return pack_external(self, datarep, inbuf, outbuf, position)

    def Unpack_external(self, datarep, inbuf, position, outbuf):
        """Unpack from contiguous memory (portable **external32** representation)."""
        from .packing import unpack_external
        return unpack_external(self, datarep, inbuf, position, outbuf)

    def Pack_external_size(self, datarep, count):
        """Determine the amount of space needed to pack a message (external32)."""
        from .packing import pack_external_size
        return pack_external_size(self, datarep, count)

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

    def _get_layout(self):
        """The type map of one item (built once, shared by copies)."""
        return _lay(self._r)

    def _dense(self):
        """Items are stored exactly as packed: the buffer is used in place."""
        if self._combiner == COMBINER_NAMED or self._combiner in _F90:
            return self._size == self._extent and self._lb == 0
        if self._size != self._extent or self._lb != 0 or self._tlb != 0:
            return False
        lay = self._get_layout()
        return lay.off.size <= 1 and (lay.off.size == 0 or int(lay.off[0]) == 0)

    def _packs(self):
        """Messages of this type travel packed (see buffers._packed_message)."""
        comb = self._combiner
        return comb != COMBINER_NAMED and comb not in _F90 and not self._dense()

    def _wire(self):
        """The contiguous datatype of this type's packed bytes.

        What a packed message is, as far as transport and reductions see it.
        """
        w = self._wiretype
        if w is None:
            w = Datatype._make(
                _handle=_WIRE_HANDLE, _name="", _size=self._size, _lb=0,
                _extent=self._size, _tlb=0, _textent=self._size,
                np_dtype=self.np_dtype, _reduce_dtype=self._reduce_dtype,
                _combiner=COMBINER_CONTIGUOUS, _mult=self._mult,
                _base=self._base if self.np_dtype is not None else None,
            )
            self._wiretype = w
        return w


def _field(name):
    def fset(self, value):
        setattr(self._r, name, value)
    return property(operator.attrgetter("_r." + name), fset)


for _k in _FIELDS:
    setattr(Datatype, _k, _field(_k))
del _k

_WIRE_HANDLE = 0x4BFFFFFF   # stands for "packed bytes of a derived type"


def _lay(rec):
    """The layout of a datatype record, built on first use."""
    lay = rec._layout
    if lay is None:
        lay = rec._layout = rec._build()
    return lay


def _strides(sizes, order, ext):
    """Byte stride of each dimension of an array of ``sizes``."""
    strides = [0] * len(sizes)
    acc = ext
    dims = range(len(sizes) - 1, -1, -1) if order == ORDER_C else range(len(sizes))
    for k in dims:
        strides[k] = acc
        acc *= sizes[k]
    return strides


def _alignment(t):
    """Natural alignment of a datatype (x86-64), as MPICH pads structs."""
    rec = t._r
    a = rec._align
    if a is None:
        a = rec._align = _alignment_of(t)
    return a


def _alignment_of(t):
    comb = t._combiner
    if comb == COMBINER_NAMED or comb in _F90:
        if t._typechar in ("F", "D", "G") or "COMPLEX" in t._name:
            return max(1, t._size // 2)
        npd = t.np_dtype
        if npd is not None and npd.fields:
            return max(f.itemsize for f, _ in npd.fields.values())
        return min(max(t._size, 1), 16)
    return max([_alignment(x) for x in t._contents[3]] or [1])


def _sticky(t):
    """The bounds were set explicitly (resized somewhere inside)."""
    comb = t._combiner
    if comb in (COMBINER_RESIZED, COMBINER_SUBARRAY, COMBINER_DARRAY):
        return True
    if comb == COMBINER_NAMED or comb in _F90:
        return False
    return any(_sticky(x) for x in t._contents[3])


def _new_derived(combiner, contents, types, size, lb, ub, tlb, tub, build):
    """A derived datatype (uncommitted) with the given bounds."""
    base = None
    for t in types:
        b = t._base
        if b is None or b.np_dtype is None or b._size != b.np_dtype.itemsize:
            base = None
            break
        if base is None:
            base = b
        elif base._handle != b._handle:
            base = None
            break
    if base is not None and size % base._size == 0:
        npd, red, mult = base.np_dtype, base._reduce_dtype, size // base._size
    else:
        base, npd, red, mult = None, None, None, 1
    # contents keep their own references: freeing the arguments later must
    # not change what Get_contents returns
    contents = contents[:3] + (tuple(_ref(t) for t in contents[3]),)
    new = Datatype._make(
        _size=size, _lb=lb, _extent=ub - lb, _tlb=tlb, _textent=tub - tlb,
        np_dtype=npd, _reduce_dtype=red, _combiner=combiner, _mult=mult, _base=base,
        _contents=contents, _build=build,
    )
    _UNCOMMITTED.add(new._handle)
    return new


def _ref(t):
    """A datatype handed out by Get_contents: the predefined object itself,
    else a new reference to the same handle."""
    if t._combiner == COMBINER_NAMED:
        return t
    return Datatype(t)


def _datatype_create(datatype, combiner, params, free=False):
    """Create a datatype from a base datatype, a combiner name and parameters.

    Pickled derived datatypes are rebuilt with it.
    """
    if "datatypes" in params:
        temps = list(params["datatypes"])
    elif "value" in params and "index" in params:
        temps = [params["value"], params["index"]]
    else:
        temps = [datatype]
    try:
        name = combiner.lower()
        prefix = "Get" if name == "value_index" else "Create"
        factory = getattr(datatype, f"{prefix}_{name}")
        return factory(**params).Commit()
    finally:
        if free:
            for t in temps:
                if t and not t.is_predefined:
                    t.Free()


def _f90(combiner, ints, kind, size):
    chars = {"i": {1: "b", 2: "h", 4: "i", 8: "l"},
             "f": {4: "f", 8: "d"}, "c": {8: "F", 16: "D"}}
    tstr = f"{kind}{size}"
    base = {"i": {1: "INTEGER1", 2: "INTEGER2", 4: "INTEGER4", 8: "INTEGER8"},
            "f": {4: "REAL4", 8: "REAL8"}, "c": {8: "COMPLEX8", 16: "COMPLEX16"}}
    b = PREDEFINED[base[kind][size]]
    return Datatype._make(
        _name="", _size=size, _lb=0, _extent=size, _tlb=0, _textent=size,
        _typechar=chars[kind][size], _typestr=tstr, _code=tstr, np_dtype=b.np_dtype,
        _reduce_dtype=b._reduce_dtype, _combiner=combiner, _base=b,
        _contents=(ints, (), (), ()), _build=functools.partial(_lay, b._r),
    )


def _f90_float(combiner, p, r, what):
    mult = 1 if combiner == COMBINER_F90_REAL else 2
    for maxp, maxr, size in ((6, 37, 4), (15, 307, 8)):
        if p <= maxp and r <= maxr:
            return _f90(combiner, (p, r), "f" if mult == 1 else "c", size * mult)
    raise _exc.Exception(
        _exc.ERR_OTHER, f"No {what} type with both {p} digits of precision and an "
        f"exponent range of {r} is available")



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
    ("FLOAT16_T", "MPIX_C_FLOAT16", 2, 2, 2, "e", "f2", "e", "f2", None),
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


# -----------------------------------------------------------------------------
# Layouts of the predefined datatypes, names for pickling, lookup tables

def _leaf_fields(dt):
    npd = dt.np_dtype
    if npd is not None and npd.fields:
        return [(off, f.itemsize) for f, off in npd.fields.values()]
    return [(0, dt._size)]


def _init_layouts():
    seen = set()
    for dt in PREDEFINED.values():
        if id(dt) in seen:
            continue
        seen.add(id(dt))
        if dt._handle == _NULL_HANDLE:
            dt._build = lambda: _tm.Layout([], [], [])
            continue
        kind = _tm.register_kind(dt)
        dt._layout = _tm.Layout.leaf(kind, _leaf_fields(dt))


_init_layouts()

_NAME_OF = {}
for _n, _dt in PREDEFINED.items():
    _NAME_OF.setdefault(_dt._handle, _n)
_NAME_OF[_NULL_HANDLE] = "DATATYPE_NULL"

_VALUE_INDEX = {
    (PREDEFINED[v]._handle, PREDEFINED["INT"]._handle): p
    for v, p in (("SHORT", "SHORT_INT"), ("INT", "INT_INT"), ("LONG", "LONG_INT"),
                 ("FLOAT", "FLOAT_INT"), ("DOUBLE", "DOUBLE_INT"),
                 ("LONG_DOUBLE", "LONG_DOUBLE_INT"))
}

_MATCH = {
    TYPECLASS_REAL: {4: "REAL4", 8: "REAL8", 16: "REAL16"},
    TYPECLASS_INTEGER: {1: "INTEGER1", 2: "INTEGER2", 4: "INTEGER4", 8: "INTEGER8"},
    TYPECLASS_COMPLEX: {8: "COMPLEX8", 16: "COMPLEX16", 32: "COMPLEX32"},
    TYPECLASS_LOGICAL: {4: "LOGICAL"},
}


def _datatype_decode(datatype, mark=False):
    """Decode a datatype to base datatype, combiner name and parameters."""
    return datatype.decode()


def _typecode(datatype):
    """Character code or type string of a datatype, None if it has none."""
    try:
        return datatype.tocode()
    except ValueError:
        return None


def _typealign(datatype):
    """Alignment of a predefined datatype, None if unknown."""
    if datatype._handle == _NULL_HANDLE:
        return None
    if datatype._combiner != COMBINER_NAMED and datatype._combiner not in _F90:
        return None
    if datatype._typechar == "e":
        return 2
    if datatype._typechar in ("", "V") and not (datatype.np_dtype is not None
                                                and datatype.np_dtype.fields):
        return None
    return _alignment(datatype)
