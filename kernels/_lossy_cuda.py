"""CUDA kernels of the lossy codecs (numba.cuda), same bytes as _lossy_cpu.

Private to :mod:`erdmampi.kernels.lossy` (imported on first GPU use).  The
kernels are memory-bound, one pass each: one thread per element (bf16,
int8, all decoders) or per two elements (int4 encode, one output byte), so
loads and stores are coalesced.  int8/int4 encoders run one thread block per
quantization group (``group / per`` threads) and take the group's absmax
with a shared-memory tree reduction, keeping ``v`` in registers.

Float <-> bit conversions go through ``math.frexp``/``math.ldexp`` (exact)
instead of reinterpreting memory, and rounding uses ``round`` (``llrint``:
nearest, ties to even) on a product that is never fused into an FMA, so the
codes equal the CPU kernels' bit for bit.  The residual ``v - c * scale`` may
be fused into an FMA on a GPU (it is not part of the wire format).
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from erdmampi.kernels._checksum import checksum32_cuda
from erdmampi.kernels.format import HEADER_SIZE, CodecError, pack_header

TPB = 256
# math.ldexp's exponent: int32 for the CUDA typer, a Python int in the simulator
_I32 = int if config.ENABLE_CUDASIM else np.int32
_F32_MAX = np.float32(3.4028235e38)
_INF = np.float32(np.inf)
_NAN = np.float32(np.nan)
_MIN_NORMAL = np.float32(2.0 ** -126)
_P126 = np.float32(2.0 ** 126)
_P23 = np.float32(2.0 ** 23)
_P24 = np.float32(2.0 ** 24)
_P7 = np.float32(128.0)
_P8 = np.float32(256.0)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_TINY = np.float32(2.0 ** -100)
_BIG = np.float32(2.0 ** 100)


# -- device helpers --------------------------------------------------------

@cuda.jit(device=True)
def _f32_bits(x):
    """IEEE bits of a float32 (NaN -> 0x7FC00000), computed arithmetically."""
    if x != x:
        return 0x7FC00000
    s = 0
    if math.copysign(_ONE, x) < _ZERO:
        s = 0x80000000
    a = abs(x)
    if a > _F32_MAX:
        return s | 0x7F800000
    if a < _MIN_NORMAL:
        return s | int(np.float32(np.float32(a * _P126) * _P23))
    m, e = math.frexp(a)
    mant = int(np.float32(m) * _P24)
    return s | ((e + 126) << 23) | (mant - 0x800000)


@cuda.jit(device=True)
def _bits_f32(u):
    """float32 from its IEEE bits ``u`` (an int), computed arithmetically."""
    ex = (u >> 23) & 0xFF
    mant = u & 0x7FFFFF
    if ex == 255:
        v = _INF if mant == 0 else _NAN
    elif ex == 0:
        v = np.float32(math.ldexp(np.float32(mant), _I32(-149)))
    else:
        v = np.float32(math.ldexp(np.float32(mant | 0x800000), _I32(ex - 150)))
    if (u >> 31) & 1:
        v = -v
    return v


@cuda.jit(device=True)
def _bf16_bits(v):
    """bfloat16 bits of float32 ``v``, round to nearest even; NaN -> quiet."""
    s = 0
    if math.copysign(_ONE, v) < _ZERO:
        s = 0x8000
    if v != v:
        return s | 0x7FC0
    a = abs(v)
    if a < _MIN_NORMAL:
        return s | round(np.float32(a * _P126) * _P7)
    if a > _F32_MAX:
        return s | 0x7F80
    m, e = math.frexp(a)
    r = round(np.float32(m) * _P8)
    if r == 256:
        r = 128
        e += 1
    ex = e + 126
    if ex >= 255:
        return s | 0x7F80
    return s | (ex << 7) | (r - 128)


@cuda.jit(device=True)
def _bf16_value(h):
    """float32 value of bfloat16 bits ``h``."""
    ex = (h >> 7) & 0xFF
    mant = h & 0x7F
    if ex == 255:
        v = _INF if mant == 0 else _NAN
    elif ex == 0:
        v = np.float32(math.ldexp(np.float32(mant), _I32(-133)))
    else:
        v = np.float32(math.ldexp(np.float32(mant + 128), _I32(ex - 134)))
    if (h >> 15) & 1:
        v = -v
    return v


@cuda.jit(device=True)
def _clamp(c, lim):
    if c > lim:
        return lim
    if c < -lim:
        return -lim
    return c


@cuda.jit(device=True)
def _dq(c, scale):
    """``c * scale`` clamped to the float32 range (NaN stays NaN)."""
    v = np.float32(np.float32(c) * scale)
    if v > _F32_MAX:
        return _F32_MAX
    if v < -_F32_MAX:
        return -_F32_MAX
    return v


# -- kernels -----------------------------------------------------------------

@cuda.jit
def _bf16_encode(src, res, use_res, count, out, pay_off, nbad):
    i = cuda.grid(1)
    if i < count:
        v = np.float32(src[i])
        if use_res:
            v = np.float32(v + res[i])
        h = _bf16_bits(v)
        out[pay_off + 2 * i] = h & 0xFF
        out[pay_off + 2 * i + 1] = (h >> 8) & 0xFF
        if not (abs(v) <= _F32_MAX):
            cuda.atomic.add(nbad, 0, 1)
        if use_res:
            r = np.float32(v - _bf16_value(h))
            if not (abs(r) <= _F32_MAX):
                r = _ZERO
            res[i] = r


@cuda.jit
def _bf16_decode(enc, pay_off, count, out, accumulate):
    i = cuda.grid(1)
    if i < count:
        h = np.int64(enc[pay_off + 2 * i]) | (np.int64(enc[pay_off + 2 * i + 1]) << 8)
        v = _bf16_value(h)
        if accumulate:
            out[i] += v
        else:
            out[i] = v


@cuda.jit
def _quant_encode(src, res, use_res, count, block, group, bits, full_pay,
                  out, pay_off, nbad):
    sh = cuda.shared.array(1024, np.float32)
    t = cuda.threadIdx.x
    per = 1 if bits == 8 else 2
    e0 = cuda.blockIdx.x * group
    i0 = e0 + t * per
    v0 = _ZERO
    v1 = _ZERO
    if i0 < count:
        v0 = np.float32(src[i0])
        if use_res:
            v0 = np.float32(v0 + res[i0])
    if per == 2 and i0 + 1 < count:
        v1 = np.float32(src[i0 + 1])
        if use_res:
            v1 = np.float32(v1 + res[i0 + 1])
    a0 = abs(v0)
    if not (a0 <= _F32_MAX):
        a0 = _INF
    a1 = abs(v1)
    if not (a1 <= _F32_MAX):
        a1 = _INF
    sh[t] = a0 if a0 >= a1 else a1
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            if sh[t + s] > sh[t]:
                sh[t] = sh[t + s]
        cuda.syncthreads()
        s //= 2
    amax = sh[0]

    b = e0 // block
    jb = e0 - b * block
    nb = count - b * block
    if nb > block:
        nb = block
    ng = (nb + group - 1) // group
    pbase = pay_off + b * full_pay
    qmax = np.float32(127.0) if bits == 8 else np.float32(7.0)
    iq = 127 if bits == 8 else 7
    c0 = 0
    c1 = 0
    r0 = _ZERO
    r1 = _ZERO
    if amax == _INF:
        scale = _NAN
        if t == 0:
            cuda.atomic.add(nbad, 0, 1)
    else:
        scale = np.float32(amax / qmax)
        if amax == _ZERO:
            pass
        elif amax < _TINY:
            inv = np.float32(qmax / np.float32(amax * _BIG))
            c0 = round(np.float32(np.float32(v0 * _BIG) * inv))
            c1 = round(np.float32(np.float32(v1 * _BIG) * inv))
        else:
            inv = np.float32(qmax / amax)
            c0 = round(np.float32(v0 * inv))
            c1 = round(np.float32(v1 * inv))
        c0 = _clamp(c0, iq)
        c1 = _clamp(c1, iq)
        r0 = np.float32(v0 - _dq(c0, scale))
        r1 = np.float32(v1 - _dq(c1, scale))
    if t == 0:
        u = _f32_bits(scale)
        p = pbase + 4 * (jb // group)
        out[p] = u & 0xFF
        out[p + 1] = (u >> 8) & 0xFF
        out[p + 2] = (u >> 16) & 0xFF
        out[p + 3] = (u >> 24) & 0xFF
    if i0 < count:
        if per == 1:
            out[pbase + 4 * ng + jb + t] = c0 & 0xFF
        else:
            out[pbase + 4 * ng + jb // 2 + t] = (c0 & 0xF) | ((c1 & 0xF) << 4)
        if use_res:
            res[i0] = r0
            if per == 2 and i0 + 1 < count:
                res[i0 + 1] = r1


@cuda.jit
def _quant_decode(enc, pay_off, count, block, group, bits, full_pay, out,
                  accumulate):
    i = cuda.grid(1)
    if i < count:
        b = i // block
        jb = i - b * block
        nb = count - b * block
        if nb > block:
            nb = block
        ng = (nb + group - 1) // group
        pbase = pay_off + b * full_pay
        p = pbase + 4 * (jb // group)
        u = (np.int64(enc[p]) | (np.int64(enc[p + 1]) << 8)
             | (np.int64(enc[p + 2]) << 16) | (np.int64(enc[p + 3]) << 24))
        scale = _bits_f32(u)
        if bits == 8:
            c = np.int64(enc[pbase + 4 * ng + jb])
            if c >= 128:
                c -= 256
        else:
            c = (np.int64(enc[pbase + 4 * ng + jb // 2]) >> ((jb & 1) * 4)) & 0xF
            if c >= 8:
                c -= 16
        v = _dq(c, scale)
        if accumulate:
            out[i] += v
        else:
            out[i] = v


# -- host drivers ----------------------------------------------------------

def _dev(a, what):
    if hasattr(a, "copy_to_host"):
        return a
    if hasattr(a, "__cuda_array_interface__"):
        return cuda.as_cuda_array(a)
    raise TypeError(f"{what} must be a CUDA device array, not {type(a).__name__}")


def _flat(a):
    if a.ndim != 1:
        if not a.is_c_contiguous():
            raise ValueError("device array must be C-contiguous")
        a = a.reshape(a.size)
    return a


def _to_host(darr, stream):
    """Copy a (small) device array to the host and wait for it."""
    h = darr.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()
    return h


def _grid(n):
    return max(1, (n + TPB - 1) // TPB)


def _device_checksum(buf, off, n, stream):
    """format.checksum32 of ``buf[off:off+n]`` on the device."""
    return checksum32_cuda(buf[off:off + n], stream)


def encode(codec, src, out, stream, feedback):
    src = _flat(_dev(src, "src"))
    dt = codec.check_dtype(src.dtype)
    n = src.size
    table, pay = codec._geometry(n, codec.block, codec.param)
    poff = HEADER_SIZE + 4 * table.size
    total = poff + pay
    if out is None:
        out = cuda.device_array(total, np.uint8, stream=stream)
    else:
        out = _flat(_dev(out, "out"))
        if out.dtype != np.uint8:
            raise TypeError("output must be a uint8 device array")
        if out.size < total:
            raise ValueError(f"output buffer too small: {out.size} < {total} bytes")
    if feedback is not None:
        res = feedback.get(n, like=src)
        if not hasattr(res, "copy_to_host"):
            res = cuda.to_device(np.ascontiguousarray(res, np.float32), stream=stream)
            feedback.residual = res
        use_res = True
    else:
        res = cuda.device_array(1, np.float32, stream=stream)
        use_res = False
    nbad = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    if n:
        if codec.bits == 16:
            _bf16_encode[_grid(n), TPB, stream](src, res, use_res, n, out, poff, nbad)
        else:
            per = 1 if codec.bits == 8 else 2
            tpb = codec.group // per
            if tpb > 1024:
                raise NotImplementedError(f"{codec.name}: group {codec.group} "
                                          f"too large for the CUDA encoder")
            ngroups = -(-n // codec.group)
            full = codec._block_pay(codec.block, codec.param)
            _quant_encode[ngroups, tpb, stream](src, res, use_res, n, codec.block,
                                                codec.group, codec.bits, full,
                                                out, poff, nbad)
    psum = _device_checksum(out, poff, pay, stream)
    bad = int(_to_host(nbad, stream)[0])
    if bad and codec.nonfinite == "raise":
        raise ValueError(f"{codec.name}: NaN or Inf in the input")
    hdr = pack_header(codec.codec_id, dt, n, codec.block, table, psum, codec.param)
    head = np.empty(poff, np.uint8)
    head[:HEADER_SIZE] = np.frombuffer(hdr, np.uint8)
    head[HEADER_SIZE:] = table.view(np.uint8)
    out[:poff].copy_to_device(head, stream=stream)
    return out[:total]


def _host_view_of_head(enc, stream):
    """A host buffer whose header and table equal ``enc``'s (payload bytes
    left unread): what :func:`format.parse` needs without moving the payload."""
    import struct
    if enc.size < HEADER_SIZE:
        raise CodecError(f"encoded buffer truncated: {enc.size} bytes")
    h0 = _to_host(enc[:HEADER_SIZE], stream)
    nblocks, = struct.unpack_from("<I", h0.tobytes(), 20)
    payload_len, = struct.unpack_from("<Q", h0.tobytes(), 24)
    tend = HEADER_SIZE + 4 * nblocks
    if tend > enc.size:
        raise CodecError("encoded buffer truncated in the block table")
    host = np.empty(min(enc.size, tend + payload_len), np.uint8)  # untouched pages
    host[:tend] = _to_host(enc[:tend], stream)
    return host


def decode(codec, enc, out, stream, accumulate):
    if hasattr(enc, "copy_to_host") or hasattr(enc, "__cuda_array_interface__"):
        enc = _flat(_dev(enc, "enc"))
        hdr, payload = codec._parse(_host_view_of_head(enc, stream))
        denc = enc
    else:
        hb = np.frombuffer(memoryview(enc).cast("B"), np.uint8)
        hdr, payload = codec._parse(hb)
        denc = cuda.to_device(hb[:HEADER_SIZE + 4 * hdr.nblocks + hdr.payload_len],
                              stream=stream)
    poff = HEADER_SIZE + 4 * hdr.nblocks
    if out is None:
        if accumulate:
            raise TypeError("decode_accumulate_cuda needs an accumulator")
        out = cuda.device_array(hdr.count, hdr.dtype, stream=stream)
    else:
        out = _dev(out, "out")
        if not accumulate and out.dtype != hdr.dtype:
            raise CodecError(f"output dtype {out.dtype} != encoded {hdr.dtype}")
        if out.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"output must be float32 or float64, not {out.dtype}")
        if out.size != hdr.count:
            raise CodecError(f"output has {out.size} elements, encoding {hdr.count}")
    flat = _flat(out)
    if _device_checksum(denc, poff, hdr.payload_len, stream) != hdr.payload_sum:
        raise CodecError("payload checksum mismatch (corrupt data)")
    n = hdr.count
    if n:
        if codec.bits == 16:
            _bf16_decode[_grid(n), TPB, stream](denc, poff, n, flat, accumulate)
        else:
            g = hdr.param >> 8
            full = codec._block_pay(hdr.block_elems, hdr.param)
            _quant_decode[_grid(n), TPB, stream](denc, poff, n, hdr.block_elems, g,
                                                 codec.bits, full, flat, accumulate)
    return out
