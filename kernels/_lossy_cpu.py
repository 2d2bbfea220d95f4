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
from numba import njit, types
from numba.core.extending import intrinsic

#: groups whose absmax is below this are quantized after scaling by 2**100
#: (``qmax / absmax`` would overflow float32 otherwise); exact power-of-two
#: scaling, so the codes are the same as with unbounded float32 range.
TINY = np.float32(2.0 ** -100)
BIG = np.float32(2.0 ** 100)


@intrinsic
def _f2u(typingctx, x):
    """The IEEE bits of a float32 as a uint32 (a register bitcast)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))
    return types.uint32(types.float32), codegen


@intrinsic
def _u2f(typingctx, u):
    """The float32 whose IEEE bits are the low 32 bits of the integer ``u``."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        i32 = context.get_value_type(types.uint32)
        if u.bitwidth > 32:
            v = builder.trunc(v, i32)
        elif u.bitwidth < 32:
            v = builder.zext(v, i32)
        return builder.bitcast(v, context.get_value_type(types.float32))
    return types.float32(u), codegen


@njit(cache=True, nogil=True)
def _rne(y):
    """Round a float32 to the nearest integer, ties to even (as float32)."""
    return np.rint(y)


# -- bf16 ----------------------------------------------------------------

@njit(cache=True, nogil=True)
def _bf16(u):
    """bfloat16 bits of float32 bits ``u``: round to nearest even, NaN quiet."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@njit(cache=True, nogil=True)
def bf16_encode(src, res, use_res, out16):
    """bfloat16 (round to nearest even) of ``float32(src) + res`` into
    ``out16`` (uint16, len(src)); with ``use_res`` update ``res`` to
    ``v - decoded`` (0 where that is not finite).  Returns the number of
    non-finite ``v``."""
    bad = 0
    lim = np.float32(3.4028235e38)
    if use_res:
        for j in range(src.size):
            v = np.float32(src[j]) + res[j]
            u = _f2u(v)
            bad += (u & np.uint32(0x7FFFFFFF)) >= np.uint32(0x7F800000)
            h = _bf16(u)
            out16[j] = np.uint16(h)
            r = v - _u2f(h << np.uint32(16))
            res[j] = r if abs(r) <= lim else np.float32(0.0)
    else:
        for j in range(src.size):
            u = _f2u(np.float32(src[j]))
            bad += (u & np.uint32(0x7FFFFFFF)) >= np.uint32(0x7F800000)
            out16[j] = np.uint16(_bf16(u))
    return bad


@njit(cache=True, nogil=True)
def bf16_decode(in16, out, accumulate):
    """Widen bfloat16 ``in16`` into ``out`` (float32/float64), or add it to
    ``out`` when ``accumulate``."""
    if accumulate:
        for j in range(in16.size):
            out[j] += _u2f(np.uint32(in16[j]) << np.uint32(16))
    else:
        for j in range(in16.size):
            out[j] = _u2f(np.uint32(in16[j]) << np.uint32(16))


# -- blockwise int8 / int4 ----------------------------------------------

@njit(cache=True, nogil=True)
def _put_f32(dst, pos, x):
    u = _f2u(x)
    dst[pos] = np.uint8(u & np.uint32(0xFF))
    dst[pos + 1] = np.uint8((u >> np.uint32(8)) & np.uint32(0xFF))
    dst[pos + 2] = np.uint8((u >> np.uint32(16)) & np.uint32(0xFF))
    dst[pos + 3] = np.uint8(u >> np.uint32(24))


@njit(cache=True, nogil=True)
def _get_f32(src, pos):
    return _u2f(np.uint32(src[pos]) | (np.uint32(src[pos + 1]) << np.uint32(8))
                | (np.uint32(src[pos + 2]) << np.uint32(16))
                | (np.uint32(src[pos + 3]) << np.uint32(24)))


@njit(cache=True, nogil=True)
def _dq(q, scale):
    """Decoded value ``q * scale``, clamped to the float32 range (with
    absmax near the float32 maximum, ``qmax * (absmax / qmax)`` can round
    past it); NaN scales stay NaN."""
    v = q * scale
    lim = np.float32(3.4028235e38)
    v = lim if v > lim else v
    v = -lim if v < -lim else v
    return v


@njit(cache=True, nogil=True)
def _group_scale(mx, qmax):
    """(scale, pre, inv, ok) for a group whose largest ``|v|`` has the
    float32 bits ``mx``: codes are ``rint((v * pre) * inv)``; ok is False
    when the group holds NaN or Inf (scale NaN, codes 0)."""
    one = np.float32(1.0)
    zero = np.float32(0.0)
    if mx >= np.uint32(0x7F800000):
        return np.float32(np.nan), one, zero, False
    if mx == 0:
        return zero, one, zero, True
    amax = _u2f(mx)
    if amax < TINY:
        return amax / qmax, BIG, qmax / (amax * BIG), True
    return amax / qmax, one, qmax / amax, True


@njit(cache=True, nogil=True)
def quant_encode(src, res, use_res, block, group, bits, payload):
    """Blockwise absmax quantization of ``float32(src) + res`` into
    ``payload``; with ``use_res`` set ``res = v - decoded`` (0 in non-finite
    groups).  Returns the number of non-finite groups."""
    count = src.size
    qmax = np.float32(127.0) if bits == 8 else np.float32(7.0)
    nq = -qmax
    gpb = block // group
    full_pay = gpb * 4 + (block if bits == 8 else block // 2)
    vals = np.empty(group, np.float32)
    codes = np.empty(group, np.int32)
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
            xs = src[e0:e0 + ne]
            rs = res[e0:e0 + ne]
            mx = np.uint32(0)
            if use_res:
                for j in range(ne):
                    v = np.float32(xs[j]) + rs[j]
                    vals[j] = v
                    a = _f2u(v) & np.uint32(0x7FFFFFFF)
                    mx = a if a > mx else mx
            else:
                for j in range(ne):
                    v = np.float32(xs[j])
                    vals[j] = v
                    a = _f2u(v) & np.uint32(0x7FFFFFFF)
                    mx = a if a > mx else mx
            scale, pre, inv, ok = _group_scale(mx, qmax)
            _put_f32(payload, pbase + 4 * g, scale)
            if not ok:
                # NaN or Inf in the group: NaN scale, zero codes, residual 0
                nonfinite += 1
                nbytes = ne if bits == 8 else (ne + 1) // 2
                d0 = dbase + (g * group if bits == 8 else (g * group) // 2)
                payload[d0:d0 + nbytes] = 0
                if use_res:
                    rs[:] = 0
                continue
            if bits == 8:
                d0 = dbase + g * group
                pd = payload[d0:d0 + ne]
                if use_res:
                    for j in range(ne):
                        v = vals[j]
                        q = _rne((v * pre) * inv)
                        q = q if q < qmax else qmax
                        q = q if q > nq else nq
                        pd[j] = np.uint8(np.int32(q) & 0xFF)
                        rs[j] = v - _dq(q, scale)
                else:
                    for j in range(ne):
                        q = _rne((vals[j] * pre) * inv)
                        q = q if q < qmax else qmax
                        q = q if q > nq else nq
                        pd[j] = np.uint8(np.int32(q) & 0xFF)
            else:
                for j in range(ne):
                    q = _rne((vals[j] * pre) * inv)
                    q = q if q < qmax else qmax
                    q = q if q > nq else nq
                    codes[j] = np.int32(q)
                d0 = dbase + (g * group) // 2
                pd = payload[d0:d0 + (ne + 1) // 2]
                for k in range(ne // 2):
                    pd[k] = np.uint8((codes[2 * k] & 0xF) | ((codes[2 * k + 1] & 0xF) << 4))
                if ne & 1:
                    pd[ne // 2] = np.uint8(codes[ne - 1] & 0xF)
                if use_res:
                    for j in range(ne):
                        rs[j] = vals[j] - _dq(np.float32(codes[j]), scale)
    return nonfinite


@njit(cache=True, nogil=True)
def quant_decode(payload, count, block, group, bits, out, accumulate):
    """Dequantize ``count`` elements from ``payload`` into ``out``
    (float32/float64), or add them to ``out`` when ``accumulate``."""
    gpb = block // group
    full_pay = gpb * 4 + (block if bits == 8 else block // 2)
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
            scale = _get_f32(payload, pbase + 4 * g)
            if bits == 8:
                d0 = dbase + g * group
                pd = payload[d0:d0 + ne]
                os = out[e0:e0 + ne]
                if accumulate:
                    for j in range(ne):
                        c = np.int32(pd[j])
                        c -= (c & 0x80) << 1
                        os[j] += _dq(np.float32(c), scale)
                else:
                    for j in range(ne):
                        c = np.int32(pd[j])
                        c -= (c & 0x80) << 1
                        os[j] = _dq(np.float32(c), scale)
                continue
            else:
                d0 = dbase + (g * group) // 2
                pd = payload[d0:d0 + (ne + 1) // 2]
                for k in range(ne // 2):
                    c = np.int32(pd[k])
                    lo = c & 0xF
                    hi = c >> 4
                    lo -= (lo & 0x8) << 1
                    hi -= (hi & 0x8) << 1
                    vals[2 * k] = _dq(np.float32(lo), scale)
                    vals[2 * k + 1] = _dq(np.float32(hi), scale)
                if ne & 1:
                    c = np.int32(pd[ne // 2]) & 0xF
                    c -= (c & 0x8) << 1
                    vals[ne - 1] = _dq(np.float32(c), scale)
            os = out[e0:e0 + ne]
            if accumulate:
                for j in range(ne):
                    os[j] += vals[j]
            else:
                for j in range(ne):
                    os[j] = vals[j]


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
