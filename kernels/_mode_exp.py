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
    u16  lo, u16 w        window of exponents lo .. lo+w-1 (symbols 0..w-1,
                          lo >= 1, 1 <= w <= WMAX = 256); symbol w is the
                          escape: its code is followed by the exponent as eb
                          raw bits; symbol w+1 is exponent 0 (zeros and
                          denormals, often far from the rest)
    (w+2) code lengths    4 bits each (0 = absent, 1..12), low nibble first,
                          a zero nibble pads to a byte; canonical codes:
                          shorter first, then by symbol
    (nsub-1) x u16        byte length of every sub-block stream but the last
                          (the last one ends where the mantissa section
                          starts)
    nsub streams          each byte-aligned, canonical codes MSB-first, so a
                          2**L-entry table on the next L bits decodes a
                          symbol and every code owns a contiguous range
  mantissa section (both variants, the last bytes of the block):
    k byte planes         plane j holds byte j of every element
                          (k = mb // 8: 1, 2, 6)
    top fields            r = mb - 8k + 1 bits per element (the mantissa's
                          top bits, then the sign; r = 3, 8, 5), packed
                          LSB-first into ceil(n*r/8) bytes

The code lengths must form a complete prefix code (Kraft sum exactly 1,
at least two symbols) and every stream must decode exactly its sub-block's
elements within its byte length (padding < 8 bits), else decoding fails.
Independent sub-block streams give a CPU decoder eight interleaved bit
streams and a GPU decoder one thread per sub-block; the mantissa section
after the streams lets the CPU decoder read 4-byte windows without bounds
checks.

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
ENC_LMAX = 9
#: widest exponent window (wider spreads keep the densest WMAX exponents in
#: the table and escape the rest)
WMAX = 256
#: most sub-blocks per block the CUDA kernels handle (blocks up to
#: 64 Ki elements; bigger ones are left to other modes on the GPU)
MAXSUB = 256
#: threads per CUDA block (one CUDA block per codec block)
TPB = 128
#: blocks of up to this many elements keep their exponents in shared memory
#: on the GPU (all of the default 8 KiB blocks)
STAGE = 4096
#: variants (first payload byte)
V_HUFF = 0
V_CONST = 1

_U1 = np.uint64(1)
_U2 = np.uint64(2)
_U3 = np.uint64(3)
_U4 = np.uint64(4)
_U5 = np.uint64(5)
_U6 = np.uint64(6)
_U7 = np.uint64(7)
_U8 = np.uint64(8)
_S16 = np.uint64(16)
_S24 = np.uint64(24)
_S32 = np.uint64(32)
_S40 = np.uint64(40)
_S48 = np.uint64(48)
_S56 = np.uint64(56)


def max_block_bytes(block_bytes: int, itemsize: int) -> int:
    """Worst case of this mode for one block.  The encoder gives up (-1)
    rather than exceed the ``dst`` it is handed, so this only bounds what a
    roomier ``dst`` could ever receive."""
    if itemsize not in (2, 4, 8) or block_bytes <= 0:
        return 0
    eb, mb, k, r = _params_py(itemsize)
    n = block_bytes // itemsize
    nsub = (n + SUB - 1) // SUB
    hdr = 5 + (WMAX + 3) // 2 + 2 * (nsub - 1)
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
    (counts hist[lo+s]), the escape symbol w (count esc) and the zero
    exponent w+1 (count hist[0]) into lens[0..w+1].  Returns the number of
    coded symbols (>= 2 for a real code)."""
    m = 0
    for s in range(w + 2):
        if s < w:
            c = hist[lo + s]
        elif s == w:
            c = esc
        else:
            c = hist[0]
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
    """Canonical codes (MSB-first) for lens[0:nsym];
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
            codes[s] = nxc[l]
            nxc[l] += 1
    return kraft


def _choose_window(hist, nall, eb):
    """Window (lo, w) over the present nonzero exponents (exponent 0, zeros
    and denormals, has a symbol of its own), trimming rare outliers at
    either end when escaping them costs fewer bits than their table slots,
    and at most WMAX wide (the densest such range).  w = 0 when every
    exponent is 0."""
    lo = 1
    while lo < nall and hist[lo] == 0:
        lo += 1
    if lo == nall:
        return 0, 0
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
    if hi - lo + 1 > WMAX:
        best = -1
        run = 0
        for x in range(lo, hi + 1):
            run += hist[x]
            if x - WMAX >= lo:
                run -= hist[x - WMAX]
            if x - WMAX + 1 >= lo and run > best:
                best = run
                bl = x - WMAX + 1
        lo = bl
        hi = bl + WMAX - 1
        while hist[lo] == 0:
            lo += 1
        while hist[hi] == 0:
            hi -= 1
    return lo, hi - lo + 1


def _build_lut(lens, codes, w, lo, lut, tbits):
    """Decoder table of 2**tbits entries, indexed by the next tbits bits:
    length | escape<<4 | exponent<<5.  A code owns a contiguous range."""
    for s in range(w + 2):
        l = lens[s]
        if l > 0:
            if s == w:
                ent = l | 16
            elif s == w + 1:
                ent = l
            else:
                ent = l | ((lo + s) << 5)
            j = codes[s] << (tbits - l)
            for k in range(j, j + (1 << (tbits - l))):
                lut[k] = ent


def _dec_stream(enc, nenc, pos, a, b, lut, tbits, eb, exps):
    """Decode exps[a:b] from the bit position pos of enc; returns the end bit
    position.  Bytes past nenc read as zero (the caller checks the end)."""
    emask = (1 << eb) - 1
    tb = 32 - tbits
    for i in range(a, b):
        q = pos >> 3
        v = 0
        for k in range(4):
            v <<= 8
            if q + k < nenc:
                v |= np.int64(enc[q + k])
        v = (v << (pos & 7)) & 0xFFFFFFFF
        ent = lut[v >> tb]
        ln = ent & 15
        x = ent >> 5
        if ent & 16:
            x = (v >> (32 - ln - eb)) & emask
            ln += eb
        pos += ln
        exps[i] = x
    return pos


def _parse_header(enc, nenc, p, eb, lens, codes, blc, nxc):
    """Parse variant 0's window and code lengths at enc[p:]; fills lens and
    codes (canonical, MSB-first) and returns (lo, w, tbits, end position),
    or w = -1 when inconsistent."""
    if p + 4 > nenc:
        return 0, -1, 0, p
    lo = np.int64(enc[p]) | (np.int64(enc[p + 1]) << 8)
    w = np.int64(enc[p + 2]) | (np.int64(enc[p + 3]) << 8)
    p += 4
    if w < 1 or w > WMAX or lo < 1 or lo + w > (1 << eb):
        return 0, -1, 0, p
    nl = (w + 3) // 2
    if p + nl > nenc:
        return 0, -1, 0, p
    nz = 0
    tbits = 0
    for s in range(w + 2):
        byte = np.int64(enc[p + (s >> 1)])
        l = (byte >> (4 * (s & 1))) & 15
        lens[s] = l
        if l > 0:
            nz += 1
        if l > tbits:
            tbits = l
    if (w & 1) == 1 and (np.int64(enc[p + nl - 1]) >> 4) != 0:
        return 0, -1, 0, p  # padding nibble must be zero
    p += nl
    if nz < 2:
        return 0, -1, 0, p
    kraft = _canon(lens, w + 2, codes, blc, nxc)
    if kraft != (1 << LMAX):
        return 0, -1, 0, p
    return lo, w, tbits, p


_CORE = ("_huff_lengths", "_canon", "_choose_window", "_build_lut",
         "_dec_stream", "_parse_header")


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
_dec_stream_c = _cpu["_dec_stream"]
_parse_header_c = _cpu["_parse_header"]


# --- CPU fast paths (same format as the core stream routines) --------------

@njit(cache=True, nogil=True)
def _enc_stream_fast(exps, a, b, tcode, tlen, dst, p, cap, maxlen):
    """Codes tcode/tlen[exps[a:b]] as one byte-aligned MSB-first stream at
    dst[p:]; returns the end position (the caller has checked that it fits).
    Four codes (two if one may be longer than 14 bits) per branch-free
    8-byte store while at least 8 bytes of dst are left: bytes past the
    stream's end get overwritten by what follows or lie past the encoding."""
    acc = 0
    nb = 0
    i = a
    while maxlen <= 14 and i + 4 <= b and p + 8 <= cap:
        x = np.uint64(exps[i])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        x = np.uint64(exps[i + 1])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        x = np.uint64(exps[i + 2])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        x = np.uint64(exps[i + 3])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        t = np.uint64(acc) << np.uint64(64 - nb)    # nb <= 7 + 4 * 14
        u = np.uint64(p)
        dst[u] = t >> 56
        dst[u + _U1] = t >> 48
        dst[u + _U2] = t >> 40
        dst[u + _U3] = t >> 32
        dst[u + _U4] = t >> 24
        dst[u + _U5] = t >> 16
        dst[u + _U6] = t >> 8
        dst[u + _U7] = t
        p += nb >> 3
        nb &= 7
        acc &= (1 << nb) - 1
        i += 4
    while i + 2 <= b and p + 8 <= cap:
        x = np.uint64(exps[i])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        x = np.uint64(exps[i + 1])
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        # nb <= 7 + 2 * 23: the pending bits, MSB-aligned, as one big-endian
        # 8-byte store (unsigned indices: no wraparound code, so LLVM merges
        # the byte stores)
        t = np.uint64(acc) << np.uint64(64 - nb)
        u = np.uint64(p)
        dst[u] = t >> 56
        dst[u + _U1] = t >> 48
        dst[u + _U2] = t >> 40
        dst[u + _U3] = t >> 32
        dst[u + _U4] = t >> 24
        dst[u + _U5] = t >> 16
        dst[u + _U6] = t >> 8
        dst[u + _U7] = t
        p += nb >> 3
        nb &= 7
        acc &= (1 << nb) - 1
        i += 2
    for j in range(i, b):
        x = exps[j]
        acc = (acc << tlen[x]) | tcode[x]
        nb += tlen[x]
        while nb >= 8:
            nb -= 8
            dst[p] = (acc >> nb) & 0xFF
            p += 1
        acc &= (1 << nb) - 1
    if nb > 0:
        dst[p] = (acc << (8 - nb)) & 0xFF
        p += 1
    return p


@njit(cache=True, nogil=True, inline="always")
def _be64(enc, q):
    """Big-endian u64 at enc[q:q+8] (q unsigned, in bounds)."""
    return ((np.uint64(enc[q]) << _S56) | (np.uint64(enc[q + _U1]) << _S48)
            | (np.uint64(enc[q + _U2]) << _S40) | (np.uint64(enc[q + _U3]) << _S32)
            | (np.uint64(enc[q + _U4]) << _S24) | (np.uint64(enc[q + _U5]) << _S16)
            | (np.uint64(enc[q + _U6]) << _U8) | np.uint64(enc[q + _U7]))


@njit(cache=True, nogil=True, inline="always")
def _dec_one(enc, p, lut, tb, eb, ebs):
    """One exponent code at bit position p: (exponent, next position).
    Unchecked 8-byte window: see :func:`_dec_streams8`."""
    v = _be64(enc, np.uint64(p >> 3)) << np.uint64(p & 7)
    e = lut[v >> tb]
    ln = e & 15
    x = e >> 5
    if e & 16:
        x = np.int64((v << np.uint64(ln)) >> ebs)
        ln += eb
    return x, p + ln


@njit(cache=True, nogil=True)
def _dec_streams8(enc, starts, sb, lut, tbits, eb, exps):
    """Decode 8 full sub-blocks from sb on, interleaved (independent chains
    for the out-of-order core).  The caller has checked that every stream
    start plus the longest possible stream plus 8 bytes lies within enc, so
    the 8-byte big-endian windows need no bounds checks (unsigned indices
    also spare the wraparound code, so LLVM merges the byte loads).
    Returns False when a stream does not end in its last byte."""
    tb = np.uint64(64 - tbits)
    ebs = np.uint64(64 - eb)
    a = sb * SUB
    p0 = starts[sb + 0] * 8
    p1 = starts[sb + 1] * 8
    p2 = starts[sb + 2] * 8
    p3 = starts[sb + 3] * 8
    p4 = starts[sb + 4] * 8
    p5 = starts[sb + 5] * 8
    p6 = starts[sb + 6] * 8
    p7 = starts[sb + 7] * 8
    for i in range(a, a + SUB):
        exps[i], p0 = _dec_one(enc, p0, lut, tb, eb, ebs)
        exps[i + 1 * SUB], p1 = _dec_one(enc, p1, lut, tb, eb, ebs)
        exps[i + 2 * SUB], p2 = _dec_one(enc, p2, lut, tb, eb, ebs)
        exps[i + 3 * SUB], p3 = _dec_one(enc, p3, lut, tb, eb, ebs)
        exps[i + 4 * SUB], p4 = _dec_one(enc, p4, lut, tb, eb, ebs)
        exps[i + 5 * SUB], p5 = _dec_one(enc, p5, lut, tb, eb, ebs)
        exps[i + 6 * SUB], p6 = _dec_one(enc, p6, lut, tb, eb, ebs)
        exps[i + 7 * SUB], p7 = _dec_one(enc, p7, lut, tb, eb, ebs)
    return ((p0 + 7) >> 3 == starts[sb + 1]
            and (p1 + 7) >> 3 == starts[sb + 2]
            and (p2 + 7) >> 3 == starts[sb + 3]
            and (p3 + 7) >> 3 == starts[sb + 4]
            and (p4 + 7) >> 3 == starts[sb + 5]
            and (p5 + 7) >> 3 == starts[sb + 6]
            and (p6 + 7) >> 3 == starts[sb + 7]
            and (p7 + 7) >> 3 == starts[sb + 8])


@njit(cache=True, nogil=True)
def _dec_streams4(enc, starts, sb, lut, tbits, eb, exps):
    """As :func:`_dec_streams8`, for 4 sub-blocks."""
    tb = np.uint64(64 - tbits)
    ebs = np.uint64(64 - eb)
    a = sb * SUB
    p0 = starts[sb + 0] * 8
    p1 = starts[sb + 1] * 8
    p2 = starts[sb + 2] * 8
    p3 = starts[sb + 3] * 8
    for i in range(a, a + SUB):
        exps[i], p0 = _dec_one(enc, p0, lut, tb, eb, ebs)
        exps[i + 1 * SUB], p1 = _dec_one(enc, p1, lut, tb, eb, ebs)
        exps[i + 2 * SUB], p2 = _dec_one(enc, p2, lut, tb, eb, ebs)
        exps[i + 3 * SUB], p3 = _dec_one(enc, p3, lut, tb, eb, ebs)
    return ((p0 + 7) >> 3 == starts[sb + 1]
            and (p1 + 7) >> 3 == starts[sb + 2]
            and (p2 + 7) >> 3 == starts[sb + 3]
            and (p3 + 7) >> 3 == starts[sb + 4])


_params = njit(cache=True, nogil=True, inline="always")(_params_py)


@njit(cache=True, nogil=True)
def _split(src, itemsize, n, exps, hist):
    """Exponents into exps, their histogram into hist."""
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
        return
    if itemsize == 2:
        v2 = src.view(np.uint16)
        for i in range(n):
            exps[i] = (v2[i] >> 10) & 0x1F
    else:
        v8 = src.view(np.uint64)
        for i in range(n):
            exps[i] = (v8[i] >> np.uint64(52)) & np.uint64(0x7FF)
    nall = hist.size
    h4 = np.zeros(4 * nall, np.int32)
    n4 = n & ~3
    for i in range(0, n4, 4):
        h4[np.int64(exps[i])] += 1
        h4[nall + np.int64(exps[i + 1])] += 1
        h4[2 * nall + np.int64(exps[i + 2])] += 1
        h4[3 * nall + np.int64(exps[i + 3])] += 1
    for i in range(n4, n):
        h4[np.int64(exps[i])] += 1
    for x in range(nall):
        hist[x] = h4[x] + h4[nall + x] + h4[2 * nall + x] + h4[3 * nall + x]


@njit(cache=True, nogil=True)
def _planes(src, itemsize, n, dst, mo):
    """Sign+mantissa of every element into the mantissa section at dst[mo:]."""
    if itemsize == 4:
        v = src.view(np.uint32)
        p0 = dst[mo:mo + n]
        p1 = dst[mo + n:mo + 2 * n]
        p2 = dst[mo + 2 * n:mo + 3 * n]
        for i in range(n):
            x = v[i]
            p0[i] = x & 0xFF
            p1[i] = (x >> 8) & 0xFF
            p2[i] = ((x >> 16) & 0x7F) | ((x >> 24) & 0x80)
        return
    # float16 / float64: k whole byte planes, then r-bit top fields packed
    # LSB-first, eight elements (r bytes) at a time
    eb, mb, k, r = _params(itemsize)
    for j in range(k):
        pj = dst[mo + j * n:mo + (j + 1) * n]
        for i in range(n):
            pj[i] = src[i * itemsize + j]
    tb = mo + k * n
    nt = (n * r + 7) // 8
    ng = n // 8
    for g in range(ng):
        acc = 0
        for e in range(8):
            i = 8 * g + e
            if itemsize == 2:
                b1 = np.int64(src[2 * i + 1])
                t = (b1 & 3) | ((b1 >> 7) << 2)
            else:
                t = (np.int64(src[8 * i + 6]) & 15) | ((np.int64(src[8 * i + 7]) >> 7) << 4)
            acc |= t << (r * e)
        for j in range(r):
            dst[tb + g * r + j] = (acc >> (8 * j)) & 0xFF
    for g in range(ng, (n + 7) // 8):
        acc = 0
        for e in range(8):
            i = 8 * g + e
            if i < n:
                if itemsize == 2:
                    b1 = np.int64(src[2 * i + 1])
                    t = (b1 & 3) | ((b1 >> 7) << 2)
                else:
                    t = (np.int64(src[8 * i + 6]) & 15) | ((np.int64(src[8 * i + 7]) >> 7) << 4)
                acc |= t << (r * e)
        for j in range(min(r, nt - g * r)):
            dst[tb + g * r + j] = (acc >> (8 * j)) & 0xFF


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
    tb = mo + k * n
    nt = (n * r + 7) // 8
    rmask = (1 << r) - 1
    ng = n // 8
    # whole groups of eight elements: r bytes of top fields, whole words out
    if itemsize == 2:
        v2 = dst.view(np.uint16)
        p0 = enc[mo:mo + n]
        for g in range(ng):
            acc = (np.int64(enc[tb + 3 * g]) | (np.int64(enc[tb + 3 * g + 1]) << 8)
                   | (np.int64(enc[tb + 3 * g + 2]) << 16))
            for e in range(8):
                i = 8 * g + e
                t = (acc >> (3 * e)) & 7
                v2[i] = (np.int64(p0[i]) | ((t & 3) << 8) | (np.int64(exps[i]) << 10)
                         | ((t >> 2) << 15))
    else:
        v8 = dst.view(np.uint64)
        for g in range(ng):
            acc = np.uint64(0)
            for j in range(5):
                acc |= np.uint64(enc[tb + 5 * g + j]) << np.uint64(8 * j)
            for e in range(8):
                i = 8 * g + e
                t = (acc >> np.uint64(5 * e)) & np.uint64(31)
                w = ((t & np.uint64(15)) << _S48) | ((t >> _U4) << np.uint64(63))
                w |= np.uint64(exps[i]) << np.uint64(52)
                for j in range(6):
                    w |= np.uint64(enc[mo + j * n + i]) << np.uint64(8 * j)
                v8[i] = w
    # the last partial group byte by byte
    for j in range(k):
        pj = enc[mo + j * n:mo + (j + 1) * n]
        for i in range(8 * ng, n):
            dst[i * itemsize + j] = pj[i]
    for g in range(ng, (n + 7) // 8):
        acc = 0
        for j in range(min(r, nt - g * r)):
            acc |= np.int64(enc[tb + g * r + j]) << (8 * j)
        for e in range(min(8, n - 8 * g)):
            i = 8 * g + e
            t = (acc >> (r * e)) & rmask
            x = np.int64(exps[i])
            if itemsize == 2:
                dst[2 * i + 1] = (t & 3) | ((x & 0x1F) << 2) | ((t >> 2) << 7)
            else:
                dst[8 * i + 6] = (t & 15) | ((x & 15) << 4)
                dst[8 * i + 7] = ((t >> 4) << 7) | (x >> 4)


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
    if 3 + mant > cap:
        return -1
    exps = np.empty(n, np.uint16)
    # one allocation for the small tables (hist first: zeroed)
    work = np.empty(3 * nall + 7 * WMAX + 40, np.int64)
    hist = work[:nall]
    hist[:] = 0
    _split(src, itemsize, n, exps, hist)
    lo, w = _choose_window_c(hist, nall, eb)
    esc = n - hist[0]
    m = 1 if hist[0] > 0 else 0
    for s in range(w):
        esc -= hist[lo + s]
        if hist[lo + s] > 0:
            m += 1
    if esc == 0 and m == 1:
        e = lo if hist[0] == 0 else 0
        dst[0] = V_CONST
        dst[1] = e & 0xFF
        dst[2] = e >> 8
        _planes(src, itemsize, n, dst, 3)
        return 3 + mant
    if esc > 0:
        m += 1
    lim = ENC_LMAX
    while (1 << lim) < m:
        lim += 1
    q = nall
    lens = work[q:q + w + 2]
    q += w + 2
    keys = work[q:q + w + 2]
    q += w + 2
    wts = work[q:q + 2 * w + 4]
    q += 2 * w + 4
    par = work[q:q + 2 * w + 4]
    q += 2 * w + 4
    blc = work[q:q + LMAX + 1]
    q += LMAX + 1
    nxc = work[q:q + LMAX + 1]
    q += LMAX + 1
    codes = work[q:q + w + 2]
    q += w + 2
    _huff_lengths_c(hist, lo, w, esc, lens, keys, wts, par, blc, lim)
    _canon_c(lens, w + 2, codes, blc, nxc)
    # per-exponent code (escape + raw exponent for values outside the window)
    tcode = work[q:q + nall]
    tlen = work[q + nall:q + 2 * nall]
    el = lens[w]
    ec = codes[w]
    bits = 0
    maxlen = 0
    for x in range(nall):
        s = x - lo
        if s >= 0 and s < w and lens[s] > 0:
            tcode[x] = codes[s]
            tlen[x] = lens[s]
        elif x == 0:
            tcode[x] = codes[w + 1]
            tlen[x] = lens[w + 1]
        else:
            tcode[x] = (ec << eb) | x
            tlen[x] = el + eb
        bits += hist[x] * tlen[x]
        if hist[x] > 0 and tlen[x] > maxlen:
            maxlen = tlen[x]
    nsub = (n + SUB - 1) // SUB
    hdr = 5 + (w + 3) // 2 + 2 * (nsub - 1)
    if hdr + (bits + 7) // 8 + nsub + mant > cap:
        # the quick bound (a byte of padding per stream) says no: exact size
        tot = hdr + mant
        for sb in range(nsub):
            sbits = 0
            for i in range(sb * SUB, min(n, sb * SUB + SUB)):
                sbits += tlen[exps[i]]
            tot += (sbits + 7) // 8
        if tot > cap:
            return -1
    dst[0] = V_HUFF
    dst[1] = lo & 0xFF
    dst[2] = lo >> 8
    dst[3] = w & 0xFF
    dst[4] = w >> 8
    p = 5
    for s in range(0, w + 2, 2):
        hi_n = lens[s + 1] if s + 1 <= w + 1 else 0
        dst[p] = lens[s] | (hi_n << 4)
        p += 1
    pl = p
    p += 2 * (nsub - 1)
    for sb in range(nsub):
        a = sb * SUB
        b = min(n, a + SUB)
        q = _enc_stream_fast(exps, a, b, tcode, tlen, dst, p, cap, maxlen)
        if sb < nsub - 1:
            ln = q - p
            dst[pl + 2 * sb] = ln & 0xFF
            dst[pl + 2 * sb + 1] = ln >> 8
        p = q
    _planes(src, itemsize, n, dst, p)
    return p + mant


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
    exps = np.empty(n, np.uint16)
    var = enc[0]
    if var == V_CONST:
        if 3 + mant != nenc:
            return -3
        e = np.int32(enc[1]) | (np.int32(enc[2]) << 8)
        if e >= (1 << eb):
            return -4
        exps[:] = e
        _join(enc, 3, itemsize, n, exps, dst)
        return 0
    if var != V_HUFF:
        return -5
    nsub = (n + SUB - 1) // SUB
    work = np.empty(2 * WMAX + 2 * LMAX + 8 + nsub, np.int64)
    lens = work[:WMAX + 2]
    codes = work[WMAX + 2:2 * WMAX + 4]
    blc = work[2 * WMAX + 4:2 * WMAX + LMAX + 5]
    nxc = work[2 * WMAX + LMAX + 5:2 * WMAX + 2 * LMAX + 6]
    starts = work[2 * WMAX + 2 * LMAX + 6:]
    lo, w, tbits, p = _parse_header_c(enc, nenc, 1, eb, lens, codes, blc, nxc)
    if w < 0:
        return -6
    pl = p
    p += 2 * (nsub - 1)
    send = nenc - mant      # end of the streams
    if p > send:
        return -7
    starts[0] = p
    for sb in range(nsub - 1):
        ln = np.int64(enc[pl + 2 * sb]) | (np.int64(enc[pl + 2 * sb + 1]) << 8)
        starts[sb + 1] = starts[sb] + ln
    starts[nsub] = send
    if starts[nsub - 1] > send:
        return -8
    lut = np.empty(1 << tbits, np.uint16)
    _build_lut_c(lens, codes, w, lo, lut, tbits)
    # unchecked loads while the longest possible stream stays inside enc
    safe = nenc - ((SUB * (LMAX + eb) + 7) // 8 + 8)
    nfull = n // SUB
    sb = 0
    # (a constant eb per call site lets LLVM specialize the inlined loops)
    while sb + 8 <= nfull and starts[sb + 7] <= safe:
        if eb == 8:
            ok = _dec_streams8(enc, starts, sb, lut, tbits, 8, exps)
        elif eb == 5:
            ok = _dec_streams8(enc, starts, sb, lut, tbits, 5, exps)
        else:
            ok = _dec_streams8(enc, starts, sb, lut, tbits, 11, exps)
        if not ok:
            return -9
        sb += 8
    while sb + 4 <= nfull and starts[sb + 3] <= safe:
        if eb == 8:
            ok = _dec_streams4(enc, starts, sb, lut, tbits, 8, exps)
        elif eb == 5:
            ok = _dec_streams4(enc, starts, sb, lut, tbits, 5, exps)
        else:
            ok = _dec_streams4(enc, starts, sb, lut, tbits, 11, exps)
        if not ok:
            return -9
        sb += 4
    while sb < nsub:
        a = sb * SUB
        b = min(n, a + SUB)
        end = _dec_stream_c(enc, nenc, 8 * starts[sb], a, b, lut, tbits, eb, exps)
        if (end + 7) >> 3 != starts[sb + 1]:
            return -9
        sb += 1
    _join(enc, send, itemsize, n, exps, dst)
    return 0


@njit(cache=True, nogil=True)
def estimate_block(src, itemsize, isfloat):
    """Estimated encode_block size from the exponents of every 8th element
    (their empirical entropy, plus the tables); -1 where the mode does not
    apply."""
    if not isfloat or (itemsize != 2 and itemsize != 4 and itemsize != 8):
        return -1
    nbytes = src.size
    if nbytes == 0 or nbytes % itemsize != 0:
        return -1
    n = nbytes // itemsize
    eb, mb, k, r = _params(itemsize)
    mant = _mant_bytes(itemsize, n)
    hist = np.zeros(1 << eb, np.int32)
    step = 8 if n >= 64 else 1
    ns = 0
    if itemsize == 4:
        v = src.view(np.uint32)
        for i in range(0, n, step):
            hist[(v[i] >> 23) & 0xFF] += 1
            ns += 1
    elif itemsize == 2:
        v2 = src.view(np.uint16)
        for i in range(0, n, step):
            hist[(np.int64(v2[i]) >> 10) & 0x1F] += 1
            ns += 1
    else:
        v8 = src.view(np.uint64)
        for i in range(0, n, step):
            hist[np.int64(v8[i] >> np.uint64(52)) & 0x7FF] += 1
            ns += 1
    lo = -1
    hi = 0
    h = 0.0
    for x in range(1 << eb):
        c = hist[x]
        if c > 0:
            if lo < 0:
                lo = x
            hi = x
            h += c * np.log2(ns / c)
    if hi == lo:
        return 3 + mant
    nsub = (n + SUB - 1) // SUB
    w = hi - lo + 1
    if w > 64:
        w = 64                   # outliers are escaped rather than tabled
    bits = n * (h / ns + 0.03) + 4 * (w + 1) + 4 * nsub
    return 5 + 2 * (nsub - 1) + int(bits / 8) + mant


# ---------------------------------------------------------------------------
# CUDA: one thread block per codec block.  Exponent histogram in shared
# memory (atomics), exponents staged in shared memory (blocks up to STAGE
# elements), code construction by one thread with the core routines, one
# thread per sub-block stream (bit counts first, then the streams at their
# offsets), all threads on the mantissa planes and on element assembly
# (coalesced).  Elements are handled byte-wise, so no 64-bit shifts of
# float64 words are needed.  Not measured on a GPU (none was lent): the
# serial parts (code construction, one thread per 256-element stream) bound
# a codec block's latency, so throughput relies on many blocks in flight.
# ---------------------------------------------------------------------------

_KERNELS = {}
cuda = None   # numba.cuda, imported on first use


def _cuda_kernels():
    k = _KERNELS.get("k")
    if k is not None:
        return k
    global cuda
    from numba import cuda, int32, int64, uint16  # noqa: F811  (module global:
    # the simulator swaps the kernels' global ``cuda`` for its fake module)

    dev = _bind(cuda.jit(device=True))
    choose = dev["_choose_window"]
    huff = dev["_huff_lengths"]
    canon = dev["_canon"]
    parse = dev["_parse_header"]
    dstream = dev["_dec_stream"]
    params = cuda.jit(device=True)(_params_py)
    # shared-array shapes must be compile-time constants (closure values)
    W2, W4, L1, S1, LUT = WMAX + 2, 2 * WMAX + 4, LMAX + 1, MAXSUB + 1, 1 << LMAX

    @cuda.jit(device=True)
    def imin(a, b):
        # the builtin min(int, int) does not compile in numba 0.68's CUDA target
        return a if a < b else b

    @cuda.jit(device=True)
    def exponent(src, a, itemsize):
        if itemsize == 4:
            return ((np.int64(src[a + 3]) & 0x7F) << 1) | (np.int64(src[a + 2]) >> 7)
        if itemsize == 2:
            return (np.int64(src[a + 1]) >> 2) & 0x1F
        return ((np.int64(src[a + 7]) & 0x7F) << 4) | (np.int64(src[a + 6]) >> 4)

    @cuda.jit(device=True)
    def top_field(src, a, itemsize):
        """The r packed top bits (mantissa top, then sign) of an element."""
        if itemsize == 4:
            return (np.int64(src[a + 2]) & 0x7F) | (np.int64(src[a + 3]) & 0x80)
        if itemsize == 2:
            b1 = np.int64(src[a + 1])
            return (b1 & 3) | ((b1 >> 7) << 2)
        return (np.int64(src[a + 6]) & 0xF) | ((np.int64(src[a + 7]) >> 7) << 4)

    @cuda.jit(device=True)
    def code_of(x, lo, w, el, eb, lens, codes):
        s = x - lo
        if s >= 0 and s < w and lens[s] > 0:
            return codes[s], lens[s]
        if x == 0:
            return codes[w + 1], lens[w + 1]
        return (codes[w] << eb) | x, el + eb

    @cuda.jit(device=True)
    def assemble(enc, mo, k, r, rmask, n, i, x, itemsize, dst, d0):
        """Element i from exponent x and the mantissa section at enc[mo:]."""
        tb = mo + k * n
        if r == 8:
            t = np.int64(enc[tb + i])
        else:
            o = i * r
            t = np.int64(enc[tb + (o >> 3)])
            if (o & 7) + r > 8:
                t |= np.int64(enc[tb + (o >> 3) + 1]) << 8
            t = (t >> (o & 7)) & rmask
        da = d0 + i * itemsize
        for jj in range(k):
            dst[da + jj] = enc[mo + jj * n + i]
        if itemsize == 4:
            dst[da + 2] = (t & 0x7F) | ((x & 1) << 7)
            dst[da + 3] = (t & 0x80) | (x >> 1)
        elif itemsize == 2:
            dst[da + 1] = (t & 3) | ((x & 0x1F) << 2) | ((t >> 2) << 7)
        else:
            dst[da + 6] = (t & 0xF) | ((x & 0xF) << 4)
            dst[da + 7] = ((t >> 4) << 7) | (x >> 4)

    @cuda.jit
    def enc_kernel(src, nblocks, block_bytes, last_bytes, itemsize, scratch,
                   slot_bytes, sizes):
        bid = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        hist = cuda.shared.array(2048, int32)
        lens = cuda.shared.array(W2, int64)
        codes = cuda.shared.array(W2, int64)
        keys = cuda.shared.array(W2, int64)
        wts = cuda.shared.array(W4, int64)
        par = cuda.shared.array(W4, int64)
        blc = cuda.shared.array(L1, int64)
        nxc = cuda.shared.array(L1, int64)
        sst = cuda.shared.array(S1, int64)
        sx = cuda.shared.array(STAGE, uint16)
        sm = cuda.shared.array(8, int64)   # ok, variant, lo, w, el, hdr, total
        nbytes = block_bytes if bid < nblocks - 1 else last_bytes
        n = nbytes // itemsize
        eb, _mb, k, r = params(itemsize)
        mant = k * n + (n * r + 7) // 8
        nsub = (n + SUB - 1) // SUB
        base = bid * block_bytes
        out = bid * slot_bytes
        nall = 1 << eb
        for x in range(tid, nall, nt):
            hist[x] = 0
        cuda.syncthreads()
        staged = n <= STAGE
        for i in range(tid, n, nt):
            x = exponent(src, base + i * itemsize, itemsize)
            if staged:
                sx[i] = x
            cuda.atomic.add(hist, x, 1)
        cuda.syncthreads()
        if tid == 0:
            sm[0] = 1
            lo, w = choose(hist, nall, eb)
            esc = n - hist[0]
            m = 1 if hist[0] > 0 else 0
            for s in range(w):
                esc -= hist[lo + s]
                if hist[lo + s] > 0:
                    m += 1
            sm[2] = lo
            sm[3] = w
            if n == 0 or nsub > MAXSUB or 3 + mant > nbytes:
                sm[0] = 0
            elif esc == 0 and m == 1:
                e = lo if hist[0] == 0 else 0
                sm[1] = V_CONST
                sm[6] = 3 + mant
                scratch[out] = V_CONST
                scratch[out + 1] = e & 0xFF
                scratch[out + 2] = e >> 8
            else:
                sm[1] = V_HUFF
                if esc > 0:
                    m += 1
                lim = ENC_LMAX
                while (1 << lim) < m:
                    lim += 1
                huff(hist, lo, w, esc, lens, keys, wts, par, blc, lim)
                canon(lens, w + 2, codes, blc, nxc)
                sm[4] = lens[w]
                sm[5] = 5 + (w + 3) // 2 + 2 * (nsub - 1)
        cuda.syncthreads()
        if sm[0] == 0:
            if tid == 0:
                sizes[bid] = -1
            return
        lo = sm[2]
        w = sm[3]
        el = sm[4]
        if sm[1] == V_HUFF:
            for sb in range(tid, nsub, nt):
                bits = 0
                for i in range(sb * SUB, imin(n, sb * SUB + SUB)):
                    x = sx[i] if staged else exponent(src, base + i * itemsize, itemsize)
                    c, ln = code_of(x, lo, w, el, eb, lens, codes)
                    bits += ln
                sst[sb + 1] = (bits + 7) // 8
            cuda.syncthreads()
            if tid == 0:
                hdr = sm[5]
                sst[0] = hdr
                total = hdr + mant
                for sb in range(nsub):
                    total += sst[sb + 1]
                sm[6] = total
                if total > nbytes:
                    sm[0] = 0
                else:
                    for sb in range(nsub):
                        if sb < nsub - 1:
                            q = out + 5 + (w + 3) // 2 + 2 * sb
                            scratch[q] = sst[sb + 1] & 0xFF
                            scratch[q + 1] = sst[sb + 1] >> 8
                        sst[sb + 1] += sst[sb]
                    scratch[out] = V_HUFF
                    scratch[out + 1] = lo & 0xFF
                    scratch[out + 2] = lo >> 8
                    scratch[out + 3] = w & 0xFF
                    scratch[out + 4] = w >> 8
                    for s in range(0, w + 2, 2):
                        hi_n = lens[s + 1] if s + 1 <= w + 1 else 0
                        scratch[out + 5 + s // 2] = lens[s] | (hi_n << 4)
            cuda.syncthreads()
            if sm[0] == 0:
                if tid == 0:
                    sizes[bid] = -1
                return
            for sb in range(tid, nsub, nt):
                p = out + sst[sb]
                acc = 0
                nb = 0
                for i in range(sb * SUB, imin(n, sb * SUB + SUB)):
                    x = sx[i] if staged else exponent(src, base + i * itemsize, itemsize)
                    c, ln = code_of(x, lo, w, el, eb, lens, codes)
                    acc = (acc << ln) | c
                    nb += ln
                    while nb >= 8:
                        nb -= 8
                        scratch[p] = (acc >> nb) & 0xFF
                        p += 1
                    acc &= (1 << nb) - 1
                if nb > 0:
                    scratch[p] = (acc << (8 - nb)) & 0xFF
            mo = out + sst[nsub]
        else:
            mo = out + 3
        for i in range(tid, n, nt):
            a = base + i * itemsize
            for j in range(k):
                scratch[mo + j * n + i] = src[a + j]
            if r == 8:
                scratch[mo + k * n + i] = top_field(src, a, itemsize)
        if r != 8:
            tb = mo + k * n
            nt8 = (n * r + 7) // 8
            for g in range(tid, (n + 7) // 8, nt):
                acc = 0
                for e in range(8):
                    i = 8 * g + e
                    if i < n:
                        acc |= top_field(src, base + i * itemsize, itemsize) << (r * e)
                for j in range(r):
                    if g * r + j < nt8:
                        scratch[tb + g * r + j] = (acc >> (8 * j)) & 0xFF
        if tid == 0:
            sizes[bid] = sm[6]

    @cuda.jit
    def dec_kernel(payload, offsets, lengths, block_ids, nsel, block_bytes,
                   last_bytes, nblocks, itemsize, dst, err):
        j = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        lens = cuda.shared.array(W2, int64)
        codes = cuda.shared.array(W2, int64)
        blc = cuda.shared.array(L1, int64)
        nxc = cuda.shared.array(L1, int64)
        lut = cuda.shared.array(LUT, uint16)
        sst = cuda.shared.array(S1, int64)
        sx = cuda.shared.array(STAGE, uint16)
        sm = cuda.shared.array(8, int64)   # ok, variant, lo, w, tbits, send, exp
        if j >= nsel:
            return
        if tid == 0:
            sm[0] = 0
            blk = block_ids[j]
            off = offsets[j]
            nenc = lengths[j]
            if (blk >= 0 and blk < nblocks and off >= 0 and nenc >= 1
                    and off + nenc <= payload.size):
                nbytes = block_bytes if blk < nblocks - 1 else last_bytes
                if (nbytes > 0 and nbytes % itemsize == 0
                        and blk * block_bytes + nbytes <= dst.size):
                    sm[0] = 1
        cuda.syncthreads()
        if sm[0] == 0:
            if tid == 0:
                err[0] = 1
            return
        blk = block_ids[j]
        enc = payload[offsets[j]:offsets[j] + lengths[j]]
        nenc = enc.size
        nbytes = block_bytes if blk < nblocks - 1 else last_bytes
        n = nbytes // itemsize
        eb, _mb, k, r = params(itemsize)
        mant = k * n + (n * r + 7) // 8
        nsub = (n + SUB - 1) // SUB
        d0 = blk * block_bytes
        if tid == 0:
            var = enc[0]
            if var == V_CONST:
                e = 0
                if 3 + mant != nenc:
                    sm[0] = 0
                else:
                    e = np.int64(enc[1]) | (np.int64(enc[2]) << 8)
                    if e >= (1 << eb):
                        sm[0] = 0
                sm[1] = V_CONST
                sm[5] = 3
                sm[6] = e
            elif var == V_HUFF and nsub <= MAXSUB:
                sm[1] = V_HUFF
                lo, w, tbits, p = parse(enc, nenc, 1, eb, lens, codes, blc, nxc)
                sm[2] = lo
                sm[3] = w
                sm[4] = tbits
                send = nenc - mant
                pl = p
                p += 2 * (nsub - 1)
                if w < 0 or p > send:
                    sm[0] = 0
                else:
                    sst[0] = p
                    for sb in range(nsub - 1):
                        sst[sb + 1] = sst[sb] + (np.int64(enc[pl + 2 * sb])
                                                 | (np.int64(enc[pl + 2 * sb + 1]) << 8))
                    sst[nsub] = send
                    sm[5] = send
                    if sst[nsub - 1] > send:
                        sm[0] = 0
            else:
                sm[0] = 0
        cuda.syncthreads()
        if sm[0] == 0:
            if tid == 0:
                err[0] = 1
            return
        lo = sm[2]
        w = sm[3]
        tbits = sm[4]
        mo = sm[5]
        if sm[1] == V_HUFF:
            for s in range(tid, w + 2, nt):
                ln = lens[s]
                if ln > 0:
                    if s == w:
                        ent = ln | 16
                    elif s == w + 1:
                        ent = ln
                    else:
                        ent = ln | ((lo + s) << 5)
                    a = codes[s] << (tbits - ln)
                    for q in range(a, a + (1 << (tbits - ln))):
                        lut[q] = ent
            cuda.syncthreads()
        emask = (1 << eb) - 1
        rmask = (1 << r) - 1
        staged = n <= STAGE
        if staged and sm[1] == V_HUFF:
            # a thread per sub-block decodes its stream into shared memory
            for sb in range(tid, nsub, nt):
                end = dstream(enc, nenc, 8 * sst[sb], sb * SUB, imin(n, sb * SUB + SUB),
                              lut, tbits, eb, sx)
                if (end + 7) >> 3 != sst[sb + 1]:
                    err[0] = 1
            cuda.syncthreads()
            # then all threads write whole elements, neighbours side by side
            for i in range(tid, n, nt):
                assemble(enc, mo, k, r, rmask, n, i, sx[i], itemsize, dst, d0)
            return
        # constant exponent, or a block too big for the stage: each thread
        # writes the elements it decodes
        nsb = nsub if sm[1] == V_HUFF else n    # constant: a thread per element
        for sb in range(tid, nsb, nt):
            if sm[1] == V_HUFF:
                a = sb * SUB
                b = imin(n, a + SUB)
                pos = 8 * sst[sb]
            else:
                a = sb
                b = sb + 1
            for i in range(a, b):
                if sm[1] == V_HUFF:
                    q = pos >> 3
                    v = 0
                    for kk in range(4):
                        v <<= 8
                        if q + kk < nenc:
                            v |= np.int64(enc[q + kk])
                    v = (v << (pos & 7)) & 0xFFFFFFFF
                    ent = np.int64(lut[v >> (32 - tbits)])
                    ln = ent & 15
                    x = ent >> 5
                    if ent & 16:
                        x = (v >> (32 - ln - eb)) & emask
                        ln += eb
                    pos += ln
                else:
                    x = sm[6]
                assemble(enc, mo, k, r, rmask, n, i, x, itemsize, dst, d0)
            if sm[1] == V_HUFF and (pos + 7) >> 3 != sst[sb + 1]:
                err[0] = 1

    @cuda.jit
    def fill_kernel(sizes, nblocks, value):
        i = cuda.grid(1)
        if i < nblocks:
            sizes[i] = value

    from numba import config
    # the simulator runs every thread in Python: fewer of them go faster
    tpb = 32 if config.ENABLE_CUDASIM else TPB
    k = {"enc": enc_kernel, "dec": dec_kernel, "fill": fill_kernel, "tpb": tpb}
    _KERNELS["k"] = k
    return k


def encode_blocks_cuda(src, nblocks, block_bytes, last_bytes, itemsize, isfloat,
                       scratch, slot_bytes, sizes, stream=0):
    """Encode every block of ``src`` (device uint8) on the GPU into
    ``scratch[i*slot_bytes:]``; ``sizes[i]`` gets its size or -1."""
    if nblocks <= 0:
        return
    k = _cuda_kernels()
    if not isfloat or itemsize not in (2, 4, 8):
        k["fill"][(nblocks + 127) // 128, 128, stream](sizes, nblocks, -1)
        return
    k["enc"][nblocks, k["tpb"], stream](src, nblocks, block_bytes, last_bytes,
                                   itemsize, scratch, slot_bytes, sizes)


def decode_blocks_cuda(payload, offsets, lengths, block_ids, nsel, block_bytes,
                       last_bytes, nblocks, itemsize, isfloat, dst, err, stream=0):
    """Decode the ``nsel`` blocks listed in ``block_ids`` into ``dst``;
    ``err[0] = 1`` on any inconsistency."""
    if nsel <= 0:
        return
    k = _cuda_kernels()
    if not isfloat or itemsize not in (2, 4, 8):
        k["fill"][1, 1, stream](err, 1, 1)
        return
    k["dec"][nsel, k["tpb"], stream](payload, offsets, lengths, block_ids, nsel,
                                block_bytes, last_bytes, nblocks, itemsize, dst, err)
