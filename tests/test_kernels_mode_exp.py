"""Lossless block mode 1 (EXP): entropy-coded float exponents, raw sign+mantissa.

CPU round trips for float16/32/64 (every float16 value, NaN payloads, Inf,
-0.0, denormals, odd block lengths), the ratio on the benchmark gradients,
both variants and the escape path; the decoder rejects truncated, extended
and corrupted encodings without touching memory outside its output; the CUDA
encoder/decoder (simulator) write the CPU's bytes and decode them."""

import sys
from pathlib import Path

import numpy as np
import pytest

from erdmampi.kernels import _mode_exp as mx  # noqa: E402
from ptxcheck import assert_compiles  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(4242)
FT = {2: np.float16, 4: np.float32, 8: np.float64}
UT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _gradients(nbytes):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import codec_data
    finally:
        sys.path.pop(0)
    return codec_data.make("gradients", nbytes)


def enc(block: np.ndarray, room=None):
    b = block.view(np.uint8).ravel()
    dst = np.zeros(b.size if room is None else room, np.uint8)
    k = mx.encode_block(b, block.itemsize, True, dst)
    return None if k < 0 else dst[:k].copy()


def dec(e: np.ndarray, nbytes: int, itemsize: int, isfloat=True):
    """Decode into the middle of a guarded buffer; the guards must survive."""
    guard = 64
    buf = np.full(nbytes + 2 * guard, 0xA5, np.uint8)
    out = buf[guard:guard + nbytes]
    r = mx.decode_block(np.ascontiguousarray(e), itemsize, isfloat, out)
    assert (buf[:guard] == 0xA5).all() and (buf[guard + nbytes:] == 0xA5).all()
    return r, out.copy()


def roundtrip(block: np.ndarray):
    b = block.view(np.uint8).ravel()
    e = enc(block)
    if e is None:
        return None
    assert e.size <= b.size
    r, out = dec(e, b.size, block.itemsize)
    assert r == 0
    np.testing.assert_array_equal(out, b)
    return e


def _specials(itemsize, n):
    """Random bit patterns weighted towards the awkward exponents."""
    ut = UT[itemsize]
    bits = 8 * itemsize
    eb = {2: 5, 4: 8, 8: 11}[itemsize]
    mb = bits - 1 - eb
    mant = RNG.integers(0, 1 << min(mb, 62), n, dtype=np.uint64)
    if mb > 62:
        mant |= RNG.integers(0, 1 << (mb - 62), n, dtype=np.uint64) << np.uint64(62)
    e = RNG.choice([0, 0, (1 << eb) - 1, (1 << eb) - 1, 1, (1 << eb) - 2,
                    (1 << (eb - 1)) - 1, (1 << (eb - 1))], n).astype(np.uint64)
    s = RNG.integers(0, 2, n, dtype=np.uint64)
    w = (s << np.uint64(bits - 1)) | (e << np.uint64(mb)) | mant
    fixed = [0, 1 << (bits - 1), (1 << (bits - 1)) - 1, ((1 << eb) - 1) << mb,
             (((1 << eb) - 1) << mb) | 1, 1, (1 << mb) - 1, (1 << bits) - 1]
    w[:8] = fixed[:n]
    return w.astype(ut).view(FT[itemsize])


# -- round trips ---------------------------------------------------------------

def test_gradients_ratio_and_roundtrip():
    g = _gradients(1 << 20)
    bpe = []
    for i in range(0, g.size, 2048 * 8):
        blk = g[i:i + 2048]
        e = roundtrip(blk)
        assert e is not None
        bpe.append(8 * e.size / blk.size)
    # exponent coded in ~3 bits/element (tables included) + 24 raw bits
    assert np.mean(bpe) < 27.5, np.mean(bpe)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_gaussian_blocks(itemsize):
    for scale in (1e-3, 1.0, 300.0):
        for nbytes in (8192, 4096, 16, 8 * 520, 8 * 1000 + 8):
            n = nbytes // itemsize
            x = (RNG.standard_normal(n) * scale).astype(FT[itemsize])
            e = roundtrip(x)
            if nbytes >= 4096:        # tiny blocks may not beat raw
                assert e is not None and e.size < x.nbytes, (itemsize, scale, nbytes)


