"""Lossless block mode 1, EXP: entropy-coded float exponents, raw sign+mantissa.

For IEEE float16/32/64 blocks the exponent field carries almost all the
redundancy of gradient-like data (a few bits of entropy out of 5/8/11); the
sign and mantissa bits are close to random.  This mode codes each block's
exponents with a per-block, length-limited canonical Huffman code and stores
sign+mantissa as packed raw bits.

Block encoding (little-endian; ``n`` elements, ``nsub = ceil(n / 256)``
sub-blocks of :data:`SUB` elements, ``eb``/``mb`` exponent/mantissa bits:
5/10, 8/23, 11/52)::

    u8   variant          0: Huffman, 1: every exponent equal
  variant 1:
    u16  the exponent
  variant 0:
    u16  lo, u16 w        window of exponents lo .. lo+w-1 (symbols 0..w-1);
                          symbol w is the escape: its code is followed by
                          the exponent as eb raw bits
    (w+1) code lengths    4 bits each (0 = absent, 1..12), low nibble first,
                          padded to a byte
    (nsub-1) x u16        byte length of every sub-block stream but the last
                          (the last one takes the bytes left before the
                          mantissa section)
    nsub streams          each byte-aligned; codes packed LSB-first, the
                          canonical code's bits reversed so a 2**L table
                          lookup on the low bits decodes a symbol
  mantissa section (both variants):
    k byte planes         plane j holds byte j of every element's mantissa
                          (k = mb // 8: 1, 2, 6)
    top fields            r = mb - 8k + 1 bits per element (the mantissa's
                          top bits, then the sign; r = 3, 8, 5), packed
                          LSB-first into ceil(n*r/8) bytes

The code lengths must form a complete prefix code (Kraft sum exactly 1,
at least two symbols) and every stream must decode exactly its sub-block's
elements within its byte length (padding < 8 bits), else decoding fails.
Independent sub-block streams give a CPU decoder four interleaved bit
streams and a GPU decoder one thread per sub-block.

The CUDA kernels (:func:`encode_blocks_cuda`, :func:`decode_blocks_cuda`)
run the same plain-Python core routines compiled as device functions, so a
block encodes to the same bytes on either side.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["MODE_ID", "SUB", "max_block_bytes", "encode_block", "decode_block",
           "estimate_block", "encode_blocks_cuda", "decode_blocks_cuda"]

MODE_ID = 1
#: elements per sub-block stream
SUB = 256
#: longest code length the format allows (decoder table of 2**12 entries)
LMAX = 12
#: longest code length the encoder emits
ENC_LMAX = 11
#: variants (first payload byte)
V_HUFF = 0
V_CONST = 1

_U64 = np.uint64


def max_block_bytes(block_bytes: int, itemsize: int) -> int:
    """Worst case of this mode for one block.  The encoder gives up (-1)
    rather than exceed the ``dst`` it is handed, so this only bounds what a
    roomier ``dst`` could ever receive."""
    if itemsize not in (2, 4, 8) or block_bytes <= 0:
        return 0
    eb, mb, k, r = _params_py(itemsize)
    n = block_bytes // itemsize
    nsub = (n + SUB - 1) // SUB
    w = 1 << eb
    hdr = 5 + (w + 2) // 2 + 2 * (nsub - 1)
    return hdr + (n * (LMAX + eb) + 7) // 8 + nsub + k * n + (n * r + 7) // 8


def _params_py(itemsize):
    if itemsize == 2:
        return 5, 10, 1, 3
    if itemsize == 4:
        return 8, 23, 2, 8
    return 11, 52, 6, 5


# ---------------------------------------------------------------------------
# Core routines shared by the CPU (njit) and CUDA (device function) builds.
# Plain Python on arrays and ints, no allocation: scratch arrays come in.
# ---------------------------------------------------------------------------

def _huff_lengths(hist, lo, w, esc, lens, keys, wts, par, blc, limit):
    """Length-limited Huffman code lengths for window symbols 0..w-1
    (counts hist[lo+s]) and the escape symbol w (count esc) into lens[0..w].
    Returns the number of coded symbols (>= 2 for a real code)."""
    m = 0
    for s in range(w + 1):
        c = esc if s == w else hist[lo + s]
        lens[s] = 0
        if c > 0:
            keys[m] = (c << 12) | s
            m += 1
    if m < 2:
        for i in range(m):
            lens[keys[i] & 4095] = 1
        return m
    # Shell sort of keys[0:m] (distinct: count<<12 | symbol)
    gap = 1
    while gap < m // 3:
        gap = 3 * gap + 1
    while gap >= 1:
        for i in range(gap, m):
            v = keys[i]
            j = i
            while j >= gap and keys[j - gap] > v:
                keys[j] = keys[j - gap]
                j -= gap
            keys[j] = v
        gap //= 3
    # two-queue Huffman: leaves 0..m-1 (ascending weight), internal m..2m-2
    for i in range(m):
        wts[i] = keys[i] >> 12
    leaf = 0
    inner = m
    nxt = m
    for _ in range(m - 1):
        if leaf < m and (inner >= nxt or wts[leaf] <= wts[inner]):
            a = leaf
            leaf += 1
        else:
            a = inner
            inner += 1
        if leaf < m and (inner >= nxt or wts[leaf] <= wts[inner]):
            b = leaf
            leaf += 1
        else:
            b = inner
            inner += 1
        wts[nxt] = wts[a] + wts[b]
        par[a] = nxt
        par[b] = nxt
        nxt += 1
    root = 2 * m - 2
    par[root] = 0  # depth of the root, reusing par as depth from here down
    for i in range(root - 1, -1, -1):
        par[i] = par[par[i]] + 1
    for l in range(LMAX + 1):
        blc[l] = 0
    for i in range(m):
        d = par[i]
        if d > limit:
            d = limit
        blc[d] += 1
    # make the clipped code complete again (Kraft sum exactly 2**limit)
    total = 0
    for l in range(1, limit + 1):
        total += blc[l] << (limit - l)
    full = 1 << limit
    while total > full:
        blc[limit] -= 1
        for l in range(limit - 1, 0, -1):
            if blc[l] > 0:
                blc[l] -= 1
                blc[l + 1] += 2
                break
        total -= 1
    # longest codes to the rarest symbols (keys ascend by count)
    i = 0
    for l in range(limit, 0, -1):
        for _ in range(blc[l]):
            lens[keys[i] & 4095] = l
            i += 1
    return m


def _canon(lens, nsym, codes, blc, nxc):
    """Canonical codes (bit-reversed for LSB-first streams) for lens[0:nsym];
    returns the Kraft sum in units of 2**-LMAX, or -1 for a length > LMAX."""
    for l in range(LMAX + 1):
        blc[l] = 0
    for s in range(nsym):
        l = lens[s]
        if l > LMAX:
            return -1
        blc[l] += 1
    blc[0] = 0
    kraft = 0
    code = 0
    for l in range(1, LMAX + 1):
        kraft += blc[l] << (LMAX - l)
        code = (code + blc[l - 1]) << 1
        nxc[l] = code
    for s in range(nsym):
        l = lens[s]
        codes[s] = 0
        if l > 0:
            c = nxc[l]
            nxc[l] = c + 1
            rv = 0
            for _ in range(l):
                rv = (rv << 1) | (c & 1)
                c >>= 1
            codes[s] = rv
    return kraft


def _choose_window(hist, nall, eb):
    """Window (lo, w) over the present exponents, trimming rare outliers at
    either end when escaping them costs fewer bits than their table slots."""
    lo = 0
    while lo < nall and hist[lo] == 0:
        lo += 1
    hi = nall - 1
    while hi > lo and hist[hi] == 0:
        hi -= 1
    esc_cost = eb + 8
    changed = True
    while changed and hi > lo:
        changed = False
        nl = lo + 1
        while hist[nl] == 0:
            nl += 1
        if hist[lo] * esc_cost < 4 * (nl - lo):
            lo = nl
            changed = True
            if hi <= lo:
                break
        nh = hi - 1
        while hist[nh] == 0:
            nh -= 1
        if hist[hi] * esc_cost < 4 * (hi - nh):
            hi = nh
            changed = True
    return lo, hi - lo + 1


def _build_lut(lens, codes, w, lo, lut, tbits):
    """Decoder table of 2**tbits entries: length | escape<<5 | exponent<<8."""
    size = 1 << tbits
    for s in range(w + 1):
        l = lens[s]
        if l > 0:
            if s == w:
                ent = l | 32
            else:
                ent = l | ((lo + s) << 8)
            j = codes[s]
            step = 1 << l
            while j < size:
                lut[j] = ent
                j += step


def _enc_stream(exps, a, b, tcode, tlen, dst, p):
    """Codes of exps[a:b] as one byte-aligned stream at dst[p:]; returns the
    end position.  The caller has checked that the stream fits."""
    acc = 0
    nb = 0
    for i in range(a, b):
        x = exps[i]
        acc |= tcode[x] << nb
        nb += tlen[x]
        while nb >= 8:
            dst[p] = acc & 0xFF
            p += 1
            acc >>= 8
            nb -= 8
    if nb > 0:
        dst[p] = acc & 0xFF
        p += 1
    return p


def _dec_stream(enc, nenc, pos, a, b, lut, mask, eb, exps):
    """Decode exps[a:b] from the bit position pos of enc; returns the end bit
    position.  Bytes past nenc read as zero (the caller checks the end)."""
    emask = (1 << eb) - 1
    for i in range(a, b):
        q = pos >> 3
        bits = 0
        for k in range(4):
            if q + k < nenc:
                bits |= np.int64(enc[q + k]) << (8 * k)
        bits >>= pos & 7
        ent = lut[bits & mask]
        ln = ent & 31
        x = ent >> 8
        if ent & 32:
            x = (bits >> ln) & emask
            ln += eb
        pos += ln
        exps[i] = x
    return pos


def _parse_header(enc, nenc, p, eb, lens, codes, blc, nxc):
    """Parse variant 0's window and code lengths at enc[p:]; fills lens and
    codes (bit-reversed canonical) and returns (lo, w, tbits, end position),
    or w = -1 when inconsistent."""
    if p + 4 > nenc:
        return 0, -1, 0, p
    lo = np.int64(enc[p]) | (np.int64(enc[p + 1]) << 8)
    w = np.int64(enc[p + 2]) | (np.int64(enc[p + 3]) << 8)
    p += 4
    if w < 1 or lo + w > (1 << eb):
        return 0, -1, 0, p
    nl = (w + 2) // 2
    if p + nl > nenc:
        return 0, -1, 0, p
    nz = 0
    tbits = 0
    for s in range(w + 1):
        byte = np.int64(enc[p + (s >> 1)])
        l = (byte >> (4 * (s & 1))) & 15
        lens[s] = l
        if l > 0:
            nz += 1
        if l > tbits:
            tbits = l
    if (w & 1) == 0 and (np.int64(enc[p + nl - 1]) >> 4) != 0:
        return 0, -1, 0, p  # padding nibble must be zero
    p += nl
    if nz < 2:
        return 0, -1, 0, p
    kraft = _canon(lens, w + 1, codes, blc, nxc)
    if kraft != (1 << LMAX):
        return 0, -1, 0, p
    return lo, w, tbits, p


_CORE = ("_huff_lengths", "_canon", "_choose_window", "_build_lut",
         "_enc_stream", "_dec_stream", "_parse_header")


def _bind(deco):
    """The core routines compiled with ``deco`` (njit or a CUDA device jit),
    each resolving its calls to the others' compiled versions."""
    import types
    g = dict(globals())
    out = {}
    for name in _CORE:
        fn = globals()[name]
        f = types.FunctionType(fn.__code__, g, name, fn.__defaults__)
        f.__qualname__ = name + "_" + getattr(deco, "__name__", "jit")
        f.__module__ = __name__
        out[name] = g[name] = deco(f)
    return out


