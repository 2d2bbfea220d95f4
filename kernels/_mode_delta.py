"""Lossless block mode 2 "DELTA": integer prediction, bit-plane transpose and
zero-word elimination (smooth HPC fields, smooth or small integers).

Elements are little-endian unsigned words of ``ws`` bytes: the itemsize when
it is 1, 2, 4 or 8, otherwise the largest of 8, 4, 2, 1 dividing it (complex
numbers and records become runs of words).  Floats (``isfloat`` and itemsize
2, 4 or 8) are first mapped to a monotone integer (negative: all bits
flipped; positive: sign bit set) so that close values give close integers.

Each block picks one predictor; the residual of element ``i`` is

====== ===== ===================================================================
id     name  residual
====== ===== ===================================================================
0      NONE  ``x[i]`` (raw bits)
1      D1    ``sm(m[i] - m[i-1])``
2      D2    ``sm(m[i] - 2 m[i-1] + m[i-2])``
3      D3    ``sm(m[i] - 3 m[i-1] + 3 m[i-2] - m[i-3])``
4      XOR   ``x[i] ^ x[i-1]`` (raw bits)
====== ===== ===================================================================

where ``m`` is the (mapped) word, arithmetic is modulo ``2**(8 ws)``,
``sm`` reads the residual as a signed ``8 ws``-bit number ``e`` and stores
sign and magnitude, ``(|e| << 1) | (e < 0)`` modulo ``2**(8 ws)`` (so the most
negative value becomes 1): small residuals of either sign have few bits, and
multiples of ``2**k`` keep ``k`` zero low bits (unlike zigzag).  The history
before element 0 is the *seed* ``m[0]`` (``x[0]`` for XOR), so residual 0 is
always 0.

Residuals are cut into groups of 32 elements (the last group is padded with
zero residuals); a group is transposed into ``8 ws`` bit-plane words of 32
bits (bit ``j`` of plane ``b`` = bit ``b`` of the residual of element ``j``),
and only some planes are stored:

* WIDTH coding: one byte ``w`` per group, planes ``0 .. w-1`` stored;
* MASK coding: a ``ws``-byte bitmap per group (the OR of the group's
  residuals), exactly the planes whose bit is set stored: zero-word
  elimination, which also drops the low planes of data with trailing zeros.

Block payload::

    u8      variant: bits 0-2 predictor id, bit 3 coding (0 WIDTH, 1 MASK),
            bits 4-7 zero
    ws      seed, little-endian (0 for NONE)
    ngroups x (1 | ws)   group headers (width byte, or little-endian bitmap)
    planes  u32 little-endian, group by group, planes in increasing order

The encoder picks the predictor whose encoding (best coding) is smallest on
groups 0, 4, 8, ... (SAMPLE_STRIDE), then the coding exactly on the whole
block (WIDTH on a tie); CPU and CUDA encoders make the same choices and
write identical bytes.  The decoder checks every field, the exact length,
and that the padding residuals of the last group are zero; it never reads
or writes out of bounds (fuzzed with Numba's bounds checking on).

CPU layout: the residuals of two groups share a u64 (low and high halves;
one group per u64 for 8-byte words), 32 such rows x groups/2 columns, and
the five delta-swap rounds of the 32 x 32 bit transpose run as long loops
over whole runs of rows, which LLVM vectorises.  On a GPU each thread owns
a group and runs the same network in registers (see the CUDA section).
Blocks of any length that is a multiple of the itemsize; arrays may be any
1-D uint8 arrays (bytes are assembled explicitly, no views).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import intrinsic

__all__ = ["MODE_ID", "max_block_bytes", "encode_block", "decode_block",
           "estimate_block", "encode_blocks_cuda", "decode_blocks_cuda",
           "word_size"]

MODE_ID = 2
GROUP = 32
PRED_NONE, PRED_D1, PRED_D2, PRED_D3, PRED_XOR = 0, 1, 2, 3, 4
NPRED = 5
CODING_MASK = 8
#: encode: the predictor is chosen on groups 0, SAMPLE_STRIDE, 2*SAMPLE_STRIDE...
SAMPLE_STRIDE = 4
#: estimate_block: groups sampled (evenly spaced; 4 is cheaper, but the
#: driver then misjudges DELTA vs EXP on ~5% of the smooth field: +0.2 bit)
SAMPLE_GROUPS = 8
#: CUDA: most groups per block (shared-memory tables), threads per block
CUDA_MAX_GROUPS = 1024
CUDA_THREADS = 128

# error codes of decode_block
E_ARGS, E_SHORT, E_VARIANT, E_SEED, E_WIDTH, E_LENGTH, E_PAD = (
    -1, -2, -3, -4, -5, -6, -7)

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U8 = np.uint64(8)
_U32 = np.uint64(32)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_LO32 = np.uint64(0xFFFFFFFF)
_M16 = np.uint64(0x0000FFFF0000FFFF)
_M8 = np.uint64(0x00FF00FF00FF00FF)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_M2 = np.uint64(0x3333333333333333)
_M1 = np.uint64(0x5555555555555555)


def word_size(itemsize: int) -> int:
    """The word size (bytes) the mode works in for ``itemsize``; -1 if none."""
    if itemsize <= 0:
        return -1
    for w in (8, 4, 2):
        if itemsize % w == 0:
            return w
    return 1


def max_block_bytes(block_bytes: int, itemsize: int) -> int:
    """Worst-case encoded bytes of one block of ``block_bytes``."""
    ws = word_size(itemsize)
    if ws < 0:
        return 0
    ng = -(-(block_bytes // ws) // GROUP)
    return 1 + ws + ng * ws + ng * 32 * ws


# --------------------------------------------------------------------------
# shared helpers (plain Python bodies, compiled for the CPU here and for
# CUDA in _cuda_kernels; keep them free of numpy calls other than uint64)
# --------------------------------------------------------------------------

def _ws_py(itemsize):
    if itemsize <= 0:
        return -1
    if itemsize % 8 == 0:
        return 8
    if itemsize % 4 == 0:
        return 4
    if itemsize % 2 == 0:
        return 2
    return 1


def _get_py(a, p, ws):
    """Little-endian word of ``ws`` bytes at byte offset ``p`` of ``a``.
    (Unsigned indices spare Numba's negative-index fix-up, which would stop
    LLVM from merging the byte accesses into one load or store.)"""
    q = np.uint64(p)
    v = np.uint64(a[q])
    if ws >= 2:
        v |= np.uint64(a[q + np.uint64(1)]) << np.uint64(8)
        if ws >= 4:
            v |= np.uint64(a[q + np.uint64(2)]) << np.uint64(16)
            v |= np.uint64(a[q + np.uint64(3)]) << np.uint64(24)
            if ws == 8:
                v |= np.uint64(a[q + np.uint64(4)]) << np.uint64(32)
                v |= np.uint64(a[q + np.uint64(5)]) << np.uint64(40)
                v |= np.uint64(a[q + np.uint64(6)]) << np.uint64(48)
                v |= np.uint64(a[q + np.uint64(7)]) << np.uint64(56)
    return v


def _put_py(a, p, ws, v):
    q = np.uint64(p)
    a[q] = np.uint8(v & np.uint64(0xFF))
    if ws >= 2:
        a[q + np.uint64(1)] = np.uint8((v >> np.uint64(8)) & np.uint64(0xFF))
        if ws >= 4:
            a[q + np.uint64(2)] = np.uint8((v >> np.uint64(16)) & np.uint64(0xFF))
            a[q + np.uint64(3)] = np.uint8((v >> np.uint64(24)) & np.uint64(0xFF))
            if ws == 8:
                a[q + np.uint64(4)] = np.uint8((v >> np.uint64(32)) & np.uint64(0xFF))
                a[q + np.uint64(5)] = np.uint8((v >> np.uint64(40)) & np.uint64(0xFF))
                a[q + np.uint64(6)] = np.uint8((v >> np.uint64(48)) & np.uint64(0xFF))
                a[q + np.uint64(7)] = np.uint8(v >> np.uint64(56))


def _map_py(v, sign, mask):
    """Float bits -> monotone unsigned integer (a bijection)."""
    if v & sign:
        return (~v) & mask
    return v | sign


def _unmap_py(v, sign, mask):
    if v & sign:
        return v ^ sign
    return (~v) & mask


def _sm_py(e, mask, sh):
    """Sign-magnitude code of the (8 ws)-bit two's complement e."""
    e &= mask
    s = e >> sh
    mag = (e ^ (np.uint64(0) - s)) + s
    return ((mag << np.uint64(1)) | s) & mask


