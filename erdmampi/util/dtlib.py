"""Convert NumPy and MPI datatypes (``mpi4py.util.dtlib``)."""

from .. import MPI

try:
    from numpy import dtype as _np_dtype
except ImportError:  # pragma: no cover
    _np_dtype = None

__all__ = ["from_numpy_dtype", "to_numpy_dtype"]

_PAIRS = ("SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "LONG_DOUBLE")
_INDEXED = (MPI.COMBINER_INDEXED, MPI.COMBINER_HINDEXED,
            MPI.COMBINER_INDEXED_BLOCK, MPI.COMBINER_HINDEXED_BLOCK)
_F90 = (MPI.COMBINER_F90_INTEGER, MPI.COMBINER_F90_REAL, MPI.COMBINER_F90_COMPLEX)


def _release(types):
    for t in types:
        if not t.is_predefined:
            t.Free()


def _aligned(datatype, offset=0):
    """Every elementary entry of ``datatype`` placed at ``offset`` sits at
    a multiple of its natural alignment."""
    if datatype.is_predefined:
        if offset == 0:
            return True
        return offset % (MPI._typealign(datatype) or 0) == 0
    rec = datatype._r
    memo = rec.__dict__.get("_aligned_at")
    if memo is None:
        memo = rec._aligned_at = {}
    ok = memo.get(offset)
    if ok is None:
        ok = memo[offset] = _aligned_derived(datatype, offset)
    return ok


def _aligned_derived(datatype, offset):
    # the constructor arguments, read in place (no handles to free)
    comb = datatype._combiner
    _, _, c, d = datatype._contents
    if comb == MPI.COMBINER_RESIZED:
        parts = [(d[0], c[1])]
    elif comb == MPI.COMBINER_STRUCT:
        n = c[0]
        parts = list(zip(d, c[n + 1:2 * n + 1]))
    elif comb == MPI.COMBINER_HVECTOR:
        parts = [(d[0], c[2] if c[0] > 1 else 0)]
    elif comb == MPI.COMBINER_HINDEXED:
        n = c[0]
        parts = [(d[0], x) for x in c[n + 1:2 * n + 1]]
    elif comb == MPI.COMBINER_HINDEXED_BLOCK:
        parts = [(d[0], x) for x in c[2:c[0] + 2]]
    else:
        parts = [(d[0], 0)]
    return all(_aligned(t, offset + x) for t, x in parts)


# conversions already made: NumPy dtype -> private MPI datatype handed out
# as new handles, MPI type record -> NumPy dtype
_FROM = {}
_CACHE_MAX = 4096


def from_numpy_dtype(dtype):
    """Convert NumPy datatype to MPI datatype."""
    if _np_dtype is None:
        raise RuntimeError("NumPy is not available") from None
    dtype = _np_dtype(dtype)
    try:
        proto = _FROM.get(dtype)
    except TypeError:
        proto = None
    if proto is None:
        proto = _from_numpy(dtype)
        if len(_FROM) < _CACHE_MAX:
            _FROM[dtype] = proto
    return proto._clone()


def _from_numpy(dtype):
    if dtype.hasobject:
        raise ValueError("NumPy datatype with object entries")
    if not dtype.isnative:
        raise ValueError("NumPy datatype with non-native byteorder")
    if dtype.fields:
        members = []
        try:
            for name in dtype.names or ():
                ftype, fdisp = dtype.fields[name][:2]
                members.append((fdisp, from_numpy_dtype(ftype)))
            struct = MPI.Datatype.Create_struct(
                [1] * len(members), [d for d, _ in members], [t for _, t in members])
        finally:
            for _, t in members:
                t.Free()
        try:
            return struct.Create_resized(0, dtype.itemsize)
        finally:
            struct.Free()
    if dtype.subdtype:
        base, shape = dtype.subdtype
        elem = from_numpy_dtype(base)
        try:
            if len(shape) == 1:
                return elem.Create_contiguous(shape[0])
            return elem.Create_subarray(shape, shape, [0] * len(shape))
        finally:
            elem.Free()
    return MPI.Datatype.fromcode(dtype.char).Dup()


def _make(spec, **kw):
    if _np_dtype is None:
        return (spec, kw) if kw else spec
    return _np_dtype(spec, **kw)


def _record(names_count, formats, offsets, itemsize=None, aligned=True):
    spec = {"names": [f"f{i}" for i in range(names_count)], "formats": formats,
            "offsets": offsets}
    if itemsize is not None:
        spec["itemsize"] = itemsize
    spec["aligned"] = aligned
    return _make(spec)


def to_numpy_dtype(datatype):
    """Convert MPI datatype to NumPy datatype."""
    if datatype == MPI.DATATYPE_NULL:
        raise ValueError("cannot convert null MPI datatype to NumPy")
    if _np_dtype is None:
        return _to_numpy(datatype)
    rec = datatype._r
    dtype = rec.__dict__.get("_numpy")
    if dtype is None:
        dtype = rec._numpy = _to_numpy(datatype)
    return dtype


def _to_numpy(datatype):
    comb = datatype.combiner
    if comb == MPI.COMBINER_NAMED:
        code = MPI._typecode(datatype)
        if code is not None:
            return _make(code)
        pairs = [getattr(MPI, f"{n}_INT") for n in _PAIRS]
        value = getattr(MPI, _PAIRS[pairs.index(datatype)])
        return _make(f"{MPI._typecode(value)},i", align=True)

    base, _, info = datatype.decode()
    owned = [base]
    try:
        if comb == MPI.COMBINER_DUP:
            return to_numpy_dtype(base)
        if comb == MPI.COMBINER_CONTIGUOUS:
            return _make((to_numpy_dtype(base), (info["count"],)))
        if comb == MPI.COMBINER_SUBARRAY:
            sizes = info["sizes"]
            whole = info["subsizes"] == sizes and not any(info["starts"])
            if not whole:
                raise ValueError("cannot convert subarray MPI datatype to NumPy")
            if info["order"] == MPI.ORDER_FORTRAN:
                sizes = sizes[::-1]
            return _make((to_numpy_dtype(base), tuple(sizes)))
        if comb in _F90:
            owned = []
            return _make(MPI._typecode(datatype))

        aligned = True
        if comb == MPI.COMBINER_RESIZED and base.combiner == MPI.COMBINER_STRUCT:
            # a struct resized to its NumPy itemsize
            aligned = _aligned(base, info["extent"])
            comb = MPI.COMBINER_STRUCT
            info = base.decode()[2]
            owned = []
            _release([base])
        if comb == MPI.COMBINER_STRUCT:
            owned = list(info["datatypes"])
            formats = [to_numpy_dtype(t) if n == 1 else (to_numpy_dtype(t), n)
                       for t, n in zip(owned, info["blocklengths"])]
            offsets = info["displacements"]
            aligned = aligned and all(_aligned(t, d) for t, d in zip(owned, offsets))
            return _record(len(owned), formats, offsets, datatype.extent, aligned)
        if comb in (MPI.COMBINER_VECTOR, MPI.COMBINER_HVECTOR):
            elem = to_numpy_dtype(base)
            count, stride = info["count"], info["stride"]
            if comb == MPI.COMBINER_VECTOR:
                stride *= base.extent
                aligned = _aligned(base)
            else:
                stride = stride if count > 1 else 0
                aligned = _aligned(base, stride)
            return _record(count, [(elem, (info["blocklength"],))] * count,
                           [stride * k for k in range(count)], datatype.extent, aligned)
        if comb in _INDEXED:
            elem = to_numpy_dtype(base)
            disps = info["displacements"]
            if "blocklengths" in info:
                blens = info["blocklengths"]
            else:
                blens = [info["blocklength"]] * len(disps)
            aligned = _aligned(base)
            if comb in (MPI.COMBINER_HINDEXED, MPI.COMBINER_HINDEXED_BLOCK):
                step = 1
                aligned = aligned and all(_aligned(base, d) for d in disps)
            else:
                step = base.extent
            return _record(len(disps), [(elem, (n,)) for n in blens],
                           [d * step for d in disps], None, aligned)
        raise ValueError("cannot convert MPI datatype to NumPy")
    finally:
        _release(owned)
