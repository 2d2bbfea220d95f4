"""The codec interface shared by every compressor in :mod:`erdmampi.kernels`.

A codec turns a 1-D C-contiguous array into a self-describing byte buffer in
the container of :mod:`erdmampi.kernels.format` and back.  Every codec has a
CPU implementation (Numba ``@njit``) and a CUDA one (``numba.cuda``) writing
the **same bytes format**: a buffer encoded on either side decodes on either.

Numba is imported only inside the implementation modules, which the registry
(:mod:`erdmampi.kernels`) imports on first use, so ``import erdmampi`` stays
fast and works without Numba or a GPU.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from erdmampi.kernels.format import HEADER_SIZE, CodecError

__all__ = ["Codec", "ErrorFeedback", "CodecError", "as_src", "as_out"]


class Codec:
    """Base class: subclasses set the class attributes and implement the
    ``_encode``/``_decode`` pairs."""

    #: registry name
    name: str = ""
    #: id stored in the header (unique per codec)
    codec_id: int = -1
    #: True when decode(encode(x)) is bit-identical to x for every input
    lossless: bool = True
    #: dtypes accepted (None: any)
    dtypes: Optional[tuple] = None

    # -- sizes ------------------------------------------------------------
    def max_encoded_size(self, count: int, dtype) -> int:
        """Worst-case encoded bytes for ``count`` elements of ``dtype``
        (header and table included)."""
        raise NotImplementedError

    # -- host -------------------------------------------------------------
    def encode(self, src: np.ndarray, out: Optional[np.ndarray] = None, *,
               feedback: Optional["ErrorFeedback"] = None) -> np.ndarray:
        """Encode ``src`` (1-D contiguous) into ``out`` (uint8, at least
        :meth:`max_encoded_size` bytes; allocated when None).  Returns the
        view ``out[:n]`` holding the encoding.  Lossy codecs encode
        ``src + feedback.residual`` and update the residual."""
        raise NotImplementedError

    def decode(self, enc, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Decode into ``out`` (dtype and count must match the header;
        allocated when None) and return it.  Raises :class:`CodecError` on
        corrupt, truncated or mismatching input."""
        raise NotImplementedError

    # -- device (numba.cuda device arrays or anything with the CUDA array
    #    interface; ``stream`` is a numba stream or 0) --------------------
    def encode_cuda(self, src, out=None, *, stream=0, feedback=None):
        """As :meth:`encode`, on the GPU; returns a device uint8 view."""
        raise NotImplementedError(f"{self.name}: no CUDA encoder")

    def decode_cuda(self, enc, out=None, *, stream=0):
        """As :meth:`decode`, on the GPU (``enc`` on host or device)."""
        raise NotImplementedError(f"{self.name}: no CUDA decoder")

    def check_dtype(self, dtype) -> np.dtype:
        dt = np.dtype(dtype)
        if self.dtypes is not None and dt not in [np.dtype(d) for d in self.dtypes]:
            raise TypeError(f"codec {self.name!r} does not take dtype {dt}")
        return dt

    def __repr__(self):
        return f"<codec {self.name} id={self.codec_id} lossless={self.lossless}>"


class ErrorFeedback:
    """Per-rank residual for lossy codecs (error feedback / EF-SGD).

    Each call encodes ``x + residual`` and keeps ``residual = (x + residual)
    - decode(encoding)``, so the quantization error of one step is added back
    in the next instead of being lost.  One object per tensor being reduced
    (keyed by the caller); the residual is float32 and grows on first use."""

    def __init__(self):
        self.residual: Optional[np.ndarray] = None

    def get(self, count: int, like=None) -> np.ndarray:
        """The residual for ``count`` elements (zeros on first use or after a
        size change).  ``like`` chooses host (numpy) or device (numba)."""
        r = self.residual
        if r is None or r.size != count:
            if like is not None and hasattr(like, "__cuda_array_interface__"):
                from numba import cuda
                r = cuda.device_array(count, dtype=np.float32)
                r[:] = 0  # device memset
            else:
                r = np.zeros(count, dtype=np.float32)
            self.residual = r
        return r

    def reset(self) -> None:
        self.residual = None


def as_src(src) -> np.ndarray:
    """A 1-D contiguous view of a host array (copy only when not contiguous)."""
    a = np.asarray(src)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1)


def as_out(out, nbytes: int) -> np.ndarray:
    """A writable uint8 view of ``out`` with room for ``nbytes`` (allocated
    when None)."""
    if out is None:
        return np.empty(nbytes, dtype=np.uint8)
    o = np.asarray(out).reshape(-1).view(np.uint8)
    if o.size < nbytes:
        raise ValueError(f"output buffer too small: {o.size} < {nbytes} bytes")
    if not o.flags.writeable:
        raise ValueError("output buffer is read-only")
    return o
