"""Lossless block mode 3 "ZERO": zero-word elimination with compact position
coding, for sparse and narrow integer data (see /work/notes/lossless_spec.md).

A block of ``L`` bytes is read as ``n = L / W`` little-endian words of ``W``
bytes, ``W`` the largest of 8, 4, 2, 1 dividing both the itemsize and ``L``
(int64/float64/complex: 8, int32/float32: 4, ...).  Words are optionally
zigzag-mapped (``zz(x) = (x << 1) ^ (x >> (8W-1) ? ~0 : 0)`` on ``8W`` bits)
so that small negative integers become small too.

Encoding of one block::

    byte 0   pmode (bits 0-1) | vmode << 2 | zigzag << 3   (bits 4-7 zero)
    byte 1   value parameter: bit width b (vmode 0), Rice k (vmode 1)
    [pmode 2 only]  byte 2: Rice k of the gaps (0..30); then m as LEB128 varint
    bit stream (LSB first in each byte, zero-padded to a whole byte):
        positions section, then values section, bit-contiguous

pmode (where the ``m`` nonzero words are):

* 0 DENSE  no positions: all ``n`` words are values (zeros included);
* 1 BITMAP ``n`` bits, bit ``i`` set when word ``i`` is nonzero (m = popcount);
* 2 GAPS   the ``m`` zero-run lengths before each nonzero word
  (``pos_i - pos_{i-1} - 1``, ``pos_{-1} = -1``), Rice-coded without escape.

vmode (how the values are stored; in pmodes 1 and 2 each stored value is
``zz(word) - 1``, since it is known to be nonzero):

* 0 FIXED  each value in ``b`` bits (``0 <= b <= 8W``);
* 1 RICE   with ``0 <= k < 8W``.

A Rice-coded sequence of ``c`` values is three streams, back to back::

    unary:      per value, min(q, QMAX) zero bits then a one bit (q = v >> k)
    remainders: per value, v & (2**k - 1) in k bits
    escapes:    per value with q >= QMAX, q - QMAX in ``escw`` bits

with ``QMAX = 24`` and ``escw = 8W - k`` (gaps: no escape, the unary part is
q zeros then a one).  Separate streams let a GPU find every code with
popcounts and prefix sums instead of parsing serially.  The decoder rejects anything not produced this way:
reserved bits, parameters out of range, a value that overflows the word, a
position past the block, a stream that ends early or late, non-zero
padding.

The encoder picks, per block, the cheapest (exact bit count, header
included) combination among: BITMAP (unless no word is zero), GAPS (when
``2m <= n``), DENSE (when ``2m >= n``); FIXED with the values' bit width or
RICE with k in ``k0 - 1 .. k0 + 1``, ``k0`` = bit length of the mean (values
clamped to 2**32) minus one; zigzag when it narrows the OR of the words.
Ties keep the earlier candidate.  It is all integer arithmetic, so the CUDA
encoder makes the same choices and writes the same bytes (tested).

CUDA: one CUDA block of ``TPB`` threads per codec block.  Encoder: the block
is copied once (coalesced) into shared memory; each thread owns a contiguous
run of words; block-wide prefix sums give each nonzero word its rank and
the previous nonzero word (for its gap), and each code's bit offsets in the
unary, remainder and escape streams; codes are OR-ed into a shared staging
buffer with atomics, then copied out.  Decoder: every thread takes a 32-bit
window of a unary stream (or of the bitmap), a prefix sum of the windows'
popcounts ranks the one bits, so each round locates TPB codes at once; the
remainders sit at fixed offsets, escapes are ranked by another prefix sum.
On a GPU the shared-memory scans could become warp shuffles / ballots; the
simulator used in CI implements neither.

Speed (one core, noisy shared machine, best of several runs): sparse int64
(bench ``make("sparse")``) ratio 84 with the block table; about 3.8 GB/s
encode and 5.9 GB/s decode over 16 MiB, 7.6 / 8.4 GB/s for a block in cache.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import cuda, int32, int64, njit, types, uint32, uint64
from numba.core.extending import intrinsic
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

__all__ = ["MODE_ID", "max_block_bytes", "encode_block", "decode_block",
           "estimate_block", "encode_blocks_cuda", "decode_blocks_cuda"]

MODE_ID = 3

P_DENSE = 0
P_BITMAP = 1
P_GAPS = 2
V_FIXED = 0
V_RICE = 1
QMAX = 24            # longest unary prefix of a value code (then escape)
KP_MAX = 30          # largest Rice parameter of the gaps
SUM_CLAMP = 1 << 32  # values are clamped to this when taking the mean
_HUGE = 1 << 62      # "cost" of an impossible variant

_U64 = np.uint64
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_M32 = np.uint64(0xFFFFFFFF)


def max_block_bytes(block_bytes: int, itemsize: int) -> int:
    """Worst case of an encoding this mode emits: the encoder never returns
    more than the caller's ``dst`` (the driver passes ``block_bytes``)."""
    return int(block_bytes)


# ---------------------------------------------------------------------------
# small helpers (shared by encoder and decoder)

@njit(cache=True, nogil=True, inline="always")
def _word_size(itemsize, nbytes):
    for w in (8, 4, 2, 1):
        if itemsize % w == 0 and nbytes % w == 0:
            return w
    return 1


@njit(cache=True, nogil=True, inline="always")
def _mask(W):
    if W >= 8:
        return _ONES
    return (_U64(1) << _U64(8 * W)) - _U64(1)


@njit(cache=True, nogil=True, inline="always")
def _bitlen(x):
    # number of significant bits of a uint64 (0 for 0)
    return 64 - np.int64(leading_zeros(_U64(x)))


def _unaligned_load(bits):
    @intrinsic
    def load(typingctx, arr, off):
        # arr[off:off+bits/8] as one little-endian word (arr: contiguous uint8)
        sig = types.uint64(arr, types.intp)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            pw = builder.bitcast(ptr, ir.IntType(bits).as_pointer())
            v = builder.load(pw, align=1)
            return v if bits == 64 else builder.zext(v, ir.IntType(64))
        return sig, codegen
    return load


def _unaligned_store(bits):
    @intrinsic
    def store(typingctx, arr, off, val):
        sig = types.void(arr, types.intp, types.uint64)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptr = builder.gep(ary.data, [args[1]])
            pw = builder.bitcast(ptr, ir.IntType(bits).as_pointer())
            v = args[2] if bits == 64 else builder.trunc(args[2], ir.IntType(bits))
            builder.store(v, pw, align=1)
            return context.get_dummy_value()
        return sig, codegen
    return store


def _checked_load(nbytes):
    @njit(cache=True, nogil=True, inline="always")
    def load(arr, off):
        v = _U64(0)
        for j in range(nbytes):
            v |= _U64(arr[off + j]) << _U64(8 * j)
        return v
    return load


def _checked_store(nbytes):
    @njit(cache=True, nogil=True, inline="always")
    def store(arr, off, v):
        for j in range(nbytes):
            arr[off + j] = np.uint8((v >> _U64(8 * j)) & _U64(0xFF))
    return store


if os.environ.get("NUMBA_BOUNDSCHECK", "") == "1":
    # indexed byte accesses, so that a bounds-checked build checks them too
    # (run such a build with its own NUMBA_CACHE_DIR)
    _ld16, _ld32, _ld64 = (_checked_load(b) for b in (2, 4, 8))
    _st16, _st32, _st64 = (_checked_store(b) for b in (2, 4, 8))
