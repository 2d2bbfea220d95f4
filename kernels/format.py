"""The self-describing container every codec writes (numpy only; no Numba).

An encoded buffer is::

    header (48 bytes, little-endian)
    block table: nblocks x u32   (bits 0..27: encoded bytes of the block,
                                  bits 28..31: the block's mode)
    block payloads, back to back, in block order

Header fields:

====== ====== =============================================================
offset bytes  field
====== ====== =============================================================
0      4      magic ``b"ERZ1"``
4      1      format version (1)
5      1      codec id (see :mod:`erdmampi.kernels` registry)
6      1      dtype kind, ``ord`` of numpy's ``dtype.kind`` (``f i u b c V``)
7      1      dtype itemsize in bytes
8      8      element count
16     4      elements per block (the last block may be shorter)
20     4      number of blocks (``ceil(count / block_elems)``; 0 if count 0)
24     8      payload bytes (sum of the table's sizes)
32     4      codec parameter (codec-specific, e.g. lossy bit width)
36     4      payload checksum: :func:`checksum32` of the payload bytes
40     4      table checksum: :func:`checksum32` of header[0:40] + table
44     4      reserved, 0
====== ====== =============================================================

The decoder validates every field before touching the payload, so a corrupt
or truncated buffer raises :class:`CodecError` and never makes a kernel read
or write out of bounds.  Checksums are position-dependent sums over u32
words (computable as a parallel reduction on a GPU); they catch corruption,
not tampering (QUIC's AEAD protects the wire).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["MAGIC", "VERSION", "HEADER_SIZE", "MODE_BITS", "SIZE_MASK",
           "CodecError", "Header", "pack_header", "parse", "checksum32",
           "dtype_code", "code_dtype", "table_entry"]

MAGIC = b"ERZ1"
VERSION = 1
HEADER_SIZE = 48
_HDR = struct.Struct("<4sBBBBQIIQIII4x")
assert _HDR.size == HEADER_SIZE
MODE_SHIFT = 28
MODE_BITS = 0xF
SIZE_MASK = (1 << MODE_SHIFT) - 1


class CodecError(ValueError):
    """Encoded data is corrupt, truncated, or does not match the output."""


@dataclass(frozen=True)
class Header:
    """Decoded container header."""
    #: codec id from the registry
    codec_id: int
    #: numpy dtype of the elements
    dtype: np.dtype
    #: number of elements
    count: int
    #: elements per block
    block_elems: int
    #: number of blocks
    nblocks: int
    #: payload bytes after the table
    payload_len: int
    #: codec-specific parameter
    param: int
    #: payload checksum
    payload_sum: int

    @property
    def table_offset(self) -> int:
        return HEADER_SIZE

    @property
    def payload_offset(self) -> int:
        return HEADER_SIZE + 4 * self.nblocks

    @property
    def total_size(self) -> int:
        return self.payload_offset + self.payload_len


def dtype_code(dtype) -> tuple[int, int]:
    """(kind byte, itemsize) for a numpy dtype."""
    dt = np.dtype(dtype)
    return ord(dt.kind), dt.itemsize


def code_dtype(kind: int, itemsize: int) -> np.dtype:
    """Inverse of :func:`dtype_code`; raw bytes for kinds without a numpy
    type of that size."""
    k = chr(kind)
    if k not in "fiubcV" or itemsize == 0:
        raise CodecError(f"bad dtype code kind={kind} itemsize={itemsize}")
    if k == "V":
        return np.dtype(f"V{itemsize}")
    if k == "b":
        return np.dtype(np.bool_)
    try:
        return np.dtype(f"<{k}{itemsize}")
    except TypeError:
        raise CodecError(f"bad dtype code {k}{itemsize}") from None


def checksum32(data) -> int:
    """Position-dependent checksum of a byte buffer (pads to 4 bytes).

    ``s1 = sum(w_i)``, ``s2 = sum((i + 1) * w_i)`` over little-endian u32
    words, both mod 2**64; the result folds ``s1 ^ (s2 << 1)`` to 32 bits.
    Numba kernels compute the same value (``kernels/_checksum.py``)."""
    b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    pad = (-b.size) % 4
    if pad:
        b = np.concatenate([b, np.zeros(pad, np.uint8)])
    w = b.view("<u4").astype(np.uint64)
    with np.errstate(over="ignore"):
        s1 = int(w.sum(dtype=np.uint64))
        idx = np.arange(1, w.size + 1, dtype=np.uint64)
        s2 = int((idx * w).sum(dtype=np.uint64))
    h = (s1 ^ (s2 << 1)) & 0xFFFFFFFFFFFFFFFF
    return (h ^ (h >> 32)) & 0xFFFFFFFF


def table_entry(size: int, mode: int) -> int:
    """A block-table word: encoded size and mode."""
    if not 0 <= size <= SIZE_MASK or not 0 <= mode <= MODE_BITS:
        raise ValueError(f"block size {size} or mode {mode} out of range")
    return (mode << MODE_SHIFT) | size


def pack_header(codec_id: int, dtype, count: int, block_elems: int,
                table: np.ndarray, payload_sum: int, param: int = 0) -> bytes:
    """Header bytes for a finished encoding whose block table is ``table``
    (u32 array).  Computes payload_len and the table checksum."""
    kind, itemsize = dtype_code(dtype)
    table = np.ascontiguousarray(table, dtype="<u4")
    payload_len = int((table & np.uint32(SIZE_MASK)).astype(np.uint64).sum())
    head = _HDR.pack(MAGIC, VERSION, codec_id, kind, itemsize, count,
                     block_elems, table.size, payload_len, param, payload_sum,
                     0)
    tsum = checksum32(head[:40] + table.tobytes())
    return head[:40] + struct.pack("<I", tsum) + head[44:]


def parse(enc, *, codec_id: int | None = None, verify_payload: bool = True
          ) -> tuple[Header, np.ndarray, np.ndarray]:
    """Validate an encoded buffer; return (header, table u32, payload u8).

    Raises :class:`CodecError` on any inconsistency: bad magic or version,
    wrong codec, impossible block geometry, checksum mismatch, truncation.
    Bytes past the end of the encoding are ignored (buffers may be padded).
    """
    b = np.frombuffer(memoryview(enc).cast("B"), dtype=np.uint8)
    if b.size < HEADER_SIZE:
        raise CodecError(f"encoded buffer truncated: {b.size} bytes, "
                         f"header needs {HEADER_SIZE}")
    (magic, version, cid, kind, itemsize, count, block_elems, nblocks,
     payload_len, param, payload_sum, tsum) = _HDR.unpack(b[:HEADER_SIZE].tobytes())
    if magic != MAGIC:
        raise CodecError(f"not an erdmampi encoding (magic {magic!r})")
    if version != VERSION:
        raise CodecError(f"unsupported format version {version}")
    if codec_id is not None and cid != codec_id:
        raise CodecError(f"encoded with codec id {cid}, expected {codec_id}")
    dtype = code_dtype(kind, itemsize)
    if count and block_elems == 0:
        raise CodecError("zero block size")
    want_blocks = 0 if count == 0 else -(-count // block_elems)
    if nblocks != want_blocks:
        raise CodecError(f"{nblocks} blocks for {count} elements of "
                         f"{block_elems} per block")
    tend = HEADER_SIZE + 4 * nblocks
    if b.size < tend:
        raise CodecError(f"encoded buffer truncated in the block table "
                         f"({b.size} < {tend} bytes)")
    table = b[HEADER_SIZE:tend].view("<u4")
    if checksum32(b[:40].tobytes() + b[HEADER_SIZE:tend].tobytes()) != tsum:
        raise CodecError("header/table checksum mismatch (corrupt data)")
    sizes = (table & np.uint32(SIZE_MASK)).astype(np.int64)
    if int(sizes.sum()) != payload_len:
        raise CodecError("block sizes do not add up to the payload length")
    if b.size < tend + payload_len:
        raise CodecError(f"encoded buffer truncated: {b.size} bytes, "
                         f"needs {tend + payload_len}")
    payload = b[tend:tend + payload_len]
    if verify_payload and checksum32(payload) != payload_sum:
        raise CodecError("payload checksum mismatch (corrupt data)")
    hdr = Header(cid, dtype, count, block_elems, nblocks, payload_len, param,
                 payload_sum)
    return hdr, table, payload
