"""Codec ``raw`` (id 0): the bytes verbatim in the container.

Useful as the baseline and for data that does not compress: it costs one
copy and the checksum.  The payload is cut into a few large blocks (at most
64 MiB each, below the table's 28-bit size field), every one mode 0.

CPU and CUDA write the same bytes.  On the GPU only the header and table are
built on the host; the payload copy and its checksum run on the device.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from erdmampi.kernels import format as fmt
from erdmampi.kernels.codec import Codec, as_out, as_src
from erdmampi.kernels.format import HEADER_SIZE, CodecError

__all__ = ["Raw", "byte_dtype", "check_out_dtype", "host_bytes",
           "device_bytes", "is_device"]

#: largest raw block (bytes); the table's size field holds 28 bits
RAW_BLOCK_BYTES = 1 << 26


def byte_dtype(dtype) -> np.dtype:
    """The dtype recorded in the header: the array's own for the kinds the
    container names (``f i u b c``, native byte order), else raw bytes
    ``V<itemsize>`` (the round trip is still bit-exact)."""
    dt = np.dtype(dtype)
    if dt.kind in "fiubc" and dt.isnative and dt.itemsize > 0:
        return dt
    if dt.itemsize == 0:
        raise TypeError(f"cannot encode zero-size dtype {dt}")
    return np.dtype(f"V{dt.itemsize}")


def check_out_dtype(hdr_dtype: np.dtype, out_dtype: np.dtype) -> None:
    """Raise CodecError when ``out_dtype`` cannot hold the header's type."""
    if byte_dtype(out_dtype) != hdr_dtype:
        raise CodecError(f"output dtype {np.dtype(out_dtype)} does not match "
                         f"the encoded dtype {hdr_dtype}")


def host_bytes(src) -> tuple[np.ndarray, np.ndarray]:
    """(1-D contiguous array, its uint8 view) of a host array."""
    a = as_src(src)
    if a.dtype.itemsize == 0:
        raise TypeError(f"cannot encode zero-size dtype {a.dtype}")
    return a, a.view(np.uint8)


