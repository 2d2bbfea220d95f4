"""MPI_Pack/MPI_Unpack and their external32 forms (``Datatype.Pack`` ...).

The native packed form is the type map's bytes in order, with no header
(MPICH's ``Pack_size`` overhead is 0).  external32 is big-endian with the
standard's sizes: ``long`` and ``unsigned long`` take 4 bytes, ``wchar_t``
2; MPICH has no external32 form for the pair types and ``MPIX_C_FLOAT16``
(their external size is 0), nor do we.
"""

import numpy as np

from . import exceptions as _exc
from . import typemap as _tm
from .buffers import getbuffer

__all__ = ["pack_native", "unpack_native", "pack_size", "pack_external",
           "unpack_external", "pack_external_size", "pack_into", "unpack_from"]


def _extent(datatype):
    datatype._check()
    return datatype._extent


def _committed(datatype):
    if not datatype._is_committed():
        raise _exc.Exception(_exc.ERR_TYPE, "Datatype has not been committed")


def _items(datatype, length):
    """Whole items of ``datatype`` a buffer of ``length`` bytes holds."""
    ext = datatype._extent
    return length // ext if ext > 0 else 0


def _check_span(datatype, count, length, what):
    """The ``count`` items starting at byte 0 stay inside ``length`` bytes."""
    if count <= 0 or datatype._size == 0:
        return
    lo = datatype._tlb + min(0, (count - 1) * datatype._extent)
    hi = datatype._tlb + datatype._textent + max(0, (count - 1) * datatype._extent)
    if lo < 0 or hi > length:
        raise _exc.Exception(_exc.ERR_BUFFER,
                             f"{what}: {count} items of the datatype do not fit "
                             f"in a buffer of {length} bytes")


def pack_into(datatype, count, src, base, out, outpos):
    """Pack ``count`` items at ``src[base:]`` (uint8) into ``out[outpos:]``."""
    if count <= 0 or datatype._size == 0:
        return outpos
    return _tm.pack(datatype._get_layout(), count, datatype._extent, src, base, out, outpos)


def unpack_from(datatype, count, packed, inpos, dst, base):
    """Unpack ``count`` items from ``packed[inpos:]`` into ``dst[base:]``."""
    if count <= 0 or datatype._size == 0:
        return inpos
    return _tm.unpack(datatype._get_layout(), count, datatype._extent, packed, inpos,
                      dst, base)


def pack_native(datatype, inbuf, outbuf, position, comm):
    _extent(datatype)
    _committed(datatype)
    src = getbuffer(inbuf, True).raw
    out = getbuffer(outbuf, False).raw
    position = int(position)
    count = _items(datatype, src.size)
    _check_span(datatype, count, src.size, "MPI_Pack")
    need = count * datatype._size
    if position < 0 or position + need > out.size:
        raise _exc.Exception(_exc.ERR_TRUNCATE,
                             f"MPI_Pack: {need} bytes at position {position} do not fit "
                             f"in an output buffer of {out.size} bytes")
    return pack_into(datatype, count, src, 0, out, position)


def unpack_native(datatype, inbuf, position, outbuf, comm):
    _extent(datatype)
    _committed(datatype)
    src = getbuffer(inbuf, True).raw
    out = getbuffer(outbuf, False).raw
    position = int(position)
    count = _items(datatype, out.size)
    _check_span(datatype, count, out.size, "MPI_Unpack")
    need = count * datatype._size
    if position < 0 or position + need > src.size:
        raise _exc.Exception(_exc.ERR_TRUNCATE,
                             f"MPI_Unpack: {need} bytes at position {position} are "
                             f"past the end of an input buffer of {src.size} bytes")
    return unpack_from(datatype, count, src, position, out, 0)


def pack_size(datatype, count, comm):
    datatype._check()
    _committed(datatype)
    count = int(count)
    if count < 0:
        raise _exc.Exception(_exc.ERR_COUNT, f"Negative count, value is {count}")
    return count * datatype._size


# -- external32 --------------------------------------------------------------