def test_every_float16_value():
    allv = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for x in (allv, allv[RNG.permutation(allv.size)]):
        for i in range(0, x.size, 4096):
            blk = x[i:i + 4096]
            e = enc(blk)
            if e is not None:          # uniform exponents rarely beat raw
                r, out = dec(e, blk.nbytes, 2)
                assert r == 0
                np.testing.assert_array_equal(out, blk.view(np.uint8))
    # every value inside a compressible block (mostly one exponent)
    base = np.full(4096, 1.5, np.float16)
    for i in range(0, 1 << 16, 512):
        blk = base.copy()
        blk[::8] = allv[i:i + 512]
        assert roundtrip(blk) is not None


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_special_values_bit_exact(itemsize):
    """NaN payloads, +-Inf, -0.0, denormals and max/min exponents, both as
    the bulk of a block and as escaped outliers of a gradient-like block."""
    n = 8192 // itemsize
    sp = _specials(itemsize, n)
    e = enc(sp)
    if e is not None:
        r, out = dec(e, sp.nbytes, itemsize)
        assert r == 0
        np.testing.assert_array_equal(out, sp.view(np.uint8))
    x = (RNG.standard_normal(n) * 1e-2).astype(FT[itemsize])
    pos = RNG.choice(n, 12, replace=False)
    x[pos] = sp[:12]
    assert roundtrip(x) is not None


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_constant_exponent_variant(itemsize):
    n = 8192 // itemsize
    x = (1.0 + RNG.random(n) * 0.99).astype(FT[itemsize])   # all in [1, 2)
    e = roundtrip(x)
    assert e[0] == mx.V_CONST
    z = np.zeros(5, FT[itemsize])
    z[2] = -0.0
    e = roundtrip(z)
    assert e is not None and e[0] == mx.V_CONST