_cpu = _bind(njit(cache=True, nogil=True))
_huff_lengths_c = _cpu["_huff_lengths"]
_canon_c = _cpu["_canon"]
_choose_window_c = _cpu["_choose_window"]
_build_lut_c = _cpu["_build_lut"]
_enc_stream_c = _cpu["_enc_stream"]
_dec_stream_c = _cpu["_dec_stream"]
_parse_header_c = _cpu["_parse_header"]


@njit(cache=True, nogil=True, inline="always")
def _params(itemsize):
    if itemsize == 2:
        return 5, 10, 1, 3
    if itemsize == 4:
        return 8, 23, 2, 8
    return 11, 52, 6, 5


@njit(cache=True, nogil=True)
def _split(src, itemsize, n, exps, hist, dst, mo):
    """Exponents into exps and hist; sign+mantissa into the mantissa section
    at dst[mo:]."""
    if itemsize == 4:
        v = src.view(np.uint32)
        # four sub-histograms: runs of equal exponents do not serialize
        h4 = np.zeros((4, 256), np.int32)
        n4 = n & ~3
        for i in range(0, n4, 4):
            e0 = (v[i] >> 23) & 0xFF
            e1 = (v[i + 1] >> 23) & 0xFF
            e2 = (v[i + 2] >> 23) & 0xFF
            e3 = (v[i + 3] >> 23) & 0xFF
            h4[0, e0] += 1
            h4[1, e1] += 1
            h4[2, e2] += 1
            h4[3, e3] += 1
        for i in range(n4, n):
            h4[0, (v[i] >> 23) & 0xFF] += 1
        for x in range(256):
            hist[x] = h4[0, x] + h4[1, x] + h4[2, x] + h4[3, x]
        for i in range(n):
            exps[i] = (v[i] >> 23) & 0xFF
        p0 = dst[mo:mo + n]
        p1 = dst[mo + n:mo + 2 * n]
        p2 = dst[mo + 2 * n:mo + 3 * n]
        for i in range(n):
            x = v[i]
            p0[i] = x & 0xFF
            p1[i] = (x >> 8) & 0xFF
            p2[i] = ((x >> 16) & 0x7F) | ((x >> 24) & 0x80)
        return
    eb, mb, k, r = _params(itemsize)
    if itemsize == 2:
        v2 = src.view(np.uint16)
        for i in range(n):
            e = (np.int64(v2[i]) >> 10) & 0x1F
            exps[i] = e
            hist[e] += 1
    else:
        v8 = src.view(np.uint64)
        for i in range(n):
            e = (v8[i] >> np.uint64(52)) & np.uint64(0x7FF)
            exps[i] = e
            hist[e] += 1
    tsh = mb - 8 * k
    tmask = (1 << tsh) - 1
    acc = 0
    nb = 0
    q = mo + k * n
    for i in range(n):
        if itemsize == 2:
            x = np.int64(v2[i])
            sgn = x >> 15
        else:
            xu = v8[i]
            x = np.int64(xu & np.uint64(0x000FFFFFFFFFFFFF))
            sgn = np.int64(xu >> np.uint64(63))
        for j in range(k):
            dst[mo + j * n + i] = (x >> (8 * j)) & 0xFF
        acc |= (((x >> (8 * k)) & tmask) | (sgn << tsh)) << nb
        nb += r
        if nb >= 8:
            dst[q] = acc & 0xFF
            q += 1
            acc >>= 8
            nb -= 8
    if nb > 0:
        dst[q] = acc & 0xFF


