"""Lossless block mode 3 (ZERO): zero-word elimination with position coding.

CPU round trips over word sizes, densities and value shapes; every variant of
the format is exercised; the decoder rejects truncated, extended and
corrupted encodings without touching memory outside its output; CUDA
encoder/decoder (simulator) write the CPU's bytes and decode them."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from erdmampi.kernels import _mode_zero as zero  # noqa: E402
from ptxcheck import assert_compiles  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _bench_data():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import codec_data
    finally:
        sys.path.pop(0)
    return codec_data


def enc(block: np.ndarray, itemsize: int, isfloat=False, room=None):
    b = block.view(np.uint8).ravel()
    dst = np.zeros(b.size if room is None else room, np.uint8)
    k = zero.encode_block(b, itemsize, isfloat, dst)
    return None if k < 0 else dst[:k].copy()


def dec(e: np.ndarray, nbytes: int, itemsize: int, isfloat=False):
    """Decode into the middle of a guarded buffer; the guards must survive."""
    guard = 64
    buf = np.full(nbytes + 2 * guard, 0xA5, np.uint8)
    out = buf[guard:guard + nbytes]
    r = zero.decode_block(np.ascontiguousarray(e), itemsize, isfloat, out)
    assert (buf[:guard] == 0xA5).all() and (buf[guard + nbytes:] == 0xA5).all()
    return r, out.copy()


def roundtrip(block: np.ndarray, itemsize: int, isfloat=False):
    b = block.view(np.uint8).ravel()
    e = enc(block, itemsize, isfloat)
    if e is None:
        return None
    assert e.size < b.size or e.size == b.size
    r, out = dec(e, b.size, itemsize, isfloat)
    assert r == 0
    np.testing.assert_array_equal(out, b)
    return e


RNG = np.random.default_rng(1234)


def _cases():
    r = np.random.default_rng(7)
    sp = np.zeros(1024, np.int64)
    idx = r.random(1024) < 0.05
    sp[idx] = r.geometric(0.01, idx.sum())
    yield "sparse-int64", sp, 8
    yield "zeros", np.zeros(1024, np.int64), 8
    yield "one-at-end", np.r_[np.zeros(1023, np.int64), [5]], 8
    yield "one-at-start", np.r_[[-1], np.zeros(1023, np.int64)], 8
    yield "narrow-int32", r.integers(0, 1000, 2048).astype(np.int32), 4
    yield "negative-int64", r.integers(-100, 100, 1024).astype(np.int64), 8
    yield "geometric-int16", r.geometric(0.05, 4096).astype(np.int16), 2
    yield "sparse-uint8", (r.random(8192) < 0.02).astype(np.uint8) * 7, 1
    yield "sparse-complex128", (np.where(r.random(512) < 0.1, 1.5 + 2j, 0)).astype(np.complex128), 16
    yield "half-dense", np.where(r.random(1024) < 0.5, r.integers(1, 50, 1024), 0).astype(np.int64), 8
    yield "mostly-dense", np.where(r.random(1024) < 0.9, r.integers(1, 50, 1024), 0).astype(np.int64), 8
    yield "0-or-1", (r.random(1024) < 0.6).astype(np.int64), 8
    big = np.zeros(1024, np.uint64)
    big[r.integers(0, 1024, 60)] = r.integers(1, 1 << 62, 60, dtype=np.uint64)
    big[3] = np.uint64(0xFFFFFFFFFFFFFFFF)
    yield "huge-values", big, 8
    out = r.geometric(0.1, 2048).astype(np.int32)
    out[::97] = 1 << 30       # outliers: Rice escapes
    yield "outliers-int32", out, 4
    yield "max-words", np.full(1024, -1, np.int64), 8
    yield "sparse-float64", np.where(r.random(1024) < 0.03, r.standard_normal(1024), 0.0), 8
    yield "odd-itemsize-3", np.where(r.random(900) < 0.1, 7, 0).astype(np.uint8), 3
    yield "int64-short-last", np.where(r.random(37) < 0.2, 3, 0).astype(np.int64), 8
    yield "long-zero-runs", np.r_[np.zeros(8000, np.uint8), np.arange(1, 193, dtype=np.uint8)], 1


@pytest.mark.parametrize("name,block,itemsize", list(_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_roundtrip(name, block, itemsize):
    e = roundtrip(block, itemsize, block.dtype.kind in "fc")
    nz = np.count_nonzero(block.view(np.uint8))
    if name in ("sparse-int64", "zeros", "one-at-end", "sparse-uint8", "narrow-int32",
                "negative-int64", "geometric-int16", "long-zero-runs", "outliers-int32"):
        assert e is not None, name
    if name == "zeros":
        assert e.size <= 4
    if e is not None and nz == 0:
        assert e.size <= 4


def test_variants_are_all_exercised():
    seen = set()
    for name, block, itemsize in _cases():
        e = roundtrip(block, itemsize)
        if e is not None:
            seen.add((e[0] & 3, (e[0] >> 2) & 1, (e[0] >> 3) & 1))
    pmodes = {s[0] for s in seen}
    vmodes = {s[1] for s in seen}
    assert pmodes == {0, 1, 2}, seen
    assert vmodes == {0, 1}, seen
    assert any(s[2] for s in seen), "zigzag never chosen"


def test_random_blocks_roundtrip():
    r = np.random.default_rng(99)
    for trial in range(300):
        itemsize = int(r.choice([1, 2, 4, 8, 16]))
        n = int(r.integers(1, 300))
        nbytes = n * itemsize
        density = float(r.choice([0.0, 0.01, 0.1, 0.5, 0.9, 1.0]))
        nbits = int(r.integers(1, 65))
        words = r.integers(0, 1 << 62, nbytes // min(itemsize, 8) + 1, dtype=np.uint64)
        words = words >> np.uint64(64 - nbits) if nbits < 64 else words * np.uint64(3)
        keep = r.random(words.size) < density
        words = np.where(keep, words, 0).astype(np.uint64)
        if r.random() < 0.3:
            words = (0 - words).astype(np.uint64)       # negatives
        b = words.view(np.uint8)[:nbytes].copy()
        roundtrip(b, itemsize)


def test_incompressible_returns_minus_one():
    b = RNG.integers(0, 256, 8192, dtype=np.uint8)
    assert enc(b, 8) is None
    # a dst one byte short of the encoding: -1, and nothing written past it
    sp = np.zeros(1024, np.int64)
    sp[::50] = 12345
    e = enc(sp, 8)
    buf = np.full(e.size + 16, 0x5A, np.uint8)
    assert zero.encode_block(sp.view(np.uint8), 8, False, buf[:e.size - 1]) == -1
    assert zero.encode_block(sp.view(np.uint8), 8, False, buf[:e.size]) == e.size
    assert (buf[e.size:] == 0x5A).all()


def test_sparse_benchmark_ratio():
    """The benchmark's sparse int64 data: the mode alone beats blosc2's 57.8."""
    cd = _bench_data()
    a = cd.make("sparse", 1 << 20)
    b = a.view(np.uint8)
    total = 0
    for i in range(0, b.size, 8192):
        e = enc(b[i:i + 8192], 8)
        assert e is not None
        total += e.size + 4                  # + the block-table word
    assert b.size / total > 70
    # the estimate is in the right range
    est = sum(zero.estimate_block(b[i:i + 8192], 8, False) for i in range(0, b.size, 8192))
    assert 0.5 < est / (total - 4 * (b.size // 8192)) < 2


def _valid_encodings():
    out = []
    for name, block, itemsize in _cases():
        e = enc(block, itemsize)
        if e is not None:
            out.append((name, e, block.view(np.uint8).size, itemsize))
    return out


def test_decode_rejects_truncation_and_extension():
    for name, e, nbytes, itemsize in _valid_encodings():
        for cut in range(e.size):
            r, _ = dec(e[:cut], nbytes, itemsize)
            assert r < 0, (name, cut)
        r, _ = dec(np.r_[e, np.uint8(0)], nbytes, itemsize)
        assert r < 0, name
        # wrong output size
        W = min(itemsize, 8) if itemsize in (1, 2, 4, 8, 16) else 1
        if nbytes > W:
            dec(e, nbytes - W, itemsize)     # may decode; must stay in bounds


def test_decode_rejects_reserved_and_bad_parameters():
    sp = np.zeros(1024, np.int64)
    sp[::40] = 77
    e = enc(sp, 8)
    for b0 in (int(e[0]) | 0x10, (int(e[0]) & 0xFC) | 3):
        bad = e.copy()
        bad[0] = b0
        assert dec(bad, 8192, 8)[0] < 0
    bad = e.copy()
    bad[1] = 70                          # value parameter > 64 bits
    assert dec(bad, 8192, 8)[0] < 0


def test_decode_fuzz_mutations_stay_in_bounds():
    r = np.random.default_rng(5)
    encs = _valid_encodings()
    for trial in range(3000):
        name, e, nbytes, itemsize = encs[trial % len(encs)]
        bad = e.copy()
        for _ in range(int(r.integers(1, 4))):
            bad[int(r.integers(0, bad.size))] ^= np.uint8(1 << int(r.integers(0, 8)))
        rr, out = dec(bad, nbytes, itemsize)
        if rr == 0:
            # a valid encoding of something: re-encoding it decodes to it too
            e2 = enc(out, itemsize)
            if e2 is not None:
                assert dec(e2, nbytes, itemsize)[1].tobytes() == out.tobytes()


def test_decode_random_bytes():
    r = np.random.default_rng(6)
    for trial in range(2000):
        k = int(r.integers(0, 64))
        junk = r.integers(0, 256, k, dtype=np.uint8)
        if k and r.random() < 0.5:
            junk[0] &= 0x0F                 # valid-looking mode byte
        if k > 1 and r.random() < 0.5:
            junk[1] %= 65
        itemsize = int(r.choice([1, 2, 4, 8, 16]))
        dec(junk, itemsize * int(r.integers(1, 64)), itemsize)


# -- CUDA (simulator in CI: small blocks, a few of them) ----------------------

def _gpu_encode(b, bb, itemsize):
    from numba import cuda
    n = b.size
    nb = (n + bb - 1) // bb
    last = n - (nb - 1) * bb
    slot = bb + 8
    scratch = cuda.to_device(np.zeros(nb * slot, np.uint8))
    sizes = cuda.to_device(np.zeros(nb, np.int32))
    zero.encode_blocks_cuda(cuda.to_device(b), nb, bb, last, itemsize, False,
                            scratch, slot, sizes, 0)
    sc = scratch.copy_to_host()
    sz = sizes.copy_to_host()
    return [None if sz[i] < 0 else sc[i * slot:i * slot + sz[i]].copy()
            for i in range(nb)], last


def _gpu_decode(encs, bb, last, itemsize, n):
    """Decode the non-None encodings into a guarded device buffer."""
    from numba import cuda
    ids = np.array([i for i, e in enumerate(encs) if e is not None], np.int32)
    lens = np.array([encs[i].size for i in ids], np.int64)
    offs = np.zeros(ids.size, np.int64)
    offs[1:] = np.cumsum(lens)[:-1]
    pay = np.concatenate([encs[i] for i in ids] + [np.zeros(0, np.uint8)])
    dst = cuda.to_device(np.full(n, 0xAB, np.uint8))
    err = cuda.to_device(np.zeros(1, np.int32))
    zero.decode_blocks_cuda(cuda.to_device(pay), cuda.to_device(offs),
                            cuda.to_device(lens), cuda.to_device(ids), ids.size,
                            bb, last, len(encs), itemsize, False, dst, err, 0)
    return dst.copy_to_host(), int(err.copy_to_host()[0]), ids


def _cpu_encode(b, bb, itemsize):
    out = []
    for i in range(0, b.size, bb):
        blk = b[i:i + bb]
        dst = np.zeros(blk.size, np.uint8)
        k = zero.encode_block(blk, itemsize, False, dst)
        out.append(None if k < 0 else dst[:k].copy())
    return out


def _cuda_cases():
    r = np.random.default_rng(11)
    sp = np.zeros(200, np.int64)              # 2 blocks of 1 KiB, last short
    idx = r.random(200) < 0.1
    sp[idx] = r.geometric(0.01, idx.sum())
    yield "sparse-gaps-rice", sp, 1024
    yield "negative-dense", r.integers(-100, 100, 70).astype(np.int64), 256
    o = r.geometric(0.2, 128).astype(np.int16)
    o[::17] = 30000                           # Rice escapes
    yield "outliers", o, 256
    yield "bitmap+sparse-u8", np.r_[np.where(r.random(256) < 0.5, r.integers(1, 50, 256), 0),
                                     (r.random(120) < 0.04) * 9].astype(np.uint8), 256
    yield "all-nonzero-int32", r.integers(1, 3000, 64).astype(np.int32), 128


@pytest.mark.parametrize("name,a,bb", list(_cuda_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_cuda_matches_cpu_both_directions(name, a, bb):
    b = a.view(np.uint8).ravel()
    its = a.itemsize
    genc, last = _gpu_encode(b, bb, its)
    cenc = _cpu_encode(b, bb, its)
    assert len(genc) == len(cenc) >= 2 or b.size <= bb
    for g, c in zip(genc, cenc):
        assert (g is None) == (c is None)
        if g is not None:
            assert g.tobytes() == c.tobytes()          # byte-identical
    # GPU decodes the CPU's blocks
    out, err, ids = _gpu_decode(cenc, bb, last, its, b.size)
    assert err == 0
    for i in ids:
        np.testing.assert_array_equal(out[i * bb:(i + 1) * bb], b[i * bb:(i + 1) * bb])
    # CPU decodes the GPU's blocks
    for i, e in enumerate(genc):
        if e is not None:
            r, o = dec(e, min(bb, b.size - i * bb), its)
            assert r == 0
            np.testing.assert_array_equal(o, b[i * bb:(i + 1) * bb])


def test_cuda_decode_rejects_corruption():
    r = np.random.default_rng(12)
    sp = np.zeros(64, np.int64)
    sp[r.random(64) < 0.15] = 300
    sp[5] = 7
    b = sp.view(np.uint8)
    (e,) = _cpu_encode(b, 512, 8)
    bad_cases = [e[:-1], np.r_[e, np.uint8(0)]]
    for _ in range(4):
        m = e.copy()
        m[int(r.integers(0, m.size))] ^= np.uint8(1 << int(r.integers(0, 8)))
        bad_cases.append(m)
    for m in bad_cases:
        out, err, _ = _gpu_decode([m], 512, 512, 8, 512)
        # the simulator raises on any out-of-bounds access; the CPU decoder
        # is the reference for what is valid
        ref, ref_out = dec(m, 512, 8)
        assert (err != 0) == (ref != 0), (m, err, ref)
        if err == 0:
            np.testing.assert_array_equal(out, ref_out)


@pytest.mark.slow
def test_cuda_kernels_compile_to_ptx():
    """The simulator does not type-check: compile the kernels for a real GPU
    (needs NVVM, not a GPU)."""
    assert_compiles(r"""