def _unsm_py(z, mask, sh):
    """Inverse of _sm (result modulo 2**(8 ws))."""
    s = z & np.uint64(1)
    e = ((z >> np.uint64(1)) ^ (np.uint64(0) - s)) + s
    if z == np.uint64(1):
        e = np.uint64(1) << sh
    return e & mask


def _resid_py(pred, v, p1, p2, p3, mask, sh):
    """Residual of ``v`` after words ``p1, p2, p3`` (newest first)."""
    if pred == 0:
        return v
    if pred == 4:
        return v ^ p1
    if pred == 1:
        e = v - p1
    elif pred == 2:
        e = v - (p1 + p1 - p2)
    else:
        e = v - (np.uint64(3) * (p1 - p2) + p3)
    return _sm(e, mask, sh)


def _bitlen_py(x):
    n = 0
    if x >> np.uint64(32):
        n += 32
        x >>= np.uint64(32)
    if x >> np.uint64(16):
        n += 16
        x >>= np.uint64(16)
    if x >> np.uint64(8):
        n += 8
        x >>= np.uint64(8)
    if x >> np.uint64(4):
        n += 4
        x >>= np.uint64(4)
    if x >> np.uint64(2):
        n += 2
        x >>= np.uint64(2)
    if x >> np.uint64(1):
        n += 1
        x >>= np.uint64(1)
    return n + int(x)


