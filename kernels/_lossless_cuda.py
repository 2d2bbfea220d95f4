"""CUDA kernels of the lossless driver (kernels/lossless.py): choosing each
block's mode, the prefix sum of the encoded sizes, compaction of the chosen
encodings into table + payload, and the copy of raw blocks when decoding.
The modes' own kernels live in the mode modules."""

from __future__ import annotations

import numpy as np
from numba import config, cuda, int64, uint32

# threads per block; the simulator runs every thread in Python
TPB = 32 if config.ENABLE_CUDASIM else 256
SCAN_T = 32 if config.ENABLE_CUDASIM else 1024


@cuda.jit
def _select(sizes, nm, nb, bb, last, sel, ssz):
    i = cuda.grid(1)
    if i >= nb:
        return
    blen = bb if i < nb - 1 else last
    best = blen
    k = -1
    for j in range(nm):
        s = sizes[j * nb + i]
        if s >= 0 and s < best:
            best = s
            k = j
    sel[i] = k
    ssz[i] = best


@cuda.jit
def _scan(a, n):
    # exclusive prefix sum of a[0:n] in place, total in a[n]; one block
    tot = cuda.shared.array(SCAN_T, int64)
    t = cuda.threadIdx.x
    chunk = (n + SCAN_T - 1) // SCAN_T
    lo = t * chunk
    hi = lo + chunk
    if hi > n:
        hi = n
    if lo > n:
        lo = n
    s = int64(0)
    for i in range(lo, hi):
        s += a[i]
    tot[t] = s
    cuda.syncthreads()
    if t == 0:
        run = int64(0)
        for j in range(SCAN_T):
            v = tot[j]
            tot[j] = run
            run += v
        a[n] = run
    cuda.syncthreads()
    run = tot[t]
    for i in range(lo, hi):
        v = a[i]
        a[i] = run
        run += v


@cuda.jit
def _compact(src, scratch, slot, sel, off, mode_ids, nb, bb, out, tab_off, pay_off):
    i = cuda.blockIdx.x
    while i < nb:
        k = sel[i]
        o = pay_off + off[i]
        size = off[i + 1] - off[i]
        t = cuda.threadIdx.x
        if k < 0:
            base = i * bb
            while t < size:
                out[o + t] = src[base + t]
                t += cuda.blockDim.x
            mode = 0
        else:
            base = (k * nb + i) * slot
            while t < size:
                out[o + t] = scratch[base + t]
                t += cuda.blockDim.x
            mode = mode_ids[k]
        if cuda.threadIdx.x == 0:
            w = uint32(size) | (uint32(mode) << uint32(28))
            p = tab_off + 4 * i
            out[p] = w & uint32(0xFF)
            out[p + 1] = (w >> uint32(8)) & uint32(0xFF)
            out[p + 2] = (w >> uint32(16)) & uint32(0xFF)
            out[p + 3] = w >> uint32(24)
        i += cuda.gridDim.x


@cuda.jit
def _copy_raw(payload, offs, lens, ids, nsel, bb, dst):
    j = cuda.blockIdx.x
    while j < nsel:
        b = ids[j]
        o = offs[j]
        n = lens[j]
        base = b * bb
        t = cuda.threadIdx.x
        while t < n:
            dst[base + t] = payload[o + t]
            t += cuda.blockDim.x
        j += cuda.gridDim.x


@cuda.jit
def _fill_i32(a, v):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = v


def fill_i32(a, v, stream=0):
    if a.size:
        _fill_i32[(a.size + TPB - 1) // TPB, TPB, stream](a, v)


def _grid(n):
    return max(1, min(n, 65535 if not config.ENABLE_CUDASIM else 4))


def select(sizes, nm, nb, bb, last, sel, ssz, stream=0):
    """sel[i] = index into mode_ids of block i's smallest encoding (-1: raw),
    ssz[i] = its size."""
    _select[(nb + TPB - 1) // TPB, TPB, stream](sizes, nm, nb, bb, last, sel, ssz)


def exclusive_scan(a, n, stream=0):
    _scan[1, SCAN_T, stream](a, n)


def compact(src, scratch, slot, sel, off, mode_ids, nb, bb, last, out, tab_off,
            pay_off, stream=0):
    """Write the table (at tab_off) and the chosen encodings (from pay_off)
    into out."""
    mids = cuda.to_device(np.ascontiguousarray(mode_ids, np.int32), stream=stream)
    _compact[_grid(nb), TPB, stream](src, scratch, slot, sel, off, mids, nb, bb,
                                     out, tab_off, pay_off)


def copy_raw(payload, offs, lens, ids, nsel, bb, dst, stream=0):
    if nsel:
        _copy_raw[_grid(nsel), TPB, stream](payload, offs, lens, ids, nsel, bb, dst)