@njit(cache=True, nogil=True)
def _join(enc, mo, itemsize, n, exps, dst):
    """Inverse of _split: exponents and the mantissa section into dst."""
    if itemsize == 4:
        v = dst.view(np.uint32)
        p0 = enc[mo:mo + n]
        p1 = enc[mo + n:mo + 2 * n]
        p2 = enc[mo + 2 * n:mo + 3 * n]
        for i in range(n):
            t = np.uint32(p2[i])
            v[i] = (np.uint32(p0[i]) | (np.uint32(p1[i]) << 8)
                    | ((t & 0x7F) << 16) | (np.uint32(exps[i]) << 23)
                    | ((t & 0x80) << 24))
        return
    eb, mb, k, r = _params(itemsize)
    tsh = mb - 8 * k
    tmask = (1 << tsh) - 1
    rmask = (1 << r) - 1
    acc = 0
    nb = 0
    q = mo + k * n
    for i in range(n):
        if nb < r:
            acc |= np.int64(enc[q]) << nb
            q += 1
            nb += 8
        t = acc & rmask
        acc >>= r
        nb -= r
        m = (t & tmask) << (8 * k)
        for j in range(k):
            m |= np.int64(enc[mo + j * n + i]) << (8 * j)
        if itemsize == 2:
            dst.view(np.uint16)[i] = (m | (np.int64(exps[i]) << 10)
                                      | ((t >> tsh) << 15))
        else:
            dst.view(np.uint64)[i] = (np.uint64(m)
                                      | (np.uint64(exps[i]) << np.uint64(52))
                                      | (np.uint64(t >> tsh) << np.uint64(63)))


