"""The container checksum (:func:`erdmampi.kernels.format.checksum32`) in
Numba: a CPU ``@njit`` kernel and a CUDA parallel reduction.

``s1 = sum(w_i)``, ``s2 = sum((i + 1) * w_i)`` over the little-endian u32
words of the bytes (the tail zero-padded to 4 bytes), both mod 2**64; the
result folds ``h = s1 ^ (s2 << 1)`` to 32 bits as ``h ^ (h >> 32)``.

Both sums are linear in the words, so any split of the buffer into pieces
can be summed independently and combined: a piece starting at word ``k``
contributes its own ``s1`` to ``s1`` and ``s2_piece + k * s1_piece`` to
``s2`` (this is what the CUDA reduction does per thread).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, njit, uint64

__all__ = ["checksum32", "sums", "fold", "checksum32_cuda"]

_M64 = 0xFFFFFFFFFFFFFFFF


@njit(cache=True, nogil=True)
def sums(b, word0=0):
    """(s1, s2) of the bytes ``b`` (uint8 array) taken as words starting at
    word index ``word0`` (i.e. s2 uses weights word0+1, word0+2, ...)."""
    n = b.size
    n4 = n >> 2
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    w = b[:n4 * 4].view(np.uint32)
    # Chunks of CH words, 4 interleaved lanes each keeping a running sum a_l
    # and the sum of its running sums t_l: no multiply in the inner loop.
    # For lane l (words pos+4m+l, m < K): sum_m (4m+l) w = 4 (K a_l - t_l)
    # + l a_l.
    CH = 1024
    K = np.uint64(CH // 4)
    pos = 0
    while pos + CH <= n4:
        a0 = np.uint64(0)
        a1 = np.uint64(0)
        a2 = np.uint64(0)
        a3 = np.uint64(0)
        t0 = np.uint64(0)
        t1 = np.uint64(0)
        t2 = np.uint64(0)
        t3 = np.uint64(0)
        for j in range(pos, pos + CH, 4):
            a0 += np.uint64(w[j])
            a1 += np.uint64(w[j + 1])
            a2 += np.uint64(w[j + 2])
            a3 += np.uint64(w[j + 3])
            t0 += a0
            t1 += a1
            t2 += a2
            t3 += a3
        c1 = a0 + a1 + a2 + a3
        c2 = (np.uint64(4) * (K * c1 - (t0 + t1 + t2 + t3))
              + a1 + np.uint64(2) * a2 + np.uint64(3) * a3)
        s2 += c2 + np.uint64(word0 + pos + 1) * c1
        s1 += c1
        pos += CH
    c1 = np.uint64(0)
    c2 = np.uint64(0)
    for j in range(pos, n4):
        x = np.uint64(w[j])
        c1 += x
        c2 += np.uint64(j - pos) * x
    s2 += c2 + np.uint64(word0 + pos + 1) * c1
    s1 += c1
    r = n - n4 * 4
    if r:
        t = np.uint64(0)
        for k in range(r):
            t |= np.uint64(b[n4 * 4 + k]) << np.uint64(8 * k)
        s1 += t
        s2 += np.uint64(word0 + n4 + 1) * t
    return s1, s2


@njit(cache=True, nogil=True)
def fold(s1, s2):
    """The 32-bit checksum from the two sums."""
    h = np.uint64(s1) ^ (np.uint64(s2) << np.uint64(1))
    return np.uint32((h ^ (h >> np.uint64(32))) & np.uint64(0xFFFFFFFF))


@njit(cache=True, nogil=True)
def checksum32(b):
    """Checksum of a uint8 array, equal to ``format.checksum32``."""
    s1, s2 = sums(b, 0)
    return fold(s1, s2)


# -- CUDA -----------------------------------------------------------------

_cuda_kernels = {}


def _kernels():
    k = _cuda_kernels.get("sum")
    if k is not None:
        return k
    TPB = 256

    @cuda.jit(device=True)
    def _block_add(sh1, sh2, tid, a1, a2, acc):
        # tree-reduce the threads' two partial sums; thread 0 adds them to acc
        sh1[tid] = a1
        sh2[tid] = a2
        cuda.syncthreads()
        s = TPB // 2
        while s > 0:
            if tid < s:
                sh1[tid] += sh1[tid + s]
                sh2[tid] += sh2[tid + s]
            cuda.syncthreads()
            s //= 2
        if tid == 0:
            cuda.atomic.add(acc, 0, sh1[0])
            cuda.atomic.add(acc, 1, sh2[0])

    @cuda.jit
    def _sum_kernel(b, n, acc):
        # grid-stride over words; each thread keeps its two partial sums
        sh1 = cuda.shared.array(TPB, uint64)
        sh2 = cuda.shared.array(TPB, uint64)
        tid = cuda.threadIdx.x
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        nw = (n + 3) // 4
        a1 = uint64(0)
        a2 = uint64(0)
        while i < nw:
            base = 4 * i
            if base + 4 <= n:
                x = (uint64(b[base]) | (uint64(b[base + 1]) << uint64(8))
                     | (uint64(b[base + 2]) << uint64(16))
                     | (uint64(b[base + 3]) << uint64(24)))
            else:
                x = uint64(0)
                for k in range(4):
                    if base + k < n:
                        x |= uint64(b[base + k]) << uint64(8 * k)
            a1 += x
            a2 += uint64(i + 1) * x
            i += stride
        _block_add(sh1, sh2, tid, a1, a2, acc)

    @cuda.jit
    def _sum_kernel_u32(w, nw, b, n, acc):
        # aligned fast path: one u32 load per word; the zero-padded tail
        # word (n % 4 bytes) is added by thread 0 of block 0
        sh1 = cuda.shared.array(TPB, uint64)
        sh2 = cuda.shared.array(TPB, uint64)
        tid = cuda.threadIdx.x
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        a1 = uint64(0)
        a2 = uint64(0)
        while i < nw:
            x = uint64(w[i])
            a1 += x
            a2 += uint64(i + 1) * x
            i += stride
        if cuda.grid(1) == 0 and n > 4 * nw:
            x = uint64(0)
            for k in range(n - 4 * nw):
                x |= uint64(b[4 * nw + k]) << uint64(8 * k)
            a1 += x
            a2 += uint64(nw + 1) * x
        _block_add(sh1, sh2, tid, a1, a2, acc)

    k = (_sum_kernel, _sum_kernel_u32, TPB)
    _cuda_kernels["sum"] = k
    return k


def _aligned4(d) -> bool:
    try:
        ptr = d.__cuda_array_interface__["data"][0]
    except AttributeError:  # the simulator's arrays
        return True
    return ptr % 4 == 0


def checksum32_cuda_start(d, stream=0):
    """Launch the reduction over the device uint8 array ``d``; returns the
    device accumulator (2 x uint64).  :func:`checksum32_cuda_finish` folds
    it on the host (one 16-byte copy)."""
    k8, k32, tpb = _kernels()
    n = d.size
    acc = cuda.to_device(np.zeros(2, np.uint64), stream=stream)
    if n == 0:
        return acc
    nw = (n + 3) // 4
    from numba import config
    sim = bool(config.ENABLE_CUDASIM)
    blocks = 1 if sim else min(1024, max(1, -(-nw // (tpb * 8))))
    n4 = n // 4
    if n4 and _aligned4(d):
        k32[blocks, tpb, stream](d[:n4 * 4].view(np.uint32), n4, d, n, acc)
    else:
        k8[blocks, tpb, stream](d, n, acc)
    return acc


def checksum32_cuda_finish(acc, stream=0) -> int:
    h = acc.copy_to_host(stream=stream)
    if stream:
        stream.synchronize()
    return int(fold(h[0], h[1]))


def checksum32_cuda(d, stream=0) -> int:
    """Checksum of the device uint8 array ``d`` (synchronises ``stream``)."""
    return checksum32_cuda_finish(checksum32_cuda_start(d, stream), stream)