def test_escape_and_long_codes():
    # geometric counts: some codes hit the length limit; far outliers escape
    n = 2048
    counts = np.maximum(1, (n / 2.0 ** np.arange(1, 16))).astype(int)
    ex = np.repeat(np.arange(100, 115), counts)[:n]
    ex = np.concatenate([ex, np.full(n - ex.size, 100)])
    ex[:3] = [1, 250, 30]                         # escaped
    w = (ex.astype(np.uint32) << 23) | RNG.integers(0, 1 << 23, n, dtype=np.uint32)
    x = w.view(np.float32)
    e = roundtrip(x)
    assert e is not None
    lo, w_ = int(e[1]) | (int(e[2]) << 8), int(e[3]) | (int(e[4]) << 8)
    assert lo >= 100 and lo + w_ <= 115        # outliers left out of the table
    nib = e[5:5 + (w_ + 3) // 2]
    lens = np.stack([nib & 15, nib >> 4], 1).ravel()[:w_ + 2]
    assert lens[w_] > 0 and lens.max() <= mx.LMAX


@pytest.mark.parametrize("n", [1, 2, 3, 7, 255, 256, 257, 1023, 1025, 4099])
def test_odd_lengths(n):
    x = (RNG.standard_normal(n) * 0.01).astype(np.float32)
    e = enc(x, room=mx.max_block_bytes(x.nbytes, 4))
    assert e is not None
    r, out = dec(e, x.nbytes, 4)
    assert r == 0
    np.testing.assert_array_equal(out, x.view(np.uint8))


def test_not_applicable_and_no_room():
    x = RNG.standard_normal(2048).astype(np.float32)
    b = x.view(np.uint8)
    dst = np.zeros(b.size, np.uint8)
    assert mx.encode_block(b, 4, False, dst) == -1
    assert mx.encode_block(b, 1, True, dst) == -1
    assert mx.encode_block(b, 16, True, dst) == -1
    assert mx.encode_block(b[:6], 4, True, dst) == -1
    assert mx.estimate_block(b, 4, False) == -1
    # random bits do not beat raw: -1, and nothing written past dst
    rb = RNG.integers(0, 256, 8192, dtype=np.uint8)
    guard = np.full(8192 + 64, 0xA5, np.uint8)
    assert mx.encode_block(rb, 4, True, guard[:8192]) == -1
    assert (guard[8192:] == 0xA5).all()
    # a dst too small for the result
    full = mx.encode_block(b, 4, True, dst)
    assert 0 < full < b.size
    for room in (0, 10, full - 1):
        g = np.full(room + 64, 0xA5, np.uint8)
        assert mx.encode_block(b, 4, True, g[:room]) == -1
        assert (g[room:] == 0xA5).all()
    assert mx.encode_block(b, 4, True, np.zeros(full, np.uint8)) == full


def test_estimate_tracks_encoded_size():
    g = _gradients(1 << 20)
    for i in range(0, g.size, 2048 * 16):
        b = g[i:i + 2048].view(np.uint8)
        est = mx.estimate_block(b, 4, True)
        real = enc(g[i:i + 2048]).size
        assert abs(est - real) < 0.03 * real


def test_max_block_bytes_bounds_roomy_encodings():
    for itemsize in (2, 4, 8):
        n = 8192 // itemsize
        x = _specials(itemsize, n)
        room = mx.max_block_bytes(x.nbytes, itemsize)
        e = enc(x, room=room)
        assert e is not None and e.size <= room


# -- validation and fuzzing ------------------------------------------------------

def test_decode_rejects_truncation_and_extension():
    x = (RNG.standard_normal(2048) * 0.01).astype(np.float32)
    e = roundtrip(x)
    for cut in (0, 1, 3, 5, 40, e.size // 2, e.size - 1):
        assert dec(e[:cut], x.nbytes, 4)[0] < 0
    assert dec(np.concatenate([e, [0]]).astype(np.uint8), x.nbytes, 4)[0] < 0
    assert dec(e, x.nbytes - 4, 4)[0] < 0
    assert dec(e, x.nbytes + 4, 4)[0] < 0
    assert dec(e, x.nbytes, 4, isfloat=False)[0] < 0
    assert dec(e, x.nbytes, 8)[0] < 0


def test_decode_rejects_bad_tables():
    x = (RNG.standard_normal(2048) * 0.01).astype(np.float32)
    e = roundtrip(x)
    bad = e.copy()
    bad[0] = 7                                   # unknown variant
    assert dec(bad, x.nbytes, 4)[0] < 0
    bad = e.copy()
    bad[3:5] = [0, 1]                            # window past 2**8 exponents
    assert dec(bad, x.nbytes, 4)[0] < 0
    bad = e.copy()
    bad[5] = (bad[5] & 0xF0) | 13                # a length beyond LMAX
    assert dec(bad, x.nbytes, 4)[0] < 0
    bad = e.copy()
    bad[5] = bad[5] ^ 0x01                       # Kraft sum no longer 1
    assert dec(bad, x.nbytes, 4)[0] < 0
    w_ = int(e[3]) | (int(e[4]) << 8)
    pl = 5 + (w_ + 3) // 2
    bad = e.copy()
    bad[pl] ^= 1                                 # a stream one byte off
    assert dec(bad, x.nbytes, 4)[0] < 0
    bad = e.copy()
    bad[pl + 1] = 0xFF                           # a stream past the end
    assert dec(bad, x.nbytes, 4)[0] < 0
    c = roundtrip(np.full(100, 1.25, np.float32))
    bad = c.copy()
    bad[1:3] = [0, 1]                            # constant exponent 256
    assert dec(bad, 400, 4)[0] < 0


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_decode_fuzz_mutations_stay_in_bounds(itemsize):
    n = 8192 // itemsize
    x = (RNG.standard_normal(n) * 0.01).astype(FT[itemsize])
    x[:5] = _specials(itemsize, 5)
    e = roundtrip(x)
    for _ in range(300):
        m = e.copy()
        k = int(RNG.integers(1, 6))
        pos = RNG.integers(0, min(m.size, 80 if RNG.random() < 0.7 else m.size), k)
        m[pos] = RNG.integers(0, 256, k)
        if RNG.random() < 0.2:
            m = m[:int(RNG.integers(0, m.size))]
        dec(m, x.nbytes, itemsize)


def test_decode_random_bytes():
    for _ in range(300):
        nb = int(RNG.integers(0, 9000))
        junk = RNG.integers(0, 256, nb, dtype=np.uint8)
        if nb and RNG.random() < 0.5:
            junk[0] = RNG.integers(0, 2)
        itemsize = int(RNG.choice([2, 4, 8]))
        dec(junk, itemsize * int(RNG.integers(1, 1100)), itemsize)


# -- CUDA (simulator by default: keep it to a few small blocks) ------------------

def _cuda():
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("no CUDA device or simulator")
    return cuda


def _gpu_encode(raw, bb, itemsize, isfloat=True):
    cuda = _cuda()
    nblocks = -(-raw.size // bb)
    last = raw.size - (nblocks - 1) * bb
    scratch = cuda.to_device(np.zeros(nblocks * bb, np.uint8))
    sizes = cuda.to_device(np.zeros(nblocks, np.int32))
    mx.encode_blocks_cuda(cuda.to_device(raw), nblocks, bb, last, itemsize,
                          isfloat, scratch, bb, sizes, 0)
    return sizes.copy_to_host(), scratch.copy_to_host(), last


def _gpu_decode(encs, bb, last, nblocks, itemsize, ids=None):
    cuda = _cuda()
    ids = list(range(nblocks)) if ids is None else ids
    payload = np.concatenate([encs[i] for i in ids]).astype(np.uint8)
    lengths = np.array([encs[i].size for i in ids], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    nbytes = (nblocks - 1) * bb + last
    guard = 64
    out = cuda.to_device(np.full(nbytes + guard, 0xA5, np.uint8))
    err = cuda.to_device(np.zeros(1, np.int32))
    mx.decode_blocks_cuda(cuda.to_device(payload), cuda.to_device(offsets),
                          cuda.to_device(lengths), cuda.to_device(np.array(ids, np.int32)),
                          len(ids), bb, last, nblocks, itemsize, True,
                          out[:nbytes], err, 0)
    o = out.copy_to_host()
    assert (o[nbytes:] == 0xA5).all()
    return int(err.copy_to_host()[0]), o[:nbytes]


@pytest.mark.parametrize("itemsize,staged", [(4, True), (2, True), (8, True),
                                             (4, False)])
def test_cuda_encoding_matches_cpu_and_decodes_both_ways(itemsize, staged,
                                                         monkeypatch):
    if not staged:
        # blocks too big for the shared-memory exponent stage take the
        # direct path; the simulator reads the module constant at run time
        from numba import config
        if not config.ENABLE_CUDASIM:
            pytest.skip("STAGE is compiled into real kernels")
        monkeypatch.setattr(mx, "STAGE", 64)
    bb = 1024
    n = (3 * bb - 2 * itemsize * 4) // itemsize   # short last block
    x = (RNG.standard_normal(n) * 0.01).astype(FT[itemsize])
    x[:8] = _specials(itemsize, 8)
    if itemsize == 4:
        x[bb // 4:2 * bb // 4] = 1.5               # a constant-exponent block
    raw = x.view(np.uint8)
    sizes, scratch, last = _gpu_encode(raw, bb, itemsize)
    encs = []
    for i in range(sizes.size):
        nb = bb if i < sizes.size - 1 else last
        cpu = enc(x[i * bb // itemsize:i * bb // itemsize + nb // itemsize])
        assert cpu is not None and sizes[i] == cpu.size
        np.testing.assert_array_equal(scratch[i * bb:i * bb + sizes[i]], cpu)
        encs.append(cpu)
        r, out = dec(scratch[i * bb:i * bb + sizes[i]], nb, itemsize)
        assert r == 0 and (out == raw[i * bb:i * bb + nb]).all()
    if itemsize == 4:
        assert encs[1][0] == mx.V_CONST
    err, out = _gpu_decode(encs, bb, last, len(encs), itemsize)
    assert err == 0
    np.testing.assert_array_equal(out, raw)


def test_cuda_not_applicable_and_corrupt_input():
    bb = 2048
    x = (RNG.standard_normal(2 * bb // 4) * 0.01).astype(np.float32)
    raw = x.view(np.uint8)
    sizes, _, _ = _gpu_encode(raw, bb, 4, isfloat=False)
    assert (sizes == -1).all()
    rb = RNG.integers(0, 256, bb, dtype=np.uint8)      # random bits: no gain
    sizes, _, _ = _gpu_encode(rb, bb, 4)
    assert (sizes == -1).all()
    encs = [enc(x[:bb // 4]), enc(x[bb // 4:])]
    bad = encs[0].copy()
    bad[5] ^= 0x01                                      # broken code lengths
    err, _ = _gpu_decode([bad, encs[1]], bb, bb, 2, 4)
    assert err == 1
    w_ = int(encs[1][3]) | (int(encs[1][4]) << 8)
    bad = encs[1].copy()
    bad[5 + (w_ + 3) // 2] ^= 1                         # a stream one byte off
    err, _ = _gpu_decode([encs[0], bad], bb, bb, 2, 4)
    assert err == 1
    err, _ = _gpu_decode([encs[0], encs[1][:-1]], bb, bb, 2, 4)  # truncated
    assert err == 1
    c = enc(np.full(bb // 4, 1.5, np.float32))
    assert c[0] == mx.V_CONST
    err, _ = _gpu_decode([encs[0], c[:2]], bb, bb, 2, 4)        # cut header
    assert err == 1


@pytest.mark.parametrize("itemsize", [4, 8])
def test_zeros_and_wide_exponent_spread(itemsize):
    n = 8192 // itemsize
    x = (RNG.standard_normal(n) * 1e-3).astype(FT[itemsize])
    x[RNG.random(n) < 0.3] = 0            # ReLU-style exact zeros
    e = roundtrip(x)
    assert e is not None and e.size < 0.95 * x.nbytes
    lo = int(e[1]) | (int(e[2]) << 8)
    assert lo > 1                          # zeros have their own symbol
    # exponents spread over far more than WMAX values: the densest window
    # is tabled, the rest escaped
    eb = {4: 8, 8: 11}[itemsize]
    ex = np.concatenate([RNG.integers(1, (1 << eb) - 1, n // 8),
                         RNG.integers(500 if itemsize == 8 else 100,
                                      510 if itemsize == 8 else 110, n - n // 8)])
    mb = 8 * itemsize - 1 - eb
    w = (ex.astype(np.uint64) << np.uint64(mb)).astype(UT[itemsize])
    y = w.view(FT[itemsize])
    e = roundtrip(y)
    assert e is not None and e[0] == mx.V_HUFF
    assert int(e[3]) | (int(e[4]) << 8) <= mx.WMAX


@pytest.mark.slow
def test_cuda_kernels_compile_to_ptx():
    """The simulator does not type-check: compile the kernels for a real GPU
    (needs NVVM, not a GPU).  Caught builtin min() and computed shared-array
    shapes, which numba's CUDA target rejects."""
    assert_compiles(r"""
from erdmampi.kernels import _mode_exp as m
k = m._cuda_kernels()
ptx(k["enc"], (A8, i, i, i, i, A8, i, A32))
ptx(k["dec"], (A8, A64, A64, A32, i, i, i, i, i, A8, A32))
""")