@njit(cache=True, nogil=True)
def _mant_bytes(itemsize, n):
    eb, mb, k, r = _params(itemsize)
    return k * n + (n * r + 7) // 8


@njit(cache=True, nogil=True)
def encode_block(src, itemsize, isfloat, dst):
    if not isfloat or (itemsize != 2 and itemsize != 4 and itemsize != 8):
        return -1
    nbytes = src.size
    if nbytes == 0 or nbytes % itemsize != 0:
        return -1
    n = nbytes // itemsize
    eb, mb, k, r = _params(itemsize)
    nall = 1 << eb
    mant = _mant_bytes(itemsize, n)
    cap = dst.size
    if 1 + mant + 3 > cap:
        return -1
    exps = np.empty(n, np.int32)
    hist = np.zeros(nall, np.int64)
    _split(src, itemsize, n, exps, hist, dst, 1)
    lo, w = _choose_window_c(hist, nall, eb)
    esc = n
    for s in range(w):
        esc -= hist[lo + s]
    p = 1 + mant
    if esc == 0 and w == 1:
        dst[0] = V_CONST
        dst[p] = lo & 0xFF
        dst[p + 1] = lo >> 8
        return p + 2
    lens = np.empty(w + 1, np.int64)
    keys = np.empty(w + 1, np.int64)
    wts = np.empty(2 * w + 2, np.int64)
    par = np.empty(2 * w + 2, np.int64)
    blc = np.empty(LMAX + 1, np.int64)
    nxc = np.empty(LMAX + 1, np.int64)
    codes = np.empty(w + 1, np.int64)
    _huff_lengths_c(hist, lo, w, esc, lens, keys, wts, par, blc, ENC_LMAX)
    _canon_c(lens, w + 1, codes, blc, nxc)
    # per-exponent code (escape + raw exponent for values outside the window)
    tcode = np.empty(nall, np.int64)
    tlen = np.empty(nall, np.int64)
    el = lens[w]
    ec = codes[w]
    bits = 0
    for x in range(nall):
        s = x - lo
        if s >= 0 and s < w and lens[s] > 0:
            tcode[x] = codes[s]
            tlen[x] = lens[s]
        else:
            tcode[x] = ec | (x << el)
            tlen[x] = el + eb
        bits += hist[x] * tlen[x]
    nsub = (n + SUB - 1) // SUB
    hdr = 4 + (w + 2) // 2 + 2 * (nsub - 1)
    if p + hdr + (bits + 7) // 8 + nsub > cap:
        return -1
    dst[0] = V_HUFF
    dst[p] = lo & 0xFF
    dst[p + 1] = lo >> 8
    dst[p + 2] = w & 0xFF
    dst[p + 3] = w >> 8
    p += 4
    for s in range(0, w + 1, 2):
        lo_n = lens[s]
        hi_n = lens[s + 1] if s + 1 <= w else 0
        dst[p] = lo_n | (hi_n << 4)
        p += 1
    pl = p
    p += 2 * (nsub - 1)
    for sb in range(nsub):
        a = sb * SUB
        b = min(n, a + SUB)
        q = _enc_stream_c(exps, a, b, tcode, tlen, dst, p)
        if sb < nsub - 1:
            ln = q - p
            dst[pl + 2 * sb] = ln & 0xFF
            dst[pl + 2 * sb + 1] = ln >> 8
        p = q
    if p >= nbytes:
        return -1
    return p


