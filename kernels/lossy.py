"""Opt-in lossy codecs: bfloat16 and blockwise int8 / int4 (absmax scales).

MPI promises exact data, so none of these is ever chosen by default; a user
asks for one by name (``kernels.get("int8")``) for gradient-style data.
Each codec takes float32 or float64 input (converted to float32 first; the
header records the original dtype and decoding returns it), supports
**error feedback** (``encode(x, out, feedback=ef)`` encodes ``x + residual``
and keeps ``residual = (x + residual) - decoded``, fused in the one pass),
and has :meth:`decode_accumulate` adding the decoded values into a float
accumulator in one pass (what a qgZ-style allreduce owner needs).

Error bounds, per element (tested in tests/test_kernels_lossy.py, derived in
docs/lossy.md), for ``v = float32(x)``:

* bf16: ``|v - v'| <= 2**-8 |v|`` (round to nearest even; bfloat16
  subnormals: absolute ``2**-134``).  NaN stays NaN, +-Inf stay +-Inf.
* int8: ``|v - v'| <= absmax_group / 254`` (plus float32 rounding).
* int4: ``|v - v'| <= absmax_group / 14``.
  A group holding NaN or Inf decodes to all-NaN (NaN propagates as in an
  MPI sum), or raises with ``nonfinite="raise"``.

Wire format: the container of :mod:`erdmampi.kernels.format`; the CPU
(:mod:`._lossy_cpu`) and CUDA (:mod:`._lossy_cuda`) kernels write the same
bytes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from erdmampi.kernels.codec import Codec, ErrorFeedback, as_out, as_src
from erdmampi.kernels.format import (HEADER_SIZE, SIZE_MASK, CodecError,
                                     pack_header, parse)

__all__ = ["BF16", "Int8", "Int4"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_MAX_BLOCK = 1 << 20   # largest block/group a decoder accepts
_cpu_mod = None
_cuda_mod = None


def _cpu():
    global _cpu_mod
    if _cpu_mod is None:
        from erdmampi.kernels import _lossy_cpu
        _cpu_mod = _lossy_cpu
    return _cpu_mod


def _cuda():
    global _cuda_mod
    if _cuda_mod is None:
        from erdmampi.kernels import _lossy_cuda
        _cuda_mod = _lossy_cuda
    return _cuda_mod


def _is_device(a) -> bool:
    return hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray)


def _checksum(payload: np.ndarray) -> int:
    n4 = payload.size // 4
    words = payload[:n4 * 4]
    if words.ctypes.data % 4 == 0:
        w = words.view("<u4")
    else:
        w = words.copy().view("<u4")
    return int(_cpu().checksum32(w, payload[n4 * 4:]))


class _Lossy(Codec):
    lossless = False
    dtypes = (np.float32, np.float64)
    #: bits per code (16 for bf16)
    bits = 16

    def __init__(self, block: int = 8192, nonfinite: str = "nan"):
        if nonfinite not in ("nan", "raise"):
            raise ValueError("nonfinite must be 'nan' or 'raise'")
        if not 2 <= block <= _MAX_BLOCK or block % 2:
            raise ValueError(f"block must be even, 2..{_MAX_BLOCK}: {block}")
        #: elements per container block
        self.block = int(block)
        #: what a NaN/Inf input does: "nan" (decodes to NaN) or "raise"
        self.nonfinite = nonfinite

    # -- geometry (shared by encoder and decoder) --------------------------
    @property
    def param(self) -> int:
        return self.bits

    def _block_pay(self, n: int, param: int) -> int:
        """Payload bytes of a block of ``n`` elements."""
        return 2 * n

    def _geometry(self, count: int, block: int, param: int):
        """(table u32, payload bytes) for ``count`` elements."""
        if count == 0:
            return np.zeros(0, "<u4"), 0
        nb = -(-count // block)
        full = self._block_pay(block, param)
        last = self._block_pay(count - (nb - 1) * block, param)
        if full > SIZE_MASK:
            raise ValueError("block too large for the container")
        table = np.full(nb, full, dtype="<u4")
        table[-1] = last
        return table, full * (nb - 1) + last

    def encoded_size(self, count: int) -> int:
        """Exact encoded bytes of ``count`` elements (lossy sizes depend on
        the count only)."""
        table, pay = self._geometry(count, self.block, self.param)
        return HEADER_SIZE + 4 * table.size + pay

    def max_encoded_size(self, count: int, dtype=np.float32) -> int:
        self.check_dtype(dtype)
        return self.encoded_size(count)

    def ratio(self, dtype=np.float32, count: int = 1 << 24) -> float:
        """Bytes of ``count`` raw elements over their encoded bytes."""
        return count * np.dtype(dtype).itemsize / self.encoded_size(count)

    # -- host ---------------------------------------------------------------
    def encode(self, src, out=None, *, feedback: Optional[ErrorFeedback] = None):
        a = as_src(src)
        dt = self.check_dtype(a.dtype)
        n = a.size
        table, pay = self._geometry(n, self.block, self.param)
        poff = HEADER_SIZE + 4 * table.size
        o = as_out(out, poff + pay)
        payload = o[poff:poff + pay]
        if feedback is not None:
            res = feedback.get(n)
            if _is_device(res):
                res = res.copy_to_host()
                feedback.residual = res
            use_res = True
        else:
            res = np.zeros(0, np.float32)
            use_res = False
        bad = self._encode_cpu(a, res, use_res, payload)
        if bad and self.nonfinite == "raise":
            raise ValueError(f"{self.name}: NaN or Inf in the input "
                             f"({bad} {'values' if self.bits == 16 else 'groups'})")
        hdr = pack_header(self.codec_id, dt, n, self.block, table,
                          _checksum(payload), self.param)
        o[:HEADER_SIZE] = np.frombuffer(hdr, np.uint8)
        o[HEADER_SIZE:poff] = table.view(np.uint8)
        return o[:poff + pay]

    def _parse(self, enc):
        hdr, table, payload = parse(enc, codec_id=self.codec_id,
                                    verify_payload=False)
        if hdr.dtype not in _FLOATS:
            raise CodecError(f"{self.name}: encoded dtype {hdr.dtype} is not a float")
        self._check_param(hdr)
        if not 2 <= hdr.block_elems <= _MAX_BLOCK and hdr.count:
            raise CodecError(f"{self.name}: block of {hdr.block_elems} elements")
        want, pay = self._geometry(hdr.count, hdr.block_elems, hdr.param)
        if pay != hdr.payload_len or not np.array_equal(want, table):
            raise CodecError(f"{self.name}: block table does not match the geometry")
        return hdr, payload

    def _check_param(self, hdr):
        if hdr.param != self.param:
            raise CodecError(f"{self.name}: codec parameter {hdr.param:#x}")
        if hdr.block_elems % 2:
            raise CodecError(f"{self.name}: odd block size {hdr.block_elems}")

    def _verify(self, hdr, payload):
        if _checksum(payload) != hdr.payload_sum:
            raise CodecError("payload checksum mismatch (corrupt data)")

    def decode(self, enc, out=None):
        if _is_device(enc):
            enc = enc.copy_to_host()
        hdr, payload = self._parse(enc)
        if out is None:
            o = np.empty(hdr.count, hdr.dtype)
        else:
            o = self._check_out(out, hdr, hdr.dtype)
        self._verify(hdr, payload)
        self._decode_cpu(hdr, payload, o, False)
        return out if out is not None else o

    def decode_accumulate(self, enc, acc):
        """``acc += decode(enc)`` in one pass (``acc`` float32 or float64 of
        the encoded count; any encoded float dtype).  Returns ``acc``."""
        if _is_device(enc):
            enc = enc.copy_to_host()
        hdr, payload = self._parse(enc)
        o = self._check_out(acc, hdr, None)
        self._verify(hdr, payload)
        self._decode_cpu(hdr, payload, o, True)
        return acc

    @staticmethod
    def _check_out(out, hdr, dtype):
        if not isinstance(out, np.ndarray):
            raise TypeError("output must be a numpy array")
        if dtype is not None and out.dtype != dtype:
            raise CodecError(f"output dtype {out.dtype} != encoded {dtype}")
        if out.dtype not in _FLOATS:
            raise TypeError(f"accumulator must be float32 or float64, not {out.dtype}")
        if out.size != hdr.count:
            raise CodecError(f"output has {out.size} elements, encoding {hdr.count}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("output must be C-contiguous and writeable")
        return out.reshape(-1)

    # -- device ---------------------------------------------------------------
    def encode_cuda(self, src, out=None, *, stream=0, feedback=None):
        """As :meth:`encode` on the GPU: ``src`` a device array, ``out`` a
        device uint8 array (allocated when None); returns a device view."""
        return _cuda().encode(self, src, out, stream, feedback)

    def decode_cuda(self, enc, out=None, *, stream=0):
        """As :meth:`decode` on the GPU (``enc`` on host or device);
        returns the device array ``out``."""
        return _cuda().decode(self, enc, out, stream, False)

    def decode_accumulate_cuda(self, enc, acc, *, stream=0):
        """As :meth:`decode_accumulate` on the GPU (``acc`` a device array)."""
        return _cuda().decode(self, enc, acc, stream, True)

    # -- Private
    def _encode_cpu(self, a, res, use_res, payload):
        raise NotImplementedError

    def _decode_cpu(self, hdr, payload, out, accumulate):
        raise NotImplementedError


class BF16(_Lossy):
    """float32/float64 -> bfloat16, round to nearest even; 2 bytes/element."""
    name = "bf16"
    codec_id = 8
    bits = 16

    def _encode_cpu(self, a, res, use_res, payload):
        return _cpu().bf16_encode(a, res, use_res, payload.view(np.uint16))

    def _decode_cpu(self, hdr, payload, out, accumulate):
        _cpu().bf16_decode(payload.view(np.uint16), out, accumulate)


class _Quant(_Lossy):
    """Blockwise absmax quantization to ``bits``-bit signed codes."""
    #: default quantization group (elements sharing one float32 scale)
    default_group = 256

    def __init__(self, group: Optional[int] = None, block: int = 8192,
                 nonfinite: str = "nan"):
        super().__init__(block, nonfinite)
        g = self.default_group if group is None else int(group)
        if g < 2 or g & (g - 1) or g > 4096 or self.block % g:
            raise ValueError(f"group must be a power of two in 2..4096 "
                             f"dividing the block ({self.block}): {g}")
        #: elements per float32 scale
        self.group = g

    @property
    def param(self) -> int:
        return self.bits | (self.group << 8)

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def _block_pay(self, n: int, param: int) -> int:
        g = param >> 8
        codes = n if self.bits == 8 else (n + 1) // 2
        return 4 * (-(-n // g)) + codes

    def _check_param(self, hdr):
        bits, g = hdr.param & 0xFF, hdr.param >> 8
        if bits != self.bits:
            raise CodecError(f"{self.name}: encoded with {bits}-bit codes")
        if g < 2 or g & (g - 1) or g > _MAX_BLOCK or (hdr.count and hdr.block_elems % g):
            raise CodecError(f"{self.name}: bad group {g} for block {hdr.block_elems}")

    def _encode_cpu(self, a, res, use_res, payload):
        return _cpu().quant_encode(a, res, use_res, self.block, self.group,
                                   self.bits, payload)

    def _decode_cpu(self, hdr, payload, out, accumulate):
        _cpu().quant_decode(payload, hdr.count, hdr.block_elems,
                            hdr.param >> 8, self.bits, out, accumulate)


class Int8(_Quant):
    """int8 codes, one float32 scale (absmax/127) per 256 elements:
    32 / (8 + 32/256) = 3.94x fewer bytes than float32."""
    name = "int8"
    codec_id = 9
    bits = 8
    default_group = 256


class Int4(_Quant):
    """int4 codes (two per byte), one float32 scale (absmax/7) per 128
    elements: 32 / (4 + 32/128) = 7.5x fewer bytes than float32."""
    name = "int4"
    codec_id = 10
    bits = 4
    default_group = 128
