"""CPU kernels of the lossy codecs (bf16, blockwise int8/int4), Numba @njit.

Private to :mod:`erdmampi.kernels.lossy`, which imports this module on first
use.  Every kernel works on the *payload* of the container (the bytes after
the block table) and writes exactly the bytes the CUDA twins in
:mod:`erdmampi.kernels._lossy_cuda` write, so either side decodes the other's
output.  Payload layout (see docs/lossy.md):

* bf16: element ``i`` at bytes ``2i, 2i+1`` (little-endian bfloat16).
* int8/int4: container block ``b`` (``block`` elements, all blocks but the
  last full) starts at ``b * full_pay``; it holds the float32 scales of its
  ``ng`` quantization groups (little-endian), then the codes: one byte per
  element (int8, two's complement) or one nibble per element (int4, two's
  complement, element ``2k`` in the low nibble of byte ``k``).

Values are first converted to float32 (``v = float32(x) + residual``); a
group with any non-finite ``v`` gets a NaN scale and zero codes, so it
decodes to NaN.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: groups whose absmax is below this are quantized after scaling by 2**100
#: (``qmax / absmax`` would overflow float32 otherwise); exact power-of-two
#: scaling, so the codes are the same as with unbounded float32 range.
TINY = np.float32(2.0 ** -100)
BIG = np.float32(2.0 ** 100)


@njit(cache=True, nogil=True)
def _rne(y):
    """Round a float32 to the nearest integer, ties to even (as float32)."""
    return np.rint(y)


# -- bf16 ----------------------------------------------------------------

@njit(cache=True, nogil=True)
def bf16_encode(src, res, use_res, out16, tmp):
    """bfloat16 (round to nearest even) of ``float32(src) + res`` into
    ``out16`` (uint16, len(src)); with ``use_res`` update ``res`` to
    ``v - decoded`` (0 where that is not finite).  Returns the number of
    non-finite ``v``.  ``tmp``: float32 scratch
    of at least 2*chunk elements."""
    n = src.size
    chunk = tmp.size // 2
    vals = tmp[:chunk]
    dec = tmp[chunk:2 * chunk]
    vbits = vals.view(np.uint32)
    dbits = dec.view(np.uint32)
    bad = 0
    for c0 in range(0, n, chunk):
        m = min(chunk, n - c0)
        if use_res:
            for j in range(m):
                vals[j] = np.float32(src[c0 + j]) + res[c0 + j]
        else:
            for j in range(m):
                vals[j] = np.float32(src[c0 + j])
        for j in range(m):
            u = vbits[j]
            bad += (u & np.uint32(0x7FFFFFFF)) >= np.uint32(0x7F800000)
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                h = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
            else:
                h = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            out16[c0 + j] = np.uint16(h)
            dbits[j] = h << np.uint32(16)
        if use_res:
            for j in range(m):
                r = vals[j] - dec[j]
                if not (abs(r) <= np.float32(3.4028235e38)):
                    r = np.float32(0.0)
                res[c0 + j] = r
    return bad


@njit(cache=True, nogil=True)
def bf16_decode(in16, out, accumulate, tmp):
    """Widen bfloat16 ``in16`` into ``out`` (float32/float64), or add it to
    ``out`` when ``accumulate``.  ``tmp``: float32 scratch (chunk)."""
    n = in16.size
    chunk = tmp.size
    tb = tmp.view(np.uint32)
    for c0 in range(0, n, chunk):
        m = min(chunk, n - c0)
        for j in range(m):
            tb[j] = np.uint32(in16[c0 + j]) << np.uint32(16)
        if accumulate:
            for j in range(m):
                out[c0 + j] += tmp[j]
        else:
            for j in range(m):
                out[c0 + j] = tmp[j]


# -- blockwise int8 / int4 ----------------------------------------------

@njit(cache=True, nogil=True)
def _put_f32(dst, pos, x, cell):
    cell[0] = x
    u = cell.view(np.uint32)[0]
    dst[pos] = np.uint8(u & np.uint32(0xFF))
    dst[pos + 1] = np.uint8((u >> np.uint32(8)) & np.uint32(0xFF))
    dst[pos + 2] = np.uint8((u >> np.uint32(16)) & np.uint32(0xFF))
    dst[pos + 3] = np.uint8(u >> np.uint32(24))


@njit(cache=True, nogil=True)
def _get_f32(src, pos, cell):
    cu = cell.view(np.uint32)
    cu[0] = (np.uint32(src[pos]) | (np.uint32(src[pos + 1]) << np.uint32(8))
             | (np.uint32(src[pos + 2]) << np.uint32(16))
             | (np.uint32(src[pos + 3]) << np.uint32(24)))
    return cell[0]


@njit(cache=True, nogil=True)
def quant_encode(src, res, use_res, block, group, bits, payload):
    """Blockwise absmax quantization of ``float32(src) + res`` into
    ``payload``; with ``use_res`` set ``res = v - decoded`` (0 in non-finite
    groups).  Returns the number of non-finite groups."""
    count = src.size
    qmax = np.float32(127.0) if bits == 8 else np.float32(7.0)
    gpb = block // group
    full_pay = gpb * 4 + (block if bits == 8 else block // 2)
    vals = np.empty(group, np.float32)
    vbits = vals.view(np.uint32)
    codes = np.empty(group, np.int32)
    cell = np.empty(1, np.float32)
    cellu = cell.view(np.uint32)
    nonfinite = 0
    nblocks = (count + block - 1) // block
    for b in range(nblocks):
        b0 = b * block
        nb = min(block, count - b0)
        ng = (nb + group - 1) // group
        pbase = b * full_pay
        dbase = pbase + 4 * ng
        for g in range(ng):
            e0 = b0 + g * group
            ne = min(group, count - e0)
            if use_res:
                for j in range(ne):
                    vals[j] = np.float32(src[e0 + j]) + res[e0 + j]
            else:
                for j in range(ne):
                    vals[j] = np.float32(src[e0 + j])
            mx = np.uint32(0)
            for j in range(ne):
                a = vbits[j] & np.uint32(0x7FFFFFFF)
                mx = max(mx, a)
            if mx >= np.uint32(0x7F800000):
                # NaN or Inf in the group: NaN scale, zero codes, drop residual
                nonfinite += 1
                _put_f32(payload, pbase + 4 * g, np.float32(np.nan), cell)
                if bits == 8:
                    for j in range(ne):
                        payload[dbase + g * group + j] = 0
                else:
                    for j in range((ne + 1) // 2):
                        payload[dbase + (g * group) // 2 + j] = 0
                if use_res:
                    for j in range(ne):
                        res[e0 + j] = np.float32(0.0)
                continue
            cellu[0] = mx
            amax = cell[0]
            scale = amax / qmax
            _put_f32(payload, pbase + 4 * g, scale, cell)
            if mx == 0:
                for j in range(ne):
                    codes[j] = 0
            elif amax < TINY:
                inv = qmax / (amax * BIG)
                for j in range(ne):
                    q = _rne((vals[j] * BIG) * inv)
                    q = min(max(q, -qmax), qmax)
                    codes[j] = np.int32(q)
            else:
                inv = qmax / amax
                for j in range(ne):
                    q = _rne(vals[j] * inv)
                    q = min(max(q, -qmax), qmax)
                    codes[j] = np.int32(q)
            if bits == 8:
                d0 = dbase + g * group
                for j in range(ne):
                    payload[d0 + j] = np.uint8(codes[j] & 0xFF)
            else:
                d0 = dbase + (g * group) // 2
                npair = ne // 2
                for k in range(npair):
                    payload[d0 + k] = np.uint8((codes[2 * k] & 0xF)
                                               | ((codes[2 * k + 1] & 0xF) << 4))
                if ne & 1:
                    payload[d0 + npair] = np.uint8(codes[ne - 1] & 0xF)
            if use_res:
                for j in range(ne):
                    res[e0 + j] = vals[j] - np.float32(codes[j]) * scale
    return nonfinite


@njit(cache=True, nogil=True)
def quant_decode(payload, count, block, group, bits, out, accumulate):
    """Dequantize ``count`` elements from ``payload`` into ``out``
    (float32/float64), or add them to ``out`` when ``accumulate``."""
    gpb = block // group
    full_pay = gpb * 4 + (block if bits == 8 else block // 2)
    cell = np.empty(1, np.float32)
    vals = np.empty(group, np.float32)
    nblocks = (count + block - 1) // block
    for b in range(nblocks):
        b0 = b * block
        nb = min(block, count - b0)
        ng = (nb + group - 1) // group
        pbase = b * full_pay
        dbase = pbase + 4 * ng
        for g in range(ng):
            e0 = b0 + g * group
            ne = min(group, count - e0)
            scale = _get_f32(payload, pbase + 4 * g, cell)
            if bits == 8:
                d0 = dbase + g * group
                for j in range(ne):
                    c = np.int32(payload[d0 + j])
                    c -= (c & 0x80) << 1
                    vals[j] = np.float32(c) * scale
            else:
                d0 = dbase + (g * group) // 2
                for j in range(ne):
                    c = np.int32(payload[d0 + (j >> 1)]) >> ((j & 1) * 4)
                    c &= 0xF
                    c -= (c & 0x8) << 1
                    vals[j] = np.float32(c) * scale
            if accumulate:
                for j in range(ne):
                    out[e0 + j] += vals[j]
            else:
                for j in range(ne):
                    out[e0 + j] = vals[j]


# -- checksum -------------------------------------------------------------

@njit(cache=True, nogil=True)
def checksum32(words, tail):
    """:func:`erdmampi.kernels.format.checksum32` of a byte buffer given as
    its whole little-endian u32 ``words`` and the 0..3 ``tail`` bytes."""
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    n = words.size
    for k in range(n):
        w = np.uint64(words[k])
        s1 += w
        s2 += np.uint64(k + 1) * w
    if tail.size:
        w = np.uint64(0)
        for j in range(tail.size):
            w |= np.uint64(tail[j]) << np.uint64(8 * j)
        s1 += w
        s2 += np.uint64(n + 1) * w
    h = s1 ^ (s2 << np.uint64(1))
    return (h ^ (h >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