else:
    # little-endian hosts (x86-64, aarch64): a word's bytes are the wire's
    _ld16, _ld32, _ld64 = (_unaligned_load(b) for b in (16, 32, 64))
    _st16, _st32, _st64 = (_unaligned_store(b) for b in (16, 32, 64))


@njit(cache=True, nogil=True, inline="always")
def _load(src, off, W):
    # the W-byte little-endian word at src[off] (no bounds check: callers
    # guarantee off + W <= src.size)
    if W == 8:
        return _ld64(src, off)
    if W == 4:
        return _ld32(src, off)
    if W == 2:
        return _ld16(src, off)
    return _U64(src[off])


@njit(cache=True, nogil=True, inline="always")
def _store(dst, off, v, W):
    if W == 8:
        _st64(dst, off, v)
    elif W == 4:
        _st32(dst, off, v)
    elif W == 2:
        _st16(dst, off, v)
    else:
        dst[off] = np.uint8(v & _U64(0xFF))


@njit(cache=True, nogil=True, inline="always")
def _zz(x, W, mask):
    top = (x >> _U64(8 * W - 1)) & _U64(1)
    return ((x << _U64(1)) & mask) ^ (mask * top)


@njit(cache=True, nogil=True, inline="always")
def _unzz(z, W, mask):
    return (z >> _U64(1)) ^ (mask * (z & _U64(1)))


@njit(cache=True, nogil=True, inline="always")
def _k0(total, cnt, kmax):
    # starting Rice parameter from the (clamped) mean; candidates k0-1..k0+1
    if cnt <= 0:
        return 0
    mean = total // cnt
    k = _bitlen(_U64(mean)) - 1
    if k < 0:
        k = 0
    if k > kmax:
        k = kmax
    return k


@njit(cache=True, nogil=True)
def _rice_costs(vals, cnt, k0, kmax, escw_base, esc):
    """Exact bit cost of Rice coding vals[:cnt] with k in (k0-1, k0, k0+1);
    impossible candidates cost _HUGE.  esc: values (escape past QMAX,
    escape width escw_base - k) or gaps (plain unary)."""
    ka = k0 - 1
    kb = k0
    kc = k0 + 1
    sa = np.int64(0)
    sb = np.int64(0)
    sc = np.int64(0)
    ua = _U64(ka if ka >= 0 else 0)
    ub = _U64(kb)
    uc = _U64(kc if kc <= kmax else kmax)
    if esc:
        ea = 0
        eb = 0
        ec = 0
        for i in range(cnt):
            v = vals[i]
            qa = min(v >> ua, _U64(QMAX))
            qb = min(v >> ub, _U64(QMAX))
            qc = min(v >> uc, _U64(QMAX))
            ea += qa == _U64(QMAX)
            eb += qb == _U64(QMAX)
            ec += qc == _U64(QMAX)
            sa += np.int64(qa)
            sb += np.int64(qb)
            sc += np.int64(qc)
        sa += ea * (escw_base - ka)
        sb += eb * (escw_base - kb)
        sc += ec * (escw_base - kc)
    else:
        for i in range(cnt):
            v = vals[i]
            sa += np.int64(v >> ua)
            sb += np.int64(v >> ub)
            sc += np.int64(v >> uc)
    ca = sa + cnt * (ka + 1) if ka >= 0 else _HUGE
    cb = sb + cnt * (kb + 1)
    cc = sc + cnt * (kc + 1) if kc <= kmax else _HUGE
    best = cb
    bk = kb
    if ca < best:
        best = ca
        bk = ka
    if cc < best:
        best = cc
        bk = kc
    return best, bk


@njit(cache=True, nogil=True)
def _value_choice(vals, cnt, orv, total, W):
    """(bits, vmode, param) of the cheapest value coding of vals[:cnt]."""
    b = _bitlen(orv)
    fixed = cnt * b
    if cnt == 0 or b == 0:
        return fixed, V_FIXED, b
    kmax = 8 * W - 1
    rc, rk = _rice_costs(vals, cnt, _k0(total, cnt, kmax), kmax, 8 * W, True)
    if rc < fixed:
        return rc, V_RICE, rk
    return fixed, V_FIXED, b


# ---------------------------------------------------------------------------
# bit writer: (acc, nacc, pos) threaded through calls, 32 bits at a time

@njit(cache=True, nogil=True, inline="always")
def _put(dst, acc, nacc, pos, v, nb):
    # v < 2**nb, nb <= 32; nacc < 32 on entry and exit.  Branch-free: the
    # low 4 bytes of acc are stored every time and pos advances by 0 or 4;
    # dst must have 4 bytes of room past the encoding's end (unchecked).
    acc |= v << _U64(nacc)
    nacc += nb
    _st32(dst, pos, acc)
    adv = nacc >> 5
    pos += adv << 2
    acc >>= _U64(adv << 5)
    nacc &= 31
    return acc, nacc, pos


@njit(cache=True, nogil=True, inline="always")
def _put_wide(dst, acc, nacc, pos, v, nb):
    # v < 2**nb, nb <= 64
    if nb > 32:
        acc, nacc, pos = _put(dst, acc, nacc, pos, v & _M32, 32)
        return _put(dst, acc, nacc, pos, v >> _U64(32), nb - 32)
    return _put(dst, acc, nacc, pos, v, nb)


@njit(cache=True, nogil=True, inline="always")
def _put_unary(dst, acc, nacc, pos, q):
    while q >= 32:
        acc, nacc, pos = _put(dst, acc, nacc, pos, _U64(0), 32)
        q -= 32
    return _put(dst, acc, nacc, pos, _U64(1) << _U64(q), q + 1)


@njit(cache=True, nogil=True)
def _put_rice(dst, acc, nacc, pos, vals, cnt, k, esc, escw):
    uk = _U64(k)
    lowm = (_U64(1) << uk) - _U64(1)
    if esc:
        for i in range(cnt):
            q = min(vals[i] >> uk, _U64(QMAX))        # q + 1 <= 25 bits
            acc, nacc, pos = _put(dst, acc, nacc, pos, _U64(1) << q, np.int64(q) + 1)
    else:
        for i in range(cnt):
            acc, nacc, pos = _put_unary(dst, acc, nacc, pos, np.int64(vals[i] >> uk))
    if 0 < k <= 32:
        for i in range(cnt):
            acc, nacc, pos = _put(dst, acc, nacc, pos, vals[i] & lowm, k)
    elif k > 32:
        for i in range(cnt):
            acc, nacc, pos = _put_wide(dst, acc, nacc, pos, vals[i] & lowm, k)
    if esc:
        for i in range(cnt):
            q = vals[i] >> uk
            if q >= _U64(QMAX):
                acc, nacc, pos = _put_wide(dst, acc, nacc, pos, q - _U64(QMAX), escw)
    return acc, nacc, pos


@njit(cache=True, nogil=True)
def _put_values(dst, acc, nacc, pos, vals, cnt, vmode, param, W):
    if vmode == V_FIXED:
        if 0 < param <= 32:
            for i in range(cnt):
                acc, nacc, pos = _put(dst, acc, nacc, pos, vals[i], param)
        elif param > 32:
            for i in range(cnt):
                acc, nacc, pos = _put_wide(dst, acc, nacc, pos, vals[i], param)
        return acc, nacc, pos
    return _put_rice(dst, acc, nacc, pos, vals, cnt, param, True, 8 * W - param)