def is_device(x) -> bool:
    """True for Numba device arrays and CUDA-array-interface objects."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if isinstance(x, np.ndarray) or not hasattr(x, "copy_to_host"):
        return False
    try:
        from numba import config
        if config.ENABLE_CUDASIM:
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
            return isinstance(x, FakeCUDAArray)
    except ImportError:
        pass
    return False


def device_bytes(src):
    """(device array, its flat uint8 view) of a contiguous device array."""
    from numba import cuda
    if hasattr(src, "copy_to_host") and is_device(src):
        d = src
    else:
        d = cuda.as_cuda_array(src)
    if d.ndim != 1:
        if not d.is_c_contiguous():
            raise ValueError("device array must be C-contiguous")
        d = d.reshape(d.size)
    elif d.size > 1 and d.strides[0] != d.dtype.itemsize:
        raise ValueError("device array must be contiguous")
    if d.dtype.itemsize == 0:
        raise TypeError(f"cannot encode zero-size dtype {d.dtype}")
    return d, d.view(np.uint8)


def raw_geometry(count: int, itemsize: int, block_bytes: int = RAW_BLOCK_BYTES):
    """(block_elems, nblocks, last_bytes) for ``count`` elements."""
    be = max(1, block_bytes // itemsize)
    nb = 0 if count == 0 else -(-count // be)
    last = count * itemsize - (nb - 1) * be * itemsize if nb else 0
    return be, nb, last


class Raw(Codec):
    """Stores the bytes as they are (codec id 0)."""

    name = "raw"
    codec_id = 0
    lossless = True
    dtypes = None

    def __init__(self, block_bytes: int = RAW_BLOCK_BYTES):
        if not 1 <= block_bytes <= fmt.SIZE_MASK:
            raise ValueError(f"block_bytes {block_bytes} out of range")
        self.block_bytes = block_bytes

    def max_encoded_size(self, count: int, dtype) -> int:
        it = np.dtype(dtype).itemsize
        _, nb, _ = raw_geometry(count, it, self.block_bytes)
        return HEADER_SIZE + 4 * nb + count * it

    # Private

    def _head_table(self, dt: np.dtype, count: int, payload_sum: int):
        be, nb, last = raw_geometry(count, dt.itemsize, self.block_bytes)
        table = np.full(nb, be * dt.itemsize, dtype="<u4")
        if nb:
            table[-1] = last
        head = fmt.pack_header(self.codec_id, byte_dtype(dt), count, be, table,
                               payload_sum)
        return head, table

    def _check(self, hdr, table) -> None:
        it = hdr.dtype.itemsize
        if hdr.block_elems * it > fmt.SIZE_MASK:
            raise CodecError(f"raw block of {hdr.block_elems} elements too large")
        modes = table >> np.uint32(fmt.MODE_SHIFT)
        if np.any(modes != 0):
            raise CodecError("raw encoding with a non-raw block mode")
        sizes = (table & np.uint32(fmt.SIZE_MASK)).astype(np.int64)
        if hdr.nblocks:
            if np.any(sizes[:-1] != hdr.block_elems * it) or \
                    sizes[-1] != hdr.count * it - (hdr.nblocks - 1) * hdr.block_elems * it:
                raise CodecError("raw block sizes do not match the element count")

    # Public

    def encode(self, src, out: Optional[np.ndarray] = None, *, feedback=None):
        a, b = host_bytes(src)
        dt = a.dtype
        from erdmampi.kernels._checksum import checksum32
        head, table = self._head_table(dt, a.size, int(checksum32(b)))
        n = HEADER_SIZE + 4 * table.size + b.size
        o = as_out(out, n)
        o[:HEADER_SIZE] = np.frombuffer(head, np.uint8)
        o[HEADER_SIZE:HEADER_SIZE + 4 * table.size] = table.view(np.uint8)
        o[HEADER_SIZE + 4 * table.size:n] = b
        return o[:n]

    def decode(self, enc, out: Optional[np.ndarray] = None):
        hdr, table, payload = fmt.parse(enc, codec_id=self.codec_id,
                                        verify_payload=False)
        self._check(hdr, table)
        from erdmampi.kernels._checksum import checksum32
        if int(checksum32(_rw(payload))) != hdr.payload_sum:
            raise CodecError("payload checksum mismatch (corrupt data)")
        o = _host_out(hdr, out)
        o.view(np.uint8)[:] = payload
        return o

    def encode_cuda(self, src, out=None, *, stream=0, feedback=None):
        """Encode a device array.  The result lives where ``out`` lives:
        ``out=None`` or a host array -> a host uint8 view (only the encoding
        crosses to the host); a device ``out`` -> a device uint8 view."""
        from numba import cuda
        from erdmampi.kernels._checksum import checksum32_cuda
        d, db = device_bytes(src)
        payload_sum = checksum32_cuda(db, stream)
        head, table = self._head_table(np.dtype(d.dtype), d.size, payload_sum)
        hs = HEADER_SIZE + 4 * table.size
        n = hs + db.size
        front = np.concatenate([np.frombuffer(head, np.uint8), table.view(np.uint8)])
        if out is not None and is_device(out):
            o = device_bytes(out)[1]
            if o.size < n:
                raise ValueError(f"output buffer too small: {o.size} < {n} bytes")
            o[:hs].copy_to_device(front, stream=stream)
            if db.size:
                o[hs:n].copy_to_device(db, stream=stream)
            return o[:n]
        o = as_out(out, n)
        o[:hs] = front
        if db.size:
            db.copy_to_host(o[hs:n], stream=stream)
        if stream:
            stream.synchronize()
        return o[:n]

    def decode_cuda(self, enc, out=None, *, stream=0):
        """Decode onto the device (``enc`` on the host or the device);
        returns the device array (``out`` or a new one of the header's
        dtype; raw-byte dtypes come back as uint8)."""
        from numba import cuda
        from erdmampi.kernels._checksum import checksum32_cuda
        hdr, table, payload, dpay = _parse_any(enc, self.codec_id, stream)
        self._check(hdr, table)
        o, ob = _device_out(hdr, out, stream)
        if dpay is None:
            dpay = cuda.to_device(payload, stream=stream) if payload.size else None
        if dpay is not None and dpay.size:
            if checksum32_cuda(dpay, stream) != hdr.payload_sum:
                raise CodecError("payload checksum mismatch (corrupt data)")
            ob.copy_to_device(dpay, stream=stream)
        elif hdr.payload_sum != 0:
            raise CodecError("payload checksum mismatch (corrupt data)")
        if stream:
            stream.synchronize()
        return o


# -- helpers shared with the other codecs ---------------------------------

class _Keep:
    """Owner of a writable-typed view of a read-only buffer (see _rw)."""

    def __init__(self, a: np.ndarray):
        self.keep = a
        self.__array_interface__ = {
            "data": (a.__array_interface__["data"][0], False),
            "shape": a.shape, "typestr": a.dtype.str, "version": 3}


def _rw(a: np.ndarray) -> np.ndarray:
    """``a`` itself when writable, else a writable-typed view of the same
    memory (no copy).  The decoder only reads it; this spares Numba a
    second compilation of every mode decoder for read-only arrays (an
    encoding received as ``bytes``)."""
    if a.flags.writeable or a.size == 0:
        return a
    return np.asarray(_Keep(a))



def _host_out(hdr, out) -> np.ndarray:
    """The host output array for a parsed header (checked or allocated)."""
    if out is None:
        return np.empty(hdr.count, dtype=hdr.dtype)
    o = np.asarray(out)
    check_out_dtype(hdr.dtype, o.dtype)
    if not o.flags.c_contiguous:
        raise ValueError("output array must be C-contiguous")
    if o.size != hdr.count:
        raise CodecError(f"output has {o.size} elements, encoding has {hdr.count}")
    if not o.flags.writeable:
        raise ValueError("output array is read-only")
    return o.reshape(-1)


def _device_out(hdr, out, stream=0):
    """(device output array, its uint8 view) for a parsed header."""
    from numba import cuda
    if out is None:
        dt = hdr.dtype if hdr.dtype.kind != "V" else np.dtype(np.uint8)
        n = hdr.count if hdr.dtype.kind != "V" else hdr.count * hdr.dtype.itemsize
        o = cuda.device_array(n, dtype=dt, stream=stream)
        return o, o.view(np.uint8)
    o, ob = device_bytes(out)
    if np.dtype(o.dtype).kind == "u" and o.dtype.itemsize == 1 \
            and hdr.dtype.kind == "V":
        if ob.size != hdr.count * hdr.dtype.itemsize:
            raise CodecError(f"output has {ob.size} bytes, encoding has "
                             f"{hdr.count * hdr.dtype.itemsize}")
        return o, ob
    check_out_dtype(hdr.dtype, np.dtype(o.dtype))
    if o.size != hdr.count:
        raise CodecError(f"output has {o.size} elements, encoding has {hdr.count}")
    return o, ob


def _parse_any(enc, codec_id, stream=0, verify_payload=False):
    """Parse an encoding on the host or the device.  Returns (header, table,
    host payload or None, device payload or None); for a device encoding only
    the header and table are copied to the host."""
    if is_device(enc):
        from numba import cuda
        _, eb = device_bytes(enc)
        if eb.size < HEADER_SIZE:
            raise CodecError(f"encoded buffer truncated: {eb.size} bytes, "
                             f"header needs {HEADER_SIZE}")
        head = eb[:HEADER_SIZE].copy_to_host(stream=stream)
        if stream:
            stream.synchronize()
        nb = int(head[20:24].view("<u4")[0])
        tend = HEADER_SIZE + 4 * nb
        if nb > (eb.size - HEADER_SIZE) // 4:
            raise CodecError(f"encoded buffer truncated in the block table "
                             f"({eb.size} < {tend} bytes)")
        plen = int(head[24:32].view("<u8")[0])
        if eb.size < tend + plen:
            raise CodecError(f"encoded buffer truncated: {eb.size} bytes, "
                             f"needs {tend + plen}")
        # parse() validates header + table; the payload stays on the device,
        # so it sees an uninitialised host stand-in of the announced length
        # (np.empty: pages never touched) and does not checksum it
        front = np.empty(tend + plen, np.uint8)
        eb[:tend].copy_to_host(front[:tend], stream=stream)
        if stream:
            stream.synchronize()
        hdr, table, _ = fmt.parse(front, codec_id=codec_id, verify_payload=False)
        return hdr, table.copy(), None, eb[tend:tend + hdr.payload_len]
    hdr, table, payload = fmt.parse(enc, codec_id=codec_id,
                                    verify_payload=verify_payload)
    return hdr, table, payload, None