def _popc_py(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return int((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


def _tr_py(A):
    """In-place transpose of two 32x32 bit matrices held in the low and high
    halves of 32 u64 words: afterwards bit ``j`` of half ``h`` of ``A[b]`` is
    the former bit ``b`` of half ``h`` of ``A[j]``."""
    for k in range(16):
        t = ((A[k] >> np.uint64(16)) ^ A[k + 16]) & np.uint64(0x0000FFFF0000FFFF)
        A[k] ^= t << np.uint64(16)
        A[k + 16] ^= t
    for b in range(0, 32, 16):
        for k in range(b, b + 8):
            t = ((A[k] >> np.uint64(8)) ^ A[k + 8]) & np.uint64(0x00FF00FF00FF00FF)
            A[k] ^= t << np.uint64(8)
            A[k + 8] ^= t
    for b in range(0, 32, 8):
        for k in range(b, b + 4):
            t = ((A[k] >> np.uint64(4)) ^ A[k + 4]) & np.uint64(0x0F0F0F0F0F0F0F0F)
            A[k] ^= t << np.uint64(4)
            A[k + 4] ^= t
    for b in range(0, 32, 4):
        for k in range(b, b + 2):
            t = ((A[k] >> np.uint64(2)) ^ A[k + 2]) & np.uint64(0x3333333333333333)
            A[k] ^= t << np.uint64(2)
            A[k + 2] ^= t
    for k in range(0, 32, 2):
        t = ((A[k] >> np.uint64(1)) ^ A[k + 1]) & np.uint64(0x5555555555555555)
        A[k] ^= t << np.uint64(1)
        A[k + 1] ^= t


@intrinsic
def _ctlz(typingctx, x):
    """LLVM ctlz on a uint64 (64 for 0)."""
    def codegen(context, builder, sig, args):
        from llvmlite import ir
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))
    return types.uint64(types.uint64), codegen


@intrinsic
def _ctpop(typingctx, x):
    """LLVM ctpop on a uint64."""
    def codegen(context, builder, sig, args):
        return builder.ctpop(args[0])
    return types.uint64(types.uint64), codegen


_jit_inline = njit(inline="always", nogil=True, cache=True)


@_jit_inline
def _bitlen(x):
    return 64 - int(_ctlz(x))


@_jit_inline
def _popc(x):
    return int(_ctpop(x))


_get = _jit_inline(_get_py)
_put = _jit_inline(_put_py)
_map = _jit_inline(_map_py)
_unmap = _jit_inline(_unmap_py)
_resid = _jit_inline(_resid_py)
_sm = _jit_inline(_sm_py)
_unsm = _jit_inline(_unsm_py)
_tr = _jit_inline(_tr_py)
_ws = _jit_inline(_ws_py)


def _load_group_py(src, ws, flt, n, g, q, qm, sign, mask):
    """Words of elements g*32-3 .. g*32+31 of the block (index clamped at 0)
    into q (raw) and qm (mapped when flt); returns the group's element count."""
    i0 = g * 32
    cnt = min(32, n - i0)
    for k in range(cnt + 3):
        i = i0 - 3 + k
        if i < 0:
            i = 0
        v = _get(src, i * ws, ws)
        q[k] = v
        if flt:
            qm[k] = _map(v, sign, mask)
        else:
            qm[k] = v
    return cnt


def _group_ors_py(x, m, base, cnt, mask, sh, ors):
    """ors[p] = OR of the residuals of predictor p over elements
    base .. base+cnt-1 of x (raw words) / m (mapped), history below base
    (base >= 3)."""
    o0 = np.uint64(0)
    o1 = np.uint64(0)
    o2 = np.uint64(0)
    o3 = np.uint64(0)
    o4 = np.uint64(0)
    one = np.uint64(1)
    two = np.uint64(2)
    three = np.uint64(3)
    zero = np.uint64(0)
    for k in range(cnt):
        i = np.uint64(base + k)
        v = x[i]
        o0 |= v
        o4 |= v ^ x[i - one]
        v = m[i]
        a = m[i - one]
        b = m[i - two]
        o1 |= _sm(v - a, mask, sh)
        o2 |= _sm(v - (a + a - b), mask, sh)
        o3 |= _sm(v - (three * (a - b) + m[i - three]), mask, sh)
    ors[0] = o0
    ors[1] = o1 & mask
    ors[2] = o2 & mask
    ors[3] = o3 & mask
    ors[4] = o4


def _choose_py(wt, mt, ws, ng):
    """Best (predictor, mask coding, size) from per-predictor plane totals:
    smallest size; lower predictor id, then WIDTH, on ties."""
    best = 0
    bestmask = False
    bestsize = 1 << 62
    for p in range(5):
        sw = 1 + ws + ng + 4 * int(wt[p])
        sm = 1 + ws + ng * ws + 4 * int(mt[p])
        if sw < bestsize:
            bestsize = sw
            best = p
            bestmask = False
        if sm < bestsize:
            bestsize = sm
            best = p
            bestmask = True
    return best, bestmask, bestsize


def _group_resid_py(x, m, base, cnt, pred, mask, sh, r):
    """Residuals of predictor pred for elements base .. base+cnt-1 into
    r[0:32] (zero padded); returns their OR."""
    acc = np.uint64(0)
    for j in range(32):
        if j < cnt:
            i = base + j
            if pred == 0 or pred == 4:
                v = _resid(pred, x[i], x[i - 1], x[i - 2], x[i - 3], mask, sh)
            else:
                v = _resid(pred, m[i], m[i - 1], m[i - 2], m[i - 3], mask, sh)
        else:
            v = np.uint64(0)
        r[j] = v
        acc |= v
    return acc


def _carry_py(pred, r, cnt, s, mask, sh):
    """Summary of one decoded group for the block-level scan: for the
    predictor's state (x, d, e) the group adds s[0] to x / s[1] to d / s[2]
    to e given zero incoming state (see _dec_kernel_py)."""
    e = np.uint64(0)
    d = np.uint64(0)
    x = np.uint64(0)
    for j in range(cnt):
        z = r[j]
        if pred == 4:
            x ^= z
        elif pred == 1:
            x += _unsm(z, mask, sh)
        elif pred == 2:
            d += _unsm(z, mask, sh)
            x += d
        elif pred == 3:
            e += _unsm(z, mask, sh)
            d += e
            x += d
    s[0] = x
    s[1] = d
    s[2] = e


_load_group = _jit_inline(_load_group_py)
_group_ors = _jit_inline(_group_ors_py)
_choose = _jit_inline(_choose_py)


@njit(nogil=True, cache=True)
def _pick(x, m, n, ng, ws, mask, sh, ors, wt, mt):
    """Predictor with the smallest encoding over the sampled groups
    (every SAMPLE_STRIDE-th group, from 0)."""
    for p in range(NPRED):
        wt[p] = _U0
        mt[p] = _U0
    nsg = 0
    for g in range(0, ng, SAMPLE_STRIDE):
        _group_ors(x, m, g * 32 + 3, min(32, n - g * 32), mask, sh, ors)
        nsg += 1
        for p in range(NPRED):
            o = ors[p]
            wt[p] += _ctlz(_U0) - _ctlz(o)
            mt[p] += _ctpop(o)
    return _choose(wt, mt, ws, nsg)[0]


@njit(nogil=True, cache=True)
def estimate_block(src, itemsize, isfloat):
    """Estimated encode_block size from SAMPLE_GROUPS evenly spaced groups."""
    ws = _ws(itemsize)
    nb = src.size
    if ws <= 0 or nb == 0 or nb % itemsize != 0:
        return 1 << 30
    n = nb // ws
    ng = (n + 31) // 32
    nbits = 8 * ws
    mask = _ALL >> np.uint64(64 - nbits)
    sign = _U1 << np.uint64(nbits - 1)
    sh = np.uint64(nbits - 1)
    flt = isfloat and ws == itemsize and ws >= 2
    ns = min(ng, SAMPLE_GROUPS)
    q = np.empty(35, np.uint64)
    qm = np.empty(35, np.uint64)
    ors = np.empty(NPRED, np.uint64)
    wt = np.zeros(NPRED, np.int64)
    mt = np.zeros(NPRED, np.int64)
    for s in range(ns):
        g = (s * ng) // ns
        cnt = _load_group(src, ws, flt, n, g, q, qm, sign, mask)
        _group_ors(q, qm, 3, cnt, mask, sh, ors)
        for p in range(NPRED):
            wt[p] += _bitlen(ors[p])
            mt[p] += _popc(ors[p])
    for p in range(NPRED):
        wt[p] = (wt[p] * ng) // ns
        mt[p] = (mt[p] * ng) // ns
    return _choose(wt, mt, ws, ng)[2]


@njit(nogil=True, cache=True)
def _load(src, ws, n, x):
    """Raw words into x[3:n+3]; x[0:3] = x[3] (the seed history)."""
    if ws == 4:
        for i in range(n):
            x[i + 3] = _get(src, 4 * i, 4)
    elif ws == 8:
        for i in range(n):
            x[i + 3] = _get(src, 8 * i, 8)
    elif ws == 2:
        for i in range(n):
            x[i + 3] = _get(src, 2 * i, 2)
    else:
        for i in range(n):
            x[i + 3] = np.uint64(src[i])
    x[0] = x[3]
    x[1] = x[3]
    x[2] = x[3]


@njit(nogil=True, cache=True)
def _residuals(x, m, n, pred, mask, sh, r):
    """Residuals of predictor pred into r[0:n] (r[n:] zeroed)."""
    if pred == PRED_NONE:
        for i in range(n):
            r[i] = x[i + 3]
    elif pred == PRED_XOR:
        for i in range(n):
            r[i] = x[i + 3] ^ x[i + 2]
    elif pred == PRED_D1:
        for i in range(n):
            r[i] = _sm(m[i + 3] - m[i + 2], mask, sh)
    elif pred == PRED_D2:
        for i in range(n):
            r[i] = _sm(m[i + 3] - (m[i + 2] + m[i + 2] - m[i + 1]), mask, sh)
    else:
        for i in range(n):
            r[i] = _sm(m[i + 3] - (_U3 * (m[i + 2] - m[i + 1]) + m[i]), mask, sh)
    for i in range(n, r.size):
        r[i] = _U0


@njit(inline="always", nogil=True, cache=True)
def _round(T, lanes, j, m):
    """One delta-swap round of _tr on every column of T (flat, row-major
    32 x lanes).  Rows h .. h+j-1 swap with rows h+j .. h+2j-1, and each
    run of j rows is contiguous: one long, vectorisable loop per run."""
    sj = np.uint64(j)
    span = j * lanes
    for h in range(0, 32, 2 * j):
        ra = T[h * lanes:(h + j) * lanes]
        rb = T[(h + j) * lanes:(h + 2 * j) * lanes]
        for i in range(span):
            a = ra[i]
            b = rb[i]
            t = ((a >> sj) ^ b) & m
            ra[i] = a ^ (t << sj)
            rb[i] = b ^ t


@njit(nogil=True, cache=True)
def _trT(T, lanes):
    """_tr on each column of T (flat 32 x lanes): vectorises over lanes."""
    _round(T, lanes, 16, _M16)
    _round(T, lanes, 8, _M8)
    _round(T, lanes, 4, _M4)
    _round(T, lanes, 2, _M2)
    _round(T, lanes, 1, _M1)


@njit(nogil=True, cache=True)
def _fill(r, T, lanes, ws):
    """Residuals (natural order) into T (flat 32 x lanes): column l holds
    group l (ws 8) or groups 2l and 2l+1 in its low and high halves."""
    if ws == 8:
        for l in range(lanes):
            for j in range(32):
                T[j * lanes + l] = r[l * 32 + j]
    else:
        for l in range(lanes):
            for j in range(32):
                T[j * lanes + l] = r[l * 64 + j] | (r[l * 64 + 32 + j] << _U32)


@njit(nogil=True, cache=True)
def _unfill(T, lanes, ws, r):
    if ws == 8:
        for l in range(lanes):
            for j in range(32):
                r[l * 32 + j] = T[j * lanes + l]
    else:
        for l in range(lanes):
            for j in range(32):
                a = T[j * lanes + l]
                r[l * 64 + j] = a & _LO32
                r[l * 64 + 32 + j] = a >> _U32


@njit(nogil=True, cache=True)
def encode_block(src, itemsize, isfloat, dst):
    """Encode one block; bytes written, or -1 (not applicable / no room)."""
    return _encode(src, itemsize, isfloat, dst, -1, -1)


@njit(nogil=True, cache=True)
def _encode(src, itemsize, isfloat, dst, force_pred, force_mask):
    """encode_block; force_pred / force_mask (0, 1) >= 0 override the
    choices (tests use them to cover every variant)."""
    ws = _ws(itemsize)
    nb = src.size
    if ws <= 0 or nb == 0 or nb % itemsize != 0:
        return -1
    n = nb // ws
    ng = (n + 31) // 32
    nbits = 8 * ws
    mask = _ALL >> np.uint64(64 - nbits)
    sign = _U1 << np.uint64(nbits - 1)
    sh = np.uint64(nbits - 1)
    flt = isfloat and ws == itemsize and ws >= 2
    lanes = ng if ws == 8 else (ng + 1) // 2
    nr = lanes * (32 if ws == 8 else 64)
    work = np.empty(2 * (n + 3) + nr + 32 * lanes + ng + 3 * NPRED, np.uint64)
    x = work[0:n + 3]
    _load(src, ws, n, x)
    if flt:
        m = work[n + 3:2 * n + 6]
        for i in range(n + 3):
            m[i] = _map(x[i], sign, mask)
    else:
        m = x
    o = 2 * n + 6
    r = work[o:o + nr]
    o += nr
    T = work[o:o + 32 * lanes]
    o += 32 * lanes
    gor = work[o:o + ng]
    o += ng
    ors = work[o:o + NPRED]
    wt = work[o + NPRED:o + 2 * NPRED]
    mt = work[o + 2 * NPRED:o + 3 * NPRED]
    if force_pred >= 0:
        pred = force_pred
    else:
        pred = _pick(x, m, n, ng, ws, mask, sh, ors, wt, mt)
    _residuals(x, m, n, pred, mask, sh, r)
    wtot = 0
    mtot = 0
    for g in range(ng):
        acc = _U0
        for j in range(32):
            acc |= r[g * 32 + j]
        gor[g] = acc
        wtot += _bitlen(acc)
        mtot += _popc(acc)
    size_w = 1 + ws + ng + 4 * wtot
    size_m = 1 + ws + ng * ws + 4 * mtot
    usemask = size_m < size_w
    if force_mask >= 0:
        usemask = force_mask == 1
    size = size_m if usemask else size_w
    if size > dst.size:
        return -1
    dst[0] = np.uint8(pred | (CODING_MASK if usemask else 0))
    _put(dst, 1, ws, _U0 if pred == PRED_NONE else (m[3] if pred != PRED_XOR else x[3]))
    p = 1 + ws
    if usemask:
        for g in range(ng):
            _put(dst, p, ws, gor[g])
            p += ws
    else:
        for g in range(ng):
            w = _bitlen(gor[g])
            dst[np.uint64(p)] = np.uint8(w)
            p += 1
            gor[g] = _ALL >> np.uint64(64 - w) if w > 0 else _U0
    _fill(r, T, lanes, ws)
    _trT(T, lanes)
    for g in range(ng):
        gm = gor[g]
        if ws == 8:
            for b in range(64):
                if (gm >> np.uint64(b)) & _U1:
                    _put(dst, p, 4, (T[(b & 31) * lanes + g] >> np.uint64(b & 32)) & _LO32)
                    p += 4
        else:
            l = g >> 1
            s = np.uint64(32 * (g & 1))
            if gm & (gm + _U1) == _U0:      # planes 0 .. w-1
                for b in range(_bitlen(gm)):
                    _put(dst, p, 4, (T[np.uint64(b * lanes + l)] >> s) & _LO32)
                    p += 4
            else:
                for b in range(nbits):
                    if (gm >> np.uint64(b)) & _U1:
                        _put(dst, p, 4, (T[b * lanes + l] >> s) & _LO32)
                        p += 4
    return p


@njit(nogil=True, cache=True)
def _parse_headers(enc, ws, ng, gm):
    """Validate variant, seed and group headers; fill group plane masks gm.
    Returns (status, pred, seed, first plane byte)."""
    L = enc.size
    nbits = 8 * ws
    if L < 1 + ws:
        return E_SHORT, 0, _U0, 0
    var = int(enc[0])
    pred = var & 7
    usemask = (var & CODING_MASK) != 0
    if var & 0xF0 or pred >= NPRED:
        return E_VARIANT, 0, _U0, 0
    seed = _get(enc, 1, ws)
    if pred == PRED_NONE and seed != _U0:
        return E_SEED, 0, _U0, 0
    p = 1 + ws
    hb = ws if usemask else 1
    if L < p + ng * hb:
        return E_SHORT, 0, _U0, 0
    tot = 0
    if usemask:
        for g in range(ng):
            m = _get(enc, p, ws)
            p += ws
            gm[g] = m
            tot += _popc(m)
    else:
        for g in range(ng):
            w = int(enc[p])
            p += 1
            if w > nbits:
                return E_WIDTH, 0, _U0, 0
            gm[g] = _ALL >> np.uint64(64 - w) if w > 0 else _U0
            tot += w
    if p + 4 * tot != L:
        return E_LENGTH, 0, _U0, 0
    return 0, pred, seed, p


@njit(nogil=True, cache=True)
def decode_block(enc, itemsize, isfloat, dst):
    """Decode exactly enc into exactly dst; 0 or a negative error code."""
    ws = _ws(itemsize)
    nb = dst.size
    if ws <= 0 or nb == 0 or nb % itemsize != 0:
        return E_ARGS
    n = nb // ws
    ng = (n + 31) // 32
    nbits = 8 * ws
    lanes = ng if ws == 8 else (ng + 1) // 2
    work = np.empty(ng + 32 * lanes, np.uint64)
    gm = work[0:ng]
    st, pred, seed, p = _parse_headers(enc, ws, ng, gm)
    if st != 0:
        return st
    T = work[ng:ng + 32 * lanes]
    T[:] = _U0
    for g in range(ng):
        m = gm[g]
        if ws == 8:
            for b in range(64):
                if (m >> np.uint64(b)) & _U1:
                    T[(b & 31) * lanes + g] |= _get(enc, p, 4) << np.uint64(b & 32)
                    p += 4
        else:
            l = g >> 1
            s = np.uint64(32 * (g & 1))
            if m & (m + _U1) == _U0:      # planes 0 .. w-1
                for b in range(_bitlen(m)):
                    T[np.uint64(b * lanes + l)] |= _get(enc, p, 4) << s
                    p += 4
            else:
                for b in range(nbits):
                    if (m >> np.uint64(b)) & _U1:
                        T[b * lanes + l] |= _get(enc, p, 4) << s
                        p += 4
    _trT(T, lanes)
    # residuals of the padding of the last group must be zero
    g = ng - 1
    for j in range(n - g * 32, 32):
        if ws == 8:
            z = T[j * lanes + g]
        else:
            z = (T[j * lanes + (g >> 1)] >> np.uint64(32 * (g & 1))) & _LO32
        if z != _U0:
            return E_PAD
    flt = isfloat and ws == itemsize and ws >= 2
    if ws == 8:
        _reconstruct(T, lanes, ws, flt, n, pred, seed, dst,
                     np.empty(n, np.uint64))
    else:   # 32-bit scratch: half the cache footprint
        _reconstruct(T, lanes, ws, flt, n, pred, seed, dst,
                     np.empty(n, np.uint32))
    return 0


@njit(inline="always", nogil=True, cache=True)
def _colz(T, lanes, g, ws, j):
    """Residual of element j of group g from the transposed planes T."""
    if ws == 8:
        return T[np.uint64(j * lanes + g)]
    return (T[np.uint64(j * lanes + (g >> 1))] >> np.uint64((g & 1) << 5)) & _LO32


@njit(nogil=True, cache=True)
def _reconstruct(T, lanes, ws, flt, n, pred, seed, dst, r):
    """Undo the prediction from the transposed residuals T into r[0:n]
    (group by group, the running state carried), then unmap and store."""
    nbits = 8 * ws
    mask = _ALL >> np.uint64(64 - nbits)
    sign = _U1 << np.uint64(nbits - 1)
    sh = np.uint64(nbits - 1)
    ng = (n + 31) // 32
    # residuals back to natural order; signed ones decoded (independent
    # per element, so this loop vectorises), then the serial prefix sums
    if pred == PRED_NONE or pred == PRED_XOR:
        for g in range(ng):
            for j in range(min(32, n - g * 32)):
                r[g * 32 + j] = _colz(T, lanes, g, ws, j)
    else:
        for g in range(ng):
            for j in range(min(32, n - g * 32)):
                r[g * 32 + j] = _unsm(_colz(T, lanes, g, ws, j), mask, sh)
    x = seed
    d = _U0
    e = _U0
    if pred == PRED_XOR:
        for i in range(n):
            x ^= r[i]
            r[i] = x
    elif pred == PRED_D1:
        for i in range(n):
            x += r[i]
            r[i] = x
    elif pred == PRED_D2:
        for i in range(n):
            d += r[i]
            x += d
            r[i] = x
    elif pred == PRED_D3:
        for i in range(n):
            e += r[i]
            d += e
            x += d
            r[i] = x
    if flt and pred >= 1 and pred <= 3:
        # branch-free _unmap: xor with the sign bit (was positive) or all bits
        for i in range(n):
            v = r[i] & mask
            r[i] = v ^ (sign | (((v >> sh) - _U1) & mask))
    if ws == 4:
        for i in range(n):
            _put(dst, 4 * i, 4, r[i])
    elif ws == 8:
        for i in range(n):
            _put(dst, 8 * i, 8, r[i])
    elif ws == 2:
        for i in range(n):
            _put(dst, 2 * i, 2, r[i])
    else:
        for i in range(n):
            dst[np.uint64(i)] = np.uint8(r[i] & np.uint64(0xFF))


# --------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------

# One thread block per codec block, one thread per group of 32 elements
# (the block's groups must fit in CUDA_MAX_GROUPS threads).  Encode: the
# sampled groups' costs are summed with shared atomics, thread 0 picks the
# predictor exactly as _pick does, every thread builds its group's
# residuals and transposes them in registers (_tr), a block-wide
# (Hillis-Steele) prefix sum of plane counts gives each group its output
# offset.  Decode mirrors it; the predictor's running state (x, d, e) is
# carried across groups by a block-wide scan over per-group affine
# summaries (_carry, _scan_carry), then every thread rebuilds its group.
# The bodies are plain Python, compiled with cuda.jit against device
# versions of the CPU helpers (_cuda_kernels), so both write the same bytes.
# (Numba's simulator has no warp intrinsics, so the transpose is the
# register delta-swap network rather than ballots.)


def _scan_add_py(a, g, nt):
    """Inclusive prefix sum of a[0:nt] by the nt threads of the block
    (Hillis-Steele; every thread must call it)."""
    o = 1
    while o < nt:
        v = 0
        if g >= o:
            v = a[g - o]
        cuda.syncthreads()
        if g >= o:
            a[g] += v
        cuda.syncthreads()
        o *= 2


def _scan_carry_py(st, g, nt, pred):
    """Inclusive scan of the group summaries st[3g:3g+3] (see _carry): the
    composition of spans a (earlier) and b (L_b elements) is
    x = x_a + L_b d_a + L_b (L_b + 1) / 2 e_a + x_b, d = d_a + L_b e_a + d_b,
    e = e_a + e_b; XOR just xors.  Only spans of full groups are ever
    composed into a value that is used."""
    o = 1
    while o < nt:
        ax = np.uint64(0)
        ad = np.uint64(0)
        ae = np.uint64(0)
        if g >= o:
            ax = st[3 * (g - o)]
            ad = st[3 * (g - o) + 1]
            ae = st[3 * (g - o) + 2]
        cuda.syncthreads()
        if g >= o:
            if pred == 4:
                st[3 * g] ^= ax
            else:
                lb = np.uint64(32 * o)
                tb = (lb * (lb + np.uint64(1))) >> np.uint64(1)
                st[3 * g] += ax + lb * ad + tb * ae
                st[3 * g + 1] += ad + lb * ae
                st[3 * g + 2] += ae
        cuda.syncthreads()
        o *= 2


def _enc_kernel_py(src, nblocks, block_bytes, last_bytes, ws, flt, scratch,
                   slot_bytes, sizes):
    blk = cuda.blockIdx.x
    g = cuda.threadIdx.x
    wt = cuda.shared.array(5, np.int64)
    mt = cuda.shared.array(5, np.int64)
    tot = cuda.shared.array(4, np.int64)
    off = cuda.shared.array(CUDA_MAX_GROUPS, np.int32)
    nb = last_bytes if blk == nblocks - 1 else block_bytes
    n = nb // ws
    ng = (n + 31) // 32
    if nb <= 0 or nb % ws != 0 or ng > cuda.blockDim.x:
        if g == 0:
            sizes[blk] = -1
        return
    nbits = 8 * ws
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - nbits)
    sign = np.uint64(1) << np.uint64(nbits - 1)
    sh = np.uint64(nbits - 1)
    sb = src[blk * block_bytes:blk * block_bytes + nb]
    q = cuda.local.array(35, np.uint64)
    qm = cuda.local.array(35, np.uint64)
    r = cuda.local.array(32, np.uint64)
    ors = cuda.local.array(5, np.uint64)
    if g < 5:
        wt[g] = 0
        mt[g] = 0
    if g < 4:
        tot[g] = 0
    cuda.syncthreads()
    active = g < ng
    if active and g % SAMPLE_STRIDE == 0:
        cnt = _load_group(sb, ws, flt, n, g, q, qm, sign, mask)
        _group_ors(q, qm, 3, cnt, mask, sh, ors)
        for p in range(5):
            cuda.atomic.add(wt, p, _bitlen(ors[p]))
            cuda.atomic.add(mt, p, _popc(ors[p]))
    cuda.syncthreads()
    if g == 0:
        tot[2] = _choose(wt, mt, ws, (ng + SAMPLE_STRIDE - 1) // SAMPLE_STRIDE)[0]
    cuda.syncthreads()
    pred = tot[2]
    acc = np.uint64(0)
    if active:
        cnt = _load_group(sb, ws, flt, n, g, q, qm, sign, mask)
        acc = _group_resid(q, qm, 3, cnt, pred, mask, sh, r)
        cuda.atomic.add(tot, 0, _bitlen(acc))
        cuda.atomic.add(tot, 1, _popc(acc))
    cuda.syncthreads()
    size_w = 1 + ws + ng + 4 * tot[0]
    size_m = 1 + ws + ng * ws + 4 * tot[1]
    usemask = size_m < size_w
    size = size_m if usemask else size_w
    if size > nb or size > slot_bytes:
        if g == 0:
            sizes[blk] = -1
        return
    if usemask:
        gm = acc
    else:
        w = _bitlen(acc)
        gm = np.uint64(0)
        if w > 0:
            gm = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - w)
    mine = _popc(gm) if active else 0
    off[g] = mine
    cuda.syncthreads()
    _scan_add(off, g, cuda.blockDim.x)
    if g == 0:
        sizes[blk] = size
    out = scratch[blk * slot_bytes:blk * slot_bytes + size]
    hdr = 1 + ws + ng * (ws if usemask else 1)
    if g == 0:
        out[0] = np.uint8(pred + (8 if usemask else 0))
        seed = np.uint64(0)
        if pred != 0:
            seed = _get(sb, 0, ws)
            if pred != 4 and flt:
                seed = _map(seed, sign, mask)
        _put(out, 1, ws, seed)
    if active:
        if usemask:
            _put(out, 1 + ws + g * ws, ws, acc)
        else:
            out[1 + ws + g] = np.uint8(_bitlen(acc))
        A = cuda.local.array(32, np.uint64)
        for j in range(32):
            A[j] = r[j]
        _tr(A)
        p = hdr + 4 * (off[g] - mine)
        for b in range(nbits):
            if (gm >> np.uint64(b)) & np.uint64(1):
                _put(out, p, 4, (A[b & 31] >> np.uint64(b & 32)) & np.uint64(0xFFFFFFFF))
                p += 4