# ---------------------------------------------------------------------------
# encoder

@njit(cache=True, nogil=True, inline="always")
def _scan(src, n, W, mask, nzw):
    # called with a literal W so that each word size gets its own loop;
    # nzw[i] = 1 where word i is nonzero
    m = 0
    orv = _U64(0)
    orz = _U64(0)
    for i in range(n):
        x = _load(src, i * W, W)
        orv |= x
        orz |= _zz(x, W, mask)
        nz = x != _U64(0)
        m += np.int64(nz)
        nzw[i] = np.uint8(nz)
    return m, orv, orz


@njit(cache=True, nogil=True, inline="always")
def _gather(src, n, W, nzw, vals, idx):
    # the nonzero words and their indices, 8 flags at a time
    j = 0
    for g in range(0, n, 8):
        bits = _load(nzw, g, 8)
        while bits != _U64(0):
            i = g + (np.int64(trailing_zeros(bits)) >> 3)
            vals[j] = _load(src, i * W, W)
            idx[j] = _U64(i)
            j += 1
            bits &= bits - _U64(1)


@njit(cache=True, nogil=True, inline="always")
def _dense(src, n, W, mask, zz, dvals):
    tot = np.int64(0)
    for i in range(n):
        x = _load(src, i * W, W)
        if zz:
            x = _zz(x, W, mask)
        dvals[i] = x
        tot += np.int64(min(x, _U64(SUM_CLAMP)))
    return tot

@njit(cache=True, nogil=True)
def encode_block(src, itemsize, isfloat, dst):
    if src.strides[0] != 1 or dst.strides[0] != 1:
        return -1                  # word accesses need contiguous bytes
    L = src.size
    W = _word_size(itemsize, L)
    n = L // W
    if n == 0:
        return -1
    mask = _mask(W)
    # one pass: OR of the words and of their zigzag images, and a
    # branchless list of the nonzero words and their indices
    nzw = np.zeros(n + 8, np.uint8)
    if W == 8:
        m, orv, orz = _scan(src, n, 8, mask, nzw)
    elif W == 4:
        m, orv, orz = _scan(src, n, 4, mask, nzw)
    elif W == 2:
        m, orv, orz = _scan(src, n, 2, mask, nzw)
    else:
        m, orv, orz = _scan(src, n, 1, mask, nzw)
    # no zero word: positions cannot pay (a bitmap costs a bit a word and
    # saves at most a bit a value), so only DENSE is considered
    ms = 0 if m == n else m
    vals = np.empty(ms, np.uint64)
    gaps = np.empty(ms, np.uint64)
    if ms == 0:
        pass
    elif W == 8:
        _gather(src, n, 8, nzw, vals, gaps)
    elif W == 4:
        _gather(src, n, 4, nzw, vals, gaps)
    elif W == 2:
        _gather(src, n, 2, nzw, vals, gaps)
    else:
        _gather(src, n, 1, nzw, vals, gaps)
    zz = _bitlen(orz) < _bitlen(orv)
    # values zz(word) - 1, gaps = zero runs before each nonzero word
    prev = -1
    ors = _U64(0)
    tot = np.int64(0)
    for j in range(ms):
        x = vals[j]
        if zz:
            x = _zz(x, W, mask)
        x -= _U64(1)
        vals[j] = x
        ors |= x
        tot += np.int64(min(x, _U64(SUM_CLAMP)))
        i = np.int64(gaps[j])
        gaps[j] = _U64(i - prev - 1)
        prev = i

    # candidates
    sv_bits, sv_mode, sv_par = _value_choice(vals, ms, ors, tot, W)
    best = 16 + n + sv_bits                  # BITMAP (all costs in bits, header included)
    if m == n:
        best = _HUGE
    pmode = P_BITMAP
    vmode = sv_mode
    vpar = sv_par
    kp = 0
    if 2 * m <= n:                           # GAPS
        kmax = KP_MAX
        gtot = np.int64(prev + 1 - m)
        gc, gk = _rice_costs(gaps, m, _k0(gtot, m, kmax), kmax, 0, False)
        vb = 1
        mm = m >> 7
        while mm > 0:
            vb += 1
            mm >>= 7
        c = 8 * (3 + vb) + gc + sv_bits
        if c < best:
            best = c
            pmode = P_GAPS
            kp = gk
    dvals = vals
    if 2 * m >= n:                           # DENSE
        dvals = np.empty(n, np.uint64)
        if W == 8:
            dtot = _dense(src, n, 8, mask, zz, dvals)
        elif W == 4:
            dtot = _dense(src, n, 4, mask, zz, dvals)
        elif W == 2:
            dtot = _dense(src, n, 2, mask, zz, dvals)
        else:
            dtot = _dense(src, n, 1, mask, zz, dvals)
        dorv = orz if zz else orv
        dv_bits, dv_mode, dv_par = _value_choice(dvals, n, dorv, dtot, W)
        if 16 + dv_bits < best:
            best = 16 + dv_bits
            pmode = P_DENSE
            vmode = dv_mode
            vpar = dv_par
            kp = 0
    size = (best + 7) // 8
    if size > dst.size:
        return -1

    # write into a buffer with 8 bytes of slack (the bit writer stores 4
    # bytes at a time without bounds tests), then copy
    out = np.empty(size + 8, np.uint8)
    out[0] = np.uint8(pmode | (vmode << 2) | (np.int64(zz) << 3))
    out[1] = np.uint8(vpar)
    pos = 2
    if pmode == P_GAPS:
        out[2] = np.uint8(kp)
        pos = 3
        mm = m
        while mm >= 128:
            out[pos] = np.uint8((mm & 127) | 128)
            mm >>= 7
            pos += 1
        out[pos] = np.uint8(mm)
        pos += 1
    acc = _U64(0)
    nacc = 0
    if pmode == P_DENSE:
        acc, nacc, pos = _put_values(out, acc, nacc, pos, dvals, n, vmode, vpar, W)
    else:
        if pmode == P_BITMAP:
            for i0 in range(0, n, 32):
                bits = _U64(0)
                for t in range(min(32, n - i0)):
                    bits |= _U64(nzw[i0 + t]) << _U64(t)
                acc, nacc, pos = _put(out, acc, nacc, pos, bits, min(32, n - i0))
        else:
            acc, nacc, pos = _put_rice(out, acc, nacc, pos, gaps, m, kp, False, 0)
        acc, nacc, pos = _put_values(out, acc, nacc, pos, vals, m, vmode, vpar, W)
    while nacc > 0:
        if pos < out.size:
            out[pos] = np.uint8(acc & _U64(0xFF))
        pos += 1
        acc >>= _U64(8)
        nacc -= 8
    if pos != size:      # cannot happen: the cost model is exact
        return -1
    dst[:size] = out[:size]
    return size


# ---------------------------------------------------------------------------
# bit reader: stateless peeks at absolute bit positions, zeros past the end

@njit(cache=True, nogil=True, inline="always")
def _peek(enc, L, p):
    # >= 57 valid bits starting at bit p (bits past the encoding read 0)
    b = p >> 3
    sh = _U64(p & 7)
    if b + 8 <= L:
        return _load(enc, b, 8) >> sh
    w = _U64(0)
    for j in range(8):
        if b + j < L:
            w |= _U64(enc[b + j]) << _U64(8 * j)
    return w >> sh