_NO_EXT32 = ("MPI_SHORT_INT", "MPI_2INT", "MPI_LONG_INT", "MPI_FLOAT_INT",
             "MPI_DOUBLE_INT", "MPI_LONG_DOUBLE_INT")
_CONV = {}    # kind -> (native item size, external item size, to_ext, from_ext)


def _conv(kind):
    c = _CONV.get(kind)
    if c is None:
        c = _CONV[kind] = _make_conv(_tm.KINDS[kind])
    return c


def _swap(n):
    def swap(b):
        return b.reshape(-1, n)[:, ::-1].ravel()
    return swap


def _make_conv(dt):
    size = dt._size
    name = dt._name
    npd = dt.np_dtype
    if name in _NO_EXT32 or dt._typechar == "e" or size == 0:
        return (size, 0, None, None)
    if name in ("MPI_LONG", "MPI_UNSIGNED_LONG", "MPI_WCHAR"):
        nat = {"MPI_LONG": "<i8", "MPI_UNSIGNED_LONG": "<u8", "MPI_WCHAR": "<u4"}[name]
        ext = {"MPI_LONG": ">i4", "MPI_UNSIGNED_LONG": ">u4", "MPI_WCHAR": ">u2"}[name]
        return (size, np.dtype(ext).itemsize,
                lambda b: b.view(nat).astype(ext).view(np.uint8),
                lambda b: b.view(ext).astype(nat).view(np.uint8))
    unit = size
    if npd is not None and npd.kind == "c" or "COMPLEX" in name:
        unit = size // 2
    if unit <= 1:
        return (size, size, lambda b: b, lambda b: b)
    return (size, size, _swap(unit), _swap(unit))


def _ext_runs(datatype, count):
    starts, lens, kinds = _tm.kind_runs(datatype._get_layout(), count, datatype._extent)
    return zip(starts.tolist(), lens.tolist(), kinds.tolist())


def _ext_size(datatype, count):
    total = 0
    lay = datatype._get_layout()
    for ln, kind in zip(lay.ln.tolist(), lay.kind.tolist()):
        nsize, esize, _, _ = _conv(kind)
        total += ln // nsize * esize
    return total * count


def pack_external_size(datatype, datarep, count):
    datatype._check()
    count = int(count)
    if count < 0:
        raise _exc.Exception(_exc.ERR_COUNT, f"Negative count, value is {count}")
    return _ext_size(datatype, count)


def pack_external(datatype, datarep, inbuf, outbuf, position):
    _extent(datatype)
    _committed(datatype)
    src = getbuffer(inbuf, True).raw
    out = getbuffer(outbuf, False).raw
    pos = int(position)
    count = _items(datatype, src.size)
    _check_span(datatype, count, src.size, "MPI_Pack_external")
    if pos < 0 or pos + _ext_size(datatype, count) > out.size:
        raise _exc.Exception(_exc.ERR_TRUNCATE, "MPI_Pack_external: output buffer too small")
    if count <= 0:
        return pos
    for s, n, kind in _ext_runs(datatype, count):
        nsize, esize, to_ext, _ = _conv(kind)
        if not esize:
            continue
        data = to_ext(np.ascontiguousarray(src[s:s + n]))
        out[pos:pos + data.size] = data
        pos += data.size
    return pos


def unpack_external(datatype, datarep, inbuf, position, outbuf):
    _extent(datatype)
    _committed(datatype)
    src = getbuffer(inbuf, True).raw
    out = getbuffer(outbuf, False).raw
    pos = int(position)
    count = _items(datatype, out.size)
    _check_span(datatype, count, out.size, "MPI_Unpack_external")
    if pos < 0 or pos + _ext_size(datatype, count) > src.size:
        raise _exc.Exception(_exc.ERR_TRUNCATE, "MPI_Unpack_external: input buffer too short")
    if count <= 0:
        return pos
    for s, n, kind in _ext_runs(datatype, count):
        nsize, esize, _, from_ext = _conv(kind)
        if not esize:
            continue
        m = n // nsize * esize
        out[s:s + n] = from_ext(np.ascontiguousarray(src[pos:pos + m]))
        pos += m
    return pos