def _dec_kernel_py(payload, offsets, lengths, block_ids, nsel, block_bytes,
                   last_bytes, nblocks, ws, flt, dst, err):
    j = cuda.blockIdx.x
    g = cuda.threadIdx.x
    if j >= nsel:
        return
    blk = block_ids[j]
    st = cuda.shared.array(CUDA_ST_LEN, np.uint64)
    off = cuda.shared.array(CUDA_MAX_GROUPS, np.int32)
    info = cuda.shared.array(4, np.int64)
    if blk < 0 or blk >= nblocks:
        if g == 0:
            err[0] = 1
        return
    nb = last_bytes if blk == nblocks - 1 else block_bytes
    n = nb // ws
    ng = (n + 31) // 32
    e0 = offsets[j]
    L = lengths[j]
    o0 = blk * block_bytes
    if (nb <= 0 or nb % ws != 0 or ng > cuda.blockDim.x or e0 < 0 or L < 0
            or e0 + L > payload.size or o0 + nb > dst.size):
        if g == 0:
            err[0] = 1
        return
    enc = payload[e0:e0 + L]
    out = dst[o0:o0 + nb]
    nbits = 8 * ws
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - nbits)
    sign = np.uint64(1) << np.uint64(nbits - 1)
    sh = np.uint64(nbits - 1)
    if g == 0:
        info[0] = 0       # bad
        info[1] = 0       # pred
        info[2] = 0       # usemask
        info[3] = 0       # header end
        if L < 1 + ws:
            info[0] = 1
        else:
            var = int(enc[0])
            hb = ws if var & 8 else 1
            if var & 0xF0 or (var & 7) >= 5 or L < 1 + ws + ng * hb:
                info[0] = 1
            elif (var & 7) == 0 and _get(enc, 1, ws) != np.uint64(0):
                info[0] = 1
            info[1] = var & 7
            info[2] = 1 if var & 8 else 0
            info[3] = 1 + ws + ng * hb
    cuda.syncthreads()
    if info[0] != 0:
        if g == 0:
            err[0] = 1
        return
    pred = info[1]
    usemask = info[2] != 0
    hdr = info[3]
    active = g < ng
    gm = np.uint64(0)
    if active:
        if usemask:
            gm = _get(enc, 1 + ws + g * ws, ws)
        else:
            w = int(enc[1 + ws + g])
            if w > nbits:
                info[0] = 1
            elif w > 0:
                gm = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - w)
    mine = _popc(gm)
    off[g] = mine
    cuda.syncthreads()
    _scan_add(off, g, cuda.blockDim.x)
    if g == 0 and hdr + 4 * off[ng - 1] != L:
        info[0] = 1
    cuda.syncthreads()
    if info[0] != 0:
        if g == 0:
            err[0] = 1
        return
    A = cuda.local.array(32, np.uint64)
    s = cuda.local.array(3, np.uint64)
    cnt = min(32, n - g * 32)
    st[3 * g] = np.uint64(0)
    st[3 * g + 1] = np.uint64(0)
    st[3 * g + 2] = np.uint64(0)
    if active:
        p = hdr + 4 * (off[g] - mine)
        for b in range(32):
            A[b] = np.uint64(0)
        for b in range(nbits):
            if (gm >> np.uint64(b)) & np.uint64(1):
                A[b & 31] |= _get(enc, p, 4) << np.uint64(b & 32)
                p += 4
        _tr(A)
        for k in range(cnt, 32):
            if A[k] != np.uint64(0):
                info[0] = 1
        _carry(pred, A, cnt, s, mask, sh)
        st[3 * g] = s[0]
        st[3 * g + 1] = s[1]
        st[3 * g + 2] = s[2]
    cuda.syncthreads()
    if info[0] != 0:
        if g == 0:
            err[0] = 1
        return
    _scan_carry(st, g, cuda.blockDim.x, pred)
    x = _get(enc, 1, ws)
    d = np.uint64(0)
    e = np.uint64(0)
    if g > 0:
        if pred == 4:
            x ^= st[3 * g - 3]
        else:
            x += st[3 * g - 3]
        d = st[3 * g - 2]
        e = st[3 * g - 1]
    if active:
        domap = flt and pred >= 1 and pred <= 3
        for k in range(cnt):
            z = A[k]
            if pred == 0:
                x = z
            elif pred == 4:
                x ^= z
            elif pred == 1:
                x += _unsm(z, mask, sh)
            elif pred == 2:
                d += _unsm(z, mask, sh)
                x += d
            else:
                e += _unsm(z, mask, sh)
                d += e
                x += d
            v = x & mask
            if domap:
                v = _unmap(v, sign, mask)
            _put(out, (g * 32 + k) * ws, ws, v)