@njit(cache=True, nogil=True, inline="always")
def _get(enc, L, p, nb):
    # nb <= 64
    if nb == 0:
        return _U64(0)
    if nb > 32:
        lo = _peek(enc, L, p) & _M32
        hi = _peek(enc, L, p + 32) & ((_U64(1) << _U64(nb - 32)) - _U64(1))
        return lo | (hi << _U64(32))
    return _peek(enc, L, p) & ((_U64(1) << _U64(nb)) - _U64(1))


@njit(cache=True, nogil=True)
def _get_values(enc, L, p, out, cnt, vmode, par, W, mask):
    """Decode cnt values into out; returns the bit position after them, or
    -1 on an inconsistency."""
    pend = 8 * L
    if vmode == V_FIXED:
        if par == 0:
            for i in range(cnt):
                out[i] = _U64(0)
            return p
        if p + cnt * par > pend:
            return -1
        if par <= 56:
            mk = (_U64(1) << _U64(par)) - _U64(1)
            # values whose 8-byte window lies inside enc: no bounds tests
            nfast = 0
            if 8 * L - 64 >= p:
                nfast = min(cnt, (8 * L - 64 - p) // par + 1)
            for i in range(nfast):
                out[i] = (_load(enc, p >> 3, 8) >> _U64(p & 7)) & mk
                p += par
            for i in range(nfast, cnt):
                out[i] = _peek(enc, L, p) & mk
                p += par
            return p
        for i in range(cnt):
            out[i] = _get(enc, L, p, par)
            p += par
        return p
    k = par
    uk = _U64(k)
    lim = mask >> uk
    nesc = 0
    umask = _U64((1 << (QMAX + 1)) - 1)
    plim = 8 * L - 64          # p <= plim: the 8-byte window at p >> 3 is inside
    i = 0
    while i < cnt:
        # every code ending inside one 57+-bit window, without reloading
        if p <= plim:
            w = _ld64(enc, p >> 3) >> _U64(p & 7)
        else:
            w = _peek(enc, L, p)
        if (w & umask) == _U64(0):
            return -1           # more than QMAX zeros, or the stream ended
        used = 0
        while w != _U64(0) and i < cnt:
            q = np.int64(trailing_zeros(w))
            if q > QMAX:
                return -1
            out[i] = _U64(q)
            nesc += q == QMAX
            i += 1
            w = (w >> _U64(q)) >> _U64(1)
            used += q + 1
        p += used
    if p > pend or p + cnt * k > pend:
        return -1
    bad = False
    if k <= 56:
        mk = (_U64(1) << uk) - _U64(1)
        for i in range(cnt):
            q = out[i]
            bad |= (q < _U64(QMAX)) & (q > lim)
            if p <= plim:
                r = (_ld64(enc, p >> 3) >> _U64(p & 7)) & mk
            else:
                r = _peek(enc, L, p) & mk
            out[i] = (q << uk) | r
            p += k
    else:
        for i in range(cnt):
            q = out[i]
            bad |= (q < _U64(QMAX)) & (q > lim)
            out[i] = (q << uk) | _get(enc, L, p, k)
            p += k
    if bad:
        return -1
    if nesc > 0:
        escw = 8 * W - k
        if p + nesc * escw > pend:
            return -1
        for i in range(cnt):
            v = out[i]
            q = v >> uk
            if q == _U64(QMAX):
                ev = _get(enc, L, p, escw)
                p += escw
                if lim < _U64(QMAX) or ev > lim - _U64(QMAX):
                    return -1
                q += ev
                out[i] = (q << uk) | (v & ((_U64(1) << uk) - _U64(1)))
    return p


@njit(cache=True, nogil=True, inline="always")
def _store_dense(dst, vals, n, W, zz, mask):
    # called with a literal W
    for i in range(n):
        v = vals[i]
        if zz:
            v = _unzz(v, W, mask)
        _store(dst, i * W, v, W)


@njit(cache=True, nogil=True, inline="always")
def _scatter(dst, vals, posn, m, W, zz, mask):
    # called with a literal W; stored values are word - 1 (words nonzero)
    lim = mask - _U64(1)
    for i in range(m):
        v = vals[i]
        if v > lim:
            return False
        v += _U64(1)
        if zz:
            v = _unzz(v, W, mask)
        _store(dst, posn[i] * W, v, W)
    return True


@njit(cache=True, nogil=True)
def decode_block(enc, itemsize, isfloat, dst):
    if enc.strides[0] != 1 or dst.strides[0] != 1:
        return -16                 # word accesses need contiguous bytes
    L = enc.size
    D = dst.size
    W = _word_size(itemsize, D)
    n = D // W
    if L < 2 or n == 0:
        return -1
    mask = _mask(W)
    b0 = np.int64(enc[0])
    pmode = b0 & 3
    vmode = (b0 >> 2) & 1
    zz = (b0 >> 3) & 1
    par = np.int64(enc[1])
    if (b0 >> 4) != 0 or pmode == 3:
        return -2
    if vmode == V_FIXED and par > 8 * W:
        return -3
    if vmode == V_RICE and par >= 8 * W:
        return -3
    pos = 2
    m = n
    kp = 0
    if pmode == P_GAPS:
        if L < 4:
            return -4
        kp = np.int64(enc[2])
        if kp > KP_MAX:
            return -5
        pos = 3
        m = 0
        sh = 0
        while True:
            if pos >= L or sh > 28:
                return -6
            c = np.int64(enc[pos])
            pos += 1
            m |= (c & 127) << sh
            sh += 7
            if c < 128:
                if c == 0 and sh > 7:
                    return -6      # non-canonical varint
                break
        if m > n:
            return -7
    p = 8 * pos
    pend = 8 * L
    if pmode == P_DENSE:
        vals = np.empty(n, np.uint64)
        p = _get_values(enc, L, p, vals, n, vmode, par, W, mask)
        if p < 0:
            return -8
        if W == 8:
            _store_dense(dst, vals, n, 8, zz, mask)
        elif W == 4:
            _store_dense(dst, vals, n, 4, zz, mask)
        elif W == 2:
            _store_dense(dst, vals, n, 2, zz, mask)
        else:
            _store_dense(dst, vals, n, 1, zz, mask)
    else:
        posn = np.empty(m if pmode == P_GAPS else n, np.int64)
        if pmode == P_BITMAP:
            if p + n > pend:
                return -9
            m = 0
            for i0 in range(0, n, 56):
                w = _peek(enc, L, p + i0)
                lim = min(56, n - i0)
                w &= (_U64(1) << _U64(lim)) - _U64(1)
                while w != _U64(0):
                    posn[m] = i0 + np.int64(trailing_zeros(w))
                    m += 1
                    w &= w - _U64(1)
            p += n
        else:
            # gaps: unary stream, then the kp-bit remainders
            last = -1
            for i in range(m):
                q = np.int64(0)
                while True:
                    w = _peek(enc, L, p)
                    if w != _U64(0):
                        t = np.int64(trailing_zeros(w))
                        q += t
                        p += t + 1
                        break
                    q += 56
                    p += 56
                    if p > pend:
                        return -10
                if q >= n:
                    return -10
                posn[i] = q
            if p > pend or p + m * kp > pend:
                return -10
            for i in range(m):
                g = (posn[i] << kp) | np.int64(_get(enc, L, p, kp))
                p += kp
                last += g + 1
                if last >= n:
                    return -11
                posn[i] = last
        vals = np.empty(m, np.uint64)
        p = _get_values(enc, L, p, vals, m, vmode, par, W, mask)
        if p < 0:
            return -12
        for i in range(D):
            dst[i] = 0
        if W == 8:
            ok = _scatter(dst, vals, posn, m, 8, zz, mask)
        elif W == 4:
            ok = _scatter(dst, vals, posn, m, 4, zz, mask)
        elif W == 2:
            ok = _scatter(dst, vals, posn, m, 2, zz, mask)
        else:
            ok = _scatter(dst, vals, posn, m, 1, zz, mask)
        if not ok:
            return -13
    # the stream must end exactly at the last byte, padding zero
    if (p + 7) >> 3 != L:
        return -14
    if p & 7:
        if (np.int64(enc[L - 1]) >> (p & 7)) != 0:
            return -15
    return 0


# ---------------------------------------------------------------------------
# estimate

@njit(cache=True, nogil=True)
def estimate_block(src, itemsize, isfloat):
    """Size estimate from 64 evenly spaced words: density, and the width of
    the values (raw or zigzag, whichever is narrower)."""
    L = src.size
    W = _word_size(itemsize, L)
    n = L // W
    if n == 0 or src.strides[0] != 1:
        return L + 1
    mask = _mask(W)
    step = max(1, n // 64)
    ns = 0
    ms = 0
    orv = _U64(0)
    orz = _U64(0)
    tv = np.int64(0)
    tz = np.int64(0)
    for i in range(0, n, step):
        x = _load(src, i * W, W)
        ns += 1
        if x != _U64(0):
            z = _zz(x, W, mask)
            ms += 1
            orv |= x
            orz |= z
            tv += np.int64(min(x, _U64(SUM_CLAMP)))
            tz += np.int64(min(z, _U64(SUM_CLAMP)))
    if ms == 0:
        return 4 + n // 512
    m = (ms * n + ns - 1) // ns
    vb = min(_bitlen(orv), _bitlen(_U64(tv // ms)) + 2)
    vz = min(_bitlen(orz), _bitlen(_U64(tz // ms)) + 2)
    vb = min(vb, vz)
    bits = n * vb                                    # dense
    if m < n:
        bits = min(bits, n + m * vb)                 # bitmap
        if 2 * m <= n:
            bits = min(bits, m * (_bitlen(_U64(n // m)) + 1 + vb))   # gaps
    return 4 + (bits + 7) // 8


# ---------------------------------------------------------------------------
# CUDA: the same format; one CUDA block of TPB threads per codec block

TPB = 128            # threads per CUDA block (one CUDA block per codec block)
_LOGTPB = 7
_CLAMP = np.uint64(SUM_CLAMP)
_U = np.uint64
_I = np.int64
_kern = {}


def _cuda_kernels():
    """Compile (once) and return the CUDA encode/decode kernels."""
    if _kern:
        return _kern["enc"], _kern["dec"]
    # -- device helpers ----------------------------------------------------
    @cuda.jit(device=True, inline=True)
    def c_min(a, b):
        return a if a < b else b

    @cuda.jit(device=True, inline=True)
    def c_max(a, b):
        return a if a > b else b

    @cuda.jit(device=True, inline=True)
    def c_word_size(itemsize, nbytes):
        if itemsize % 8 == 0 and nbytes % 8 == 0:
            return 8
        if itemsize % 4 == 0 and nbytes % 4 == 0:
            return 4
        if itemsize % 2 == 0 and nbytes % 2 == 0:
            return 2
        return 1

    @cuda.jit(device=True, inline=True)
    def c_mask(W):
        if W >= 8:
            return _U(0xFFFFFFFFFFFFFFFF)
        return (_U(1) << _U(8 * W)) - _U(1)

    @cuda.jit(device=True, inline=True)
    def c_bitlen(x):
        hi = uint32(x >> _U(32))
        if hi != 0:
            return _I(64 - cuda.clz(hi))
        lo = uint32(x & _U(0xFFFFFFFF))
        if lo != 0:
            return _I(32 - cuda.clz(lo))
        return _I(0)

    @cuda.jit(device=True, inline=True)
    def c_load(src, off, W):
        x = _U(0)
        for j in range(W):
            x |= _U(src[off + j]) << _U(8 * j)
        return x

    @cuda.jit(device=True, inline=True)
    def c_word(src, base, insh, in_words, i, W):
        """Word i of the block: from the shared copy when there is one."""
        if in_words == 0:
            return c_load(src, base + i * W, W)
        o = i * W
        w = insh[o >> 2]
        if W == 8:
            return _U(w) | (_U(insh[(o >> 2) + 1]) << _U(32))
        if W == 4:
            return _U(w)
        if W == 2:
            return _U((w >> uint32(8 * (o & 3))) & uint32(0xFFFF))
        return _U((w >> uint32(8 * (o & 3))) & uint32(0xFF))

    @cuda.jit(device=True, inline=True)
    def c_zz(x, W, mask):
        top = (x >> _U(8 * W - 1)) & _U(1)
        return ((x << _U(1)) & mask) ^ (mask * top)

    @cuda.jit(device=True, inline=True)
    def c_unzz(z, W, mask):
        return (z >> _U(1)) ^ (mask * (z & _U(1)))

    @cuda.jit(device=True, inline=True)
    def c_k0(total, cnt, kmax):
        if cnt <= 0:
            return _I(0)
        k = c_bitlen(_U(total // cnt)) - 1
        if k < 0:
            k = _I(0)
        if k > kmax:
            k = _I(kmax)
        return k

    @cuda.jit(device=True)
    def c_scan(sh, t, v):
        """Block-wide exclusive prefix sum of v (int64): (excl, total)."""
        sh[t] = v
        cuda.syncthreads()
        d = 1
        while d < TPB:
            x = _I(0)
            if t >= d:
                x = sh[t - d]
            cuda.syncthreads()
            sh[t] += x
            cuda.syncthreads()
            d *= 2
        incl = sh[t]
        tot = sh[TPB - 1]
        cuda.syncthreads()
        return incl - v, tot

    @cuda.jit(device=True)
    def c_scan_max(sh, t, v):
        """Block-wide exclusive max-scan of v (int64, identity -1): (excl, all)."""
        sh[t] = v
        cuda.syncthreads()
        d = 1
        while d < TPB:
            x = _I(-1)
            if t >= d:
                x = sh[t - d]
            cuda.syncthreads()
            if x > sh[t]:
                sh[t] = x
            cuda.syncthreads()
            d *= 2
        ex = _I(-1)
        if t > 0:
            ex = sh[t - 1]
        tot = sh[TPB - 1]
        cuda.syncthreads()
        return ex, tot

    @cuda.jit(device=True, inline=True)
    def c_rice_pick(s0, s1, s2, e0, e1, e2, cnt, k0, kmax, escw_base, esc):
        """The CPU's choice among k0-1, k0, k0+1 from the per-candidate sums."""
        best = s1 + cnt * (k0 + 1)
        if esc:
            best += e1 * (escw_base - k0)
        bk = k0
        if k0 - 1 >= 0:
            c = s0 + cnt * k0
            if esc:
                c += e0 * (escw_base - k0 + 1)
            if c < best:
                best = c
                bk = k0 - 1
        if k0 + 1 <= kmax:
            c = s2 + cnt * (k0 + 2)
            if esc:
                c += e2 * (escw_base - k0 - 1)
            if c < best:
                best = c
                bk = k0 + 1
        return best, bk

    @cuda.jit(device=True, inline=True)
    def c_put(stage, p, v, nb):
        """OR nb <= 32 bits of v at bit p of the shared staging words."""
        if nb <= 0:
            return
        w = p >> 5
        sh = p & 31
        x = v << _U(sh)
        cuda.atomic.or_(stage, w, uint32(x & _U(0xFFFFFFFF)))
        if sh + nb > 32:
            cuda.atomic.or_(stage, w + 1, uint32(x >> _U(32)))

    @cuda.jit(device=True, inline=True)
    def c_put_wide(stage, p, v, nb):
        if nb > 32:
            c_put(stage, p, v & _U(0xFFFFFFFF), 32)
            c_put(stage, p + 32, v >> _U(32), nb - 32)
        else:
            c_put(stage, p, v, nb)

    # -- encoder -------------------------------------------------------------
    @cuda.jit
    def enc_kernel(src, nblocks, block_bytes, last_bytes, itemsize, scratch,
                   slot_bytes, sizes, in_words, stage_words):
        # dynamic shared memory: the input block (in_words u32, 0 = read
        # global memory instead), then the output staging words
        dyn = cuda.shared.array(0, uint32)
        insh = dyn[:in_words]
        stage = dyn[in_words:]
        shs = cuda.shared.array(TPB, int64)
        red = cuda.shared.array(32, int64)
        ors = cuda.shared.array(4, uint64)
        bi = cuda.blockIdx.x
        t = cuda.threadIdx.x
        if bi >= nblocks:
            return
        L = _I(block_bytes)
        if bi == nblocks - 1:
            L = _I(last_bytes)
        base = _I(bi) * _I(block_bytes)
        W = c_word_size(itemsize, L)
        n = L // W
        mask = c_mask(W)
        C = (n + TPB - 1) // TPB
        i0 = c_min(n, t * C)
        i1 = c_min(n, i0 + C)
        if t < 32:
            red[t] = 0
        if t < 4:
            ors[t] = 0
        if in_words > 0:
            # one coalesced pass over the block; later passes read shared memory
            for j in range(t, (L + 3) // 4, TPB):
                w = uint32(0)
                for b in range(4):
                    if 4 * j + b < L:
                        w |= uint32(src[base + 4 * j + b]) << uint32(8 * b)
                insh[j] = w
        cuda.syncthreads()
        # phase 1: counts, ORs, last nonzero
        mt = _I(0)
        last = _I(-1)
        orv = _U(0)
        orz = _U(0)
        for i in range(i0, i1):
            x = c_word(src, base, insh, in_words, i, W)
            orv |= x
            orz |= c_zz(x, W, mask)
            if x != _U(0):
                mt += 1
                last = i
        cuda.atomic.or_(ors, 0, orv)
        cuda.atomic.or_(ors, 1, orz)
        mex, m = c_scan(shs, t, mt)
        prev0, lastall = c_scan_max(shs, t, last)
        orvA = ors[0]
        orzA = ors[1]
        zz = c_bitlen(orzA) < c_bitlen(orvA)
        dense = 2 * m >= n
        # phase 2: value sums and ORs for the mean-based Rice parameters
        so = _U(0)
        st = _I(0)
        dt = _I(0)
        for i in range(i0, i1):
            x = c_word(src, base, insh, in_words, i, W)
            if zz:
                x = c_zz(x, W, mask)
            if dense:
                dt += _I(c_min(x, _CLAMP))
            if x != _U(0):
                v = x - _U(1)
                so |= v
                st += _I(c_min(v, _CLAMP))
        cuda.atomic.or_(ors, 2, so)
        cuda.atomic.add(red, 0, st)
        cuda.atomic.add(red, 1, dt)
        cuda.syncthreads()
        kmaxv = _I(8 * W - 1)
        k0s = c_k0(red[0], m, kmaxv)
        k0g = c_k0(lastall + 1 - m, m, _I(KP_MAX))
        k0d = c_k0(red[1], n, kmaxv)
        # phase 3: exact costs of the candidates
        s = cuda.local.array(9, int64)
        e = cuda.local.array(6, int64)
        for j in range(9):
            s[j] = 0
        for j in range(6):
            e[j] = 0
        prev = prev0
        for i in range(i0, i1):
            x = c_word(src, base, insh, in_words, i, W)
            if zz:
                x = c_zz(x, W, mask)
            if dense:
                for c in range(3):
                    k = c_min(c_max(k0d - 1 + c, _I(0)), kmaxv)
                    q = c_min(x >> _U(k), _U(QMAX))
                    s[6 + c] += _I(q)
                    e[3 + c] += _I(q == _U(QMAX))
            if x != _U(0):
                v = x - _U(1)
                g = _U(i - prev - 1)
                prev = i
                for c in range(3):
                    k = c_min(c_max(k0s - 1 + c, _I(0)), kmaxv)
                    q = c_min(v >> _U(k), _U(QMAX))
                    s[c] += _I(q)
                    e[c] += _I(q == _U(QMAX))
                    kg = c_min(c_max(k0g - 1 + c, _I(0)), _I(KP_MAX))
                    s[3 + c] += _I(g >> _U(kg))
        for j in range(9):
            cuda.atomic.add(red, 2 + j, s[j])
        for j in range(6):
            cuda.atomic.add(red, 11 + j, e[j])
        cuda.syncthreads()
        # decision: the CPU encoder's rules, same order and ties
        escb = _I(8 * W)
        sb = c_bitlen(ors[2])
        sv_bits = m * sb
        sv_mode = V_FIXED
        sv_par = sb
        if m > 0 and sb > 0:
            rc, rk = c_rice_pick(red[2], red[3], red[4], red[11], red[12], red[13],
                                 m, k0s, kmaxv, escb, True)
            if rc < sv_bits:
                sv_bits = rc
                sv_mode = V_RICE
                sv_par = rk
        best = 16 + n + sv_bits
        if m == n:
            best = _HUGE
        pmode = P_BITMAP
        vmode = sv_mode
        vpar = sv_par
        kp = _I(0)
        vb = _I(1)
        if 2 * m <= n:
            gc, gk = c_rice_pick(red[5], red[6], red[7], 0, 0, 0, m, k0g,
                                 _I(KP_MAX), 0, False)
            mm = m >> 7
            while mm > 0:
                vb += 1
                mm >>= 7
            c = 8 * (3 + vb) + gc + sv_bits
            if c < best:
                best = c
                pmode = P_GAPS
                kp = gk
        if dense:
            db = c_bitlen(orzA if zz else orvA)
            dv_bits = n * db
            dv_mode = V_FIXED
            dv_par = db
            if db > 0:
                rc, rk = c_rice_pick(red[8], red[9], red[10], red[14], red[15],
                                     red[16], n, k0d, kmaxv, escb, True)
                if rc < dv_bits:
                    dv_bits = rc
                    dv_mode = V_RICE
                    dv_par = rk
            if 16 + dv_bits < best:
                best = 16 + dv_bits
                pmode = P_DENSE
                vmode = dv_mode
                vpar = dv_par
                kp = _I(0)
        size = (best + 7) // 8
        if size > L or size + 4 > 4 * stage_words:      # a spare word for c_put
            if t == 0:
                sizes[bi] = -1
            return
        nw = (size + 3) // 4
        for j in range(t, nw, TPB):
            stage[j] = 0
        cuda.syncthreads()
        hdr = _I(2)
        if pmode == P_GAPS:
            hdr = 3 + vb
        if t == 0:
            c_put(stage, _I(0), _U(pmode | (vmode << 2) | (_I(zz) << 3)), 8)
            c_put(stage, _I(8), _U(vpar), 8)
            if pmode == P_GAPS:
                c_put(stage, _I(16), _U(kp), 8)
                mm = m
                pb = _I(24)
                while mm >= 128:
                    c_put(stage, pb, _U((mm & 127) | 128), 8)
                    mm >>= 7
                    pb += 8
                c_put(stage, pb, _U(mm), 8)
        # phase 4: bit offsets of this thread's codes, then write them
        cnt = m
        rank0 = mex
        if pmode == P_DENSE:
            cnt = n
            rank0 = i0
        ug = _I(0)
        uv = _I(0)
        ne = _I(0)
        kv = _U(vpar)
        for i in range(i0, i1):
            x = c_word(src, base, insh, in_words, i, W)
            if zz:
                x = c_zz(x, W, mask)
            if pmode == P_DENSE or x != _U(0):
                v = x
                if pmode != P_DENSE:
                    v = x - _U(1)
                if vmode == V_RICE:
                    q = c_min(v >> kv, _U(QMAX))
                    uv += _I(q) + 1
                    ne += _I(q == _U(QMAX))
        if pmode == P_GAPS:
            prev = prev0
            for i in range(i0, i1):
                if c_word(src, base, insh, in_words, i, W) != _U(0):
                    ug += _I(_U(i - prev - 1) >> _U(kp)) + 1
                    prev = i
        ugx, ugt = c_scan(shs, t, ug)
        uvx, uvt = c_scan(shs, t, uv)
        nex, net = c_scan(shs, t, ne)
        P0 = 8 * hdr
        V0 = P0
        if pmode == P_BITMAP:
            V0 = P0 + n
        elif pmode == P_GAPS:
            V0 = P0 + ugt + m * kp
        R0 = V0 + uvt
        E0 = R0 + cnt * _I(vpar)
        escw = _I(8 * W) - _I(vpar)
        r = rank0
        pu = P0 + ugx
        vu = V0 + uvx
        pe = E0 + nex * escw
        prev = prev0
        for i in range(i0, i1):
            x = c_word(src, base, insh, in_words, i, W)
            nz = x != _U(0)
            if zz:
                x = c_zz(x, W, mask)
            if pmode == P_DENSE or nz:
                v = x
                if pmode != P_DENSE:
                    v = x - _U(1)
                    if pmode == P_BITMAP:
                        c_put(stage, P0 + i, _U(1), 1)
                    else:
                        g = _U(i - prev - 1)
                        prev = i
                        q = _I(g >> _U(kp))
                        c_put(stage, pu + q, _U(1), 1)
                        pu += q + 1
                        c_put(stage, P0 + ugt + r * kp,
                              g & ((_U(1) << _U(kp)) - _U(1)), kp)
                if vmode == V_FIXED:
                    c_put_wide(stage, V0 + r * _I(vpar), v, vpar)
                else:
                    q = v >> kv
                    qc = c_min(q, _U(QMAX))
                    c_put(stage, vu + _I(qc), _U(1), 1)
                    vu += _I(qc) + 1
                    c_put_wide(stage, R0 + r * _I(vpar), v & ((_U(1) << kv) - _U(1)), vpar)
                    if qc == _U(QMAX):
                        c_put_wide(stage, pe, q - _U(QMAX), escw)
                        pe += escw
                r += 1
        cuda.syncthreads()
        ob = _I(bi) * _I(slot_bytes)
        for j in range(t, size, TPB):
            scratch[ob + j] = (stage[j >> 2] >> uint32(8 * (j & 3))) & uint32(0xFF)
        if t == 0:
            sizes[bi] = size

    # -- decoder -------------------------------------------------------------
    @cuda.jit(device=True, inline=True)
    def c_get(pay, off, plen, p, nb):
        """nb <= 32 bits at bit p of pay[off:off+plen] (zeros past its end)."""
        if nb <= 0:
            return _U(0)
        b = p >> 3
        w = _U(0)
        for j in range(5):
            if b + j < plen:
                w |= _U(pay[off + b + j]) << _U(8 * j)
        return (w >> _U(p & 7)) & ((_U(1) << _U(nb)) - _U(1))

    @cuda.jit(device=True, inline=True)
    def c_get_wide(pay, off, plen, p, nb):
        if nb > 32:
            lo = c_get(pay, off, plen, p, 32)
            return lo | (c_get(pay, off, plen, p + 32, nb - 32) << _U(32))
        return c_get(pay, off, plen, p, nb)

    @cuda.jit(device=True)
    def c_select(pay, off, plen, cur, K, lim, ones, shs, t):
        """Bit positions of the next K (<= TPB) one bits at or after bit cur
        and before bit lim into ones[0:K]; returns False if there are fewer.
        Every thread scans a 32-bit window; a prefix sum of their popcounts
        ranks the ones (ballot/popc on a real GPU)."""
        found = _I(0)
        c = cur
        while found < K:
            if c >= lim:
                return False
            p = c + 32 * t
            w = uint32(0)
            if p < lim:
                nb = c_min(_I(32), lim - p)
                w = uint32(c_get(pay, off, plen, p, nb))
            pc = _I(cuda.popc(w))
            ex, tot = c_scan(shs, t, pc)
            r = found + ex
            while w != 0 and r < K:
                tz = cuda.ffs(w) - 1
                ones[r] = p + tz
                r += 1
                w &= w - uint32(1)
            found += tot
            c += 32 * TPB
            cuda.syncthreads()
        return True

    @cuda.jit(device=True)
    def c_kth(pay, off, plen, cur, K, lim, res, shs, t):
        """Bit position of the K-th one bit (K >= 1) at or after cur, -1 if none."""
        found = _I(0)
        c = cur
        if t == 0:
            res[0] = -1
        cuda.syncthreads()
        while found < K and c < lim:
            p = c + 32 * t
            w = uint32(0)
            if p < lim:
                nb = c_min(_I(32), lim - p)
                w = uint32(c_get(pay, off, plen, p, nb))
            pc = _I(cuda.popc(w))
            ex, tot = c_scan(shs, t, pc)
            r = found + ex
            if r < K and K <= r + pc:
                j = K - 1 - r
                while j > 0:
                    w &= w - uint32(1)
                    j -= 1
                res[0] = p + cuda.ffs(w) - 1
            found += tot
            c += 32 * TPB
        cuda.syncthreads()
        out = res[0]
        cuda.syncthreads()
        return out

    @cuda.jit
    def dec_kernel(pay, offsets, lengths, block_ids, nsel, block_bytes, last_bytes,
                   nblocks, itemsize, dst, err):
        shs = cuda.shared.array(TPB, int64)
        ones = cuda.shared.array(TPB, int64)
        vones = cuda.shared.array(TPB, int64)
        res = cuda.shared.array(4, int64)
        bad = cuda.shared.array(1, int32)
        j = cuda.blockIdx.x
        t = cuda.threadIdx.x
        if j >= nsel:
            return
        blk = _I(block_ids[j])
        off = _I(offsets[j])
        plen = _I(lengths[j])
        if blk < 0 or blk >= nblocks or off < 0 or plen < 2 or off + plen > pay.size:
            err[0] = 1
            return
        D = _I(block_bytes)
        if blk == nblocks - 1:
            D = _I(last_bytes)
        dbase = blk * _I(block_bytes)
        W = c_word_size(itemsize, D)
        n = D // W
        mask = c_mask(W)
        if n == 0 or dbase + D > dst.size:
            err[0] = 1
            return
        b0 = _I(pay[off])
        pmode = b0 & 3
        vmode = (b0 >> 2) & 1
        zz = (b0 >> 3) & 1
        par = _I(pay[off + 1])
        if (b0 >> 4) != 0 or pmode == 3 or (vmode == V_FIXED and par > 8 * W) \
                or (vmode == V_RICE and par >= 8 * W):
            err[0] = 1
            return
        hdr = _I(2)
        m = n
        kp = _I(0)
        if pmode == P_GAPS:
            kp = _I(pay[off + 2]) if plen > 2 else _I(99)
            m = _I(0)
            sh = _I(0)
            hdr = _I(3)
            ok = False
            while hdr < plen and sh <= 28:
                cb = _I(pay[off + hdr])
                hdr += 1
                m |= (cb & 127) << sh
                sh += 7
                if cb < 128:
                    ok = not (cb == 0 and sh > 7)
                    break
            if kp > KP_MAX or not ok or m > n:
                err[0] = 1
                return
        if t == 0:
            bad[0] = 0
        pend = 8 * plen
        P0 = 8 * hdr
        # section boundaries
        V0 = P0
        if pmode == P_BITMAP:
            if P0 + n > pend:
                err[0] = 1
                return
            cnt_t = _I(0)
            for c in range(P0 + 32 * t, P0 + n, 32 * TPB):
                cnt_t += _I(cuda.popc(uint32(c_get(pay, off, plen, c, c_min(_I(32), P0 + n - c)))))
            ex, m = c_scan(shs, t, cnt_t)
            V0 = P0 + n
        elif pmode == P_GAPS:
            ug = _I(0)
            if m > 0:
                e1 = c_kth(pay, off, plen, P0, m, pend, res, shs, t)
                if e1 < 0:
                    err[0] = 1
                    return
                ug = e1 + 1 - P0
            V0 = P0 + ug + m * kp
        cnt = m
        if pmode == P_DENSE:
            cnt = n
        R0 = V0
        if vmode == V_RICE and cnt > 0:
            e2 = c_kth(pay, off, plen, V0, cnt, pend, res, shs, t)
            if e2 < 0:
                err[0] = 1
                return
            R0 = e2 + 1
        E0 = R0 + cnt * par
        escw = 8 * W - par
        if pmode != P_DENSE:
            for i in range(t, D, TPB):
                dst[dbase + i] = 0
        cuda.syncthreads()
        # rounds of TPB codes
        pcur = P0
        vcur = V0
        pos_carry = _I(-1)
        esc_carry = _I(0)
        lim = mask
        if vmode == V_RICE:
            lim = mask >> _U(par)
        r0 = _I(0)
        while r0 < cnt:
            K = c_min(_I(TPB), cnt - r0)
            r = r0 + t
            pos = r
            if pmode == P_BITMAP:
                if not c_select(pay, off, plen, pcur, K, P0 + n, ones, shs, t):
                    err[0] = 1
                    return
                if t < K:
                    pos = ones[t] - P0
                pcur = ones[K - 1] + 1
            elif pmode == P_GAPS:
                if not c_select(pay, off, plen, pcur, K, pend, ones, shs, t):
                    err[0] = 1
                    return
                g = _I(0)
                if t < K:
                    before = pcur - 1
                    if t > 0:
                        before = ones[t - 1]
                    q = ones[t] - before - 1
                    if q >= n:
                        bad[0] = 1
                        q = _I(0)
                    g = ((q << kp) | _I(c_get(pay, off, plen, V0 - m * kp + r * kp, kp))) + 1
                gx, gt = c_scan(shs, t, g)
                pos = pos_carry + gx + g
                pos_carry += gt
                pcur = ones[K - 1] + 1
            v = _U(0)
            isesc = _I(0)
            q = _U(0)
            if vmode == V_FIXED:
                if t < K:
                    v = c_get_wide(pay, off, plen, V0 + r * par, par)
            else:
                if not c_select(pay, off, plen, vcur, K, pend, vones, shs, t):
                    err[0] = 1
                    return
                if t < K:
                    before = vcur - 1
                    if t > 0:
                        before = vones[t - 1]
                    qi = vones[t] - before - 1
                    if qi > QMAX:
                        bad[0] = 1
                        qi = _I(0)
                    q = _U(qi)
                    isesc = _I(qi == QMAX)
                    v = c_get_wide(pay, off, plen, R0 + r * par, par)
                vcur = vones[K - 1] + 1
            ex, et = c_scan(shs, t, isesc)
            if t < K:
                if isesc:
                    ev = c_get_wide(pay, off, plen, E0 + (esc_carry + ex) * escw, escw)
                    if lim < _U(QMAX) or ev > lim - _U(QMAX):
                        bad[0] = 1
                        ev = _U(0)
                    q += ev
                if vmode == V_RICE:
                    if q > lim:
                        bad[0] = 1
                    v |= q << _U(par)
                if pmode != P_DENSE:
                    if v >= mask:
                        bad[0] = 1
                    v += _U(1)
                if zz:
                    v = c_unzz(v, W, mask)
                if pos >= 0 and pos < n:
                    for jj in range(W):
                        dst[dbase + pos * W + jj] = (v >> _U(8 * jj)) & _U(0xFF)
                else:
                    bad[0] = 1
            esc_carry += et
            r0 += TPB
            cuda.syncthreads()
            if bad[0] != 0:
                break
        if bad[0] != 0:
            err[0] = 1
            return
        # the stream ends exactly at the last byte, padding zero
        end = E0 + esc_carry * escw
        if vmode == V_FIXED:
            end = V0 + cnt * par
        if t == 0:
            if (end + 7) >> 3 != plen:
                err[0] = 1
            elif (end & 7) != 0 and (_I(pay[off + plen - 1]) >> (end & 7)) != 0:
                err[0] = 1

    _kern["enc"] = enc_kernel
    _kern["dec"] = dec_kernel
    return enc_kernel, dec_kernel


def encode_blocks_cuda(src, nblocks, block_bytes, last_bytes, itemsize, isfloat,
                       scratch, slot_bytes, sizes, stream=0):
    """Encode every block on the GPU: one CUDA block of TPB threads per codec
    block, same bytes as :func:`encode_block`."""
    if nblocks <= 0:
        return
    enc_kernel, _ = _cuda_kernels()
    words = (int(block_bytes) + 3) // 4
    stage_words = min(words + 2, 6 * 1024)
    # the block's input in shared memory too when both fit in 48 KiB
    in_words = words if words + stage_words <= 12 * 1024 - 64 else 0
    enc_kernel[int(nblocks), TPB, stream, 4 * (in_words + stage_words)](
        src, int(nblocks), int(block_bytes), int(last_bytes), int(itemsize),
        scratch, int(slot_bytes), sizes, in_words, stage_words)


def decode_blocks_cuda(payload, offsets, lengths, block_ids, nsel, block_bytes,
                       last_bytes, nblocks, itemsize, isfloat, dst, err, stream=0):
    """Decode the listed blocks on the GPU (one CUDA block each)."""
    if nsel <= 0:
        return
    _, dec_kernel = _cuda_kernels()
    dec_kernel[int(nsel), TPB, stream](
        payload, offsets, lengths, block_ids, int(nsel), int(block_bytes),
        int(last_bytes), int(nblocks), int(itemsize), dst, err)