from erdmampi.kernels import _mode_zero as z
enc, dec = z._cuda_kernels()
for f, sig in [(enc, (A8, i, i, i, i, A8, i, A32, i, i)),
               (dec, (A8, A64, A64, A32, i, i, i, i, i, A8, A32))]:
    assert ".f64" not in ptx(f, sig), "accidental float math"
""")


def test_cuda_encoder_unstaged_path_matches():
    """Blocks too big for shared memory read global memory: same bytes."""
    from numba import cuda
    r = np.random.default_rng(13)
    a = np.where(r.random(48) < 0.2, r.integers(-500, 500, 48), 0).astype(np.int32)
    b = a.view(np.uint8)
    (c,) = _cpu_encode(b, 192, 4)
    enc_kernel, _ = zero._cuda_kernels()
    scratch = cuda.to_device(np.zeros(192, np.uint8))
    sizes = cuda.to_device(np.zeros(1, np.int32))
    stage_words = 192 // 4 + 2
    enc_kernel[1, zero.TPB, 0, 4 * stage_words](
        cuda.to_device(b), 1, 192, 192, 4, scratch, 192, sizes, 0, stage_words)
    k = int(sizes.copy_to_host()[0])
    assert c is not None and k == c.size
    assert scratch.copy_to_host()[:k].tobytes() == c.tobytes()


def test_strided_arrays_are_refused():
    sp = np.zeros(2048, np.int64)
    sp[::40] = 9
    b = sp.view(np.uint8)
    dst = np.zeros(b.size, np.uint8)
    assert zero.encode_block(b[::2], 8, False, dst[:b.size // 2]) == -1
    e = enc(sp[:1024], 8)
    big = np.zeros(2 * 8192, np.uint8)
    assert zero.decode_block(e, 8, False, big[::2]) < 0
    assert (big == 0).all()