_cuda_cache = {}


def _cuda_kernels():
    """(encode kernel, decode kernel), compiled on first use."""
    if "k" in _cuda_cache:
        return _cuda_cache["k"]
    import types as _pytypes
    from numba import cuda

    # shared-array shapes must be constants: precomputed, not expressions
    G = {"np": np, "cuda": cuda, "CUDA_MAX_GROUPS": CUDA_MAX_GROUPS,
         "CUDA_ST_LEN": 3 * CUDA_MAX_GROUPS, "SAMPLE_STRIDE": SAMPLE_STRIDE}

    def dev(name, f):
        G[name] = cuda.jit(device=True)(
            _pytypes.FunctionType(f.__code__, G, f.__name__))

    def _imin(a, b):
        # the builtin min(int, int) does not compile in numba 0.68's CUDA target
        return a if a < b else b
    G["min"] = cuda.jit(device=True)(_imin)

    for name, f in (("_get", _get_py), ("_put", _put_py), ("_map", _map_py),
                    ("_unmap", _unmap_py), ("_sm", _sm_py),
                    ("_unsm", _unsm_py), ("_bitlen", _bitlen_py),
                    ("_popc", _popc_py), ("_tr", _tr_py),
                    ("_resid", _resid_py), ("_load_group", _load_group_py),
                    ("_group_ors", _group_ors_py), ("_choose", _choose_py),
                    ("_group_resid", _group_resid_py),
                    ("_carry", _carry_py), ("_scan_add", _scan_add_py),
                    ("_scan_carry", _scan_carry_py)):
        dev(name, f)
    enc = cuda.jit(_pytypes.FunctionType(_enc_kernel_py.__code__, G, "_enc_kernel"))
    dec = cuda.jit(_pytypes.FunctionType(_dec_kernel_py.__code__, G, "_dec_kernel"))
    _cuda_cache["k"] = (enc, dec)
    return enc, dec