@njit(cache=True, nogil=True)
def decode_block(enc, itemsize, isfloat, dst):
    if not isfloat or (itemsize != 2 and itemsize != 4 and itemsize != 8):
        return -1
    nbytes = dst.size
    nenc = enc.size
    if nbytes == 0 or nbytes % itemsize != 0 or nenc < 1:
        return -2
    n = nbytes // itemsize
    eb, mb, k, r = _params(itemsize)
    mant = _mant_bytes(itemsize, n)
    p = 1 + mant
    if p > nenc:
        return -3
    exps = np.empty(n, np.int32)
    var = enc[0]
    if var == V_CONST:
        if p + 2 != nenc:
            return -4
        e = np.int32(enc[p] | (np.int32(enc[p + 1]) << 8))
        if e >= (1 << eb):
            return -5
        exps[:] = e
        _join(enc, 1, itemsize, n, exps, dst)
        return 0
    if var != V_HUFF:
        return -6
    lens = np.empty((1 << eb) + 1, np.int64)
    codes = np.empty((1 << eb) + 1, np.int64)
    blc = np.empty(LMAX + 1, np.int64)
    nxc = np.empty(LMAX + 1, np.int64)
    lo, w, tbits, p = _parse_header_c(enc, nenc, p, eb, lens, codes, blc, nxc)
    if w < 0:
        return -7
    lut = np.empty(1 << tbits, np.int32)
    _build_lut_c(lens, codes, w, lo, lut, tbits)
    nsub = (n + SUB - 1) // SUB
    pl = p
    p += 2 * (nsub - 1)
    if p > nenc:
        return -8
    mask = (1 << tbits) - 1
    for sb in range(nsub):
        if sb < nsub - 1:
            ln = np.int64(enc[pl + 2 * sb]) | (np.int64(enc[pl + 2 * sb + 1]) << 8)
        else:
            ln = nenc - p
        if ln > nenc - p:
            return -9
        a = sb * SUB
        b = min(n, a + SUB)
        end = _dec_stream_c(enc, nenc, 8 * p, a, b, lut, mask, eb, exps)
        used = end - 8 * p
        if used > 8 * ln or used <= 8 * ln - 8:
            return -10
        p += ln
    _join(enc, 1, itemsize, n, exps, dst)
    return 0