def _threads(block_bytes, ws):
    ng = -(-(block_bytes // ws) // GROUP)
    return max(32, min(CUDA_MAX_GROUPS, -(-ng // 32) * 32))


def encode_blocks_cuda(src, nblocks, block_bytes, last_bytes, itemsize,
                       isfloat, scratch, slot_bytes, sizes, stream=0):
    """Encode nblocks blocks of the device array src on the GPU: block i's
    encoding at scratch[i*slot_bytes:], its size (or -1) in sizes[i]."""
    if nblocks <= 0:
        return
    ws = word_size(itemsize)
    enc, _ = _cuda_kernels()
    flt = bool(isfloat) and ws == itemsize and ws >= 2
    enc[nblocks, _threads(block_bytes, ws), stream](
        src, nblocks, block_bytes, last_bytes, ws, flt, scratch, slot_bytes,
        sizes)


def decode_blocks_cuda(payload, offsets, lengths, block_ids, nsel, block_bytes,
                       last_bytes, nblocks, itemsize, isfloat, dst, err,
                       stream=0):
    """Decode the nsel blocks block_ids[:nsel] (encodings at
    payload[offsets[j]:offsets[j]+lengths[j]]) into dst; err[0] = 1 on any
    inconsistency."""
    if nsel <= 0:
        return
    ws = word_size(itemsize)
    _, dec = _cuda_kernels()
    flt = bool(isfloat) and ws == itemsize and ws >= 2
    dec[nsel, _threads(block_bytes, ws), stream](
        payload, offsets, lengths, block_ids, nsel, block_bytes, last_bytes,
        nblocks, ws, flt, dst, err)
